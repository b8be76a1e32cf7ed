import torch, math
import torch.nn.functional as F
from harness import case, fn_program, t, Program, kw

def I(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)

def Fl(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)

@case("numerics")
def nu_int_floordiv_mod_negative():
    def f(a, b):
        return a // b, a % b, torch.fmod(a, b), torch.remainder(a, b), torch.div(a, b, rounding_mode="floor")
    return fn_program(f, (I(-7, 7, -7, 7, 0), I(2, -2, -2, 2, 3)))

@case("numerics")
def nu_float_floordiv_mod_negative():
    def f(a, b):
        return a // b, a % b, torch.fmod(a, b), torch.remainder(a, -1.5)
    return fn_program(f, (Fl(-7.5, 7.5, -0.0, 3.0), Fl(2.0, -2.0, 2.0, 0.7)))

@case("numerics")
def nu_round_half_even_and_sign_zero():
    def f(x):
        return torch.round(x), torch.round(x, decimals=1), torch.sign(x), torch.signbit(x), x.trunc(), x.frac()
    return fn_program(f, (Fl(0.5, 1.5, 2.5, -0.5, -0.0, 0.25, 2.675),))

@case("numerics")
def nu_nan_propagation_min_max():
    def f(x, y):
        return torch.maximum(x, y), torch.fmax(x, y), x.max(), x.amin(), torch.clamp(x, 0, 1), x.argmax()
    return fn_program(f, (Fl(1.0, float("nan"), 3.0), Fl(2.0, 1.0, float("nan"))))

@case("numerics")
def nu_argmax_ties_first():
    def f(x):
        return x.argmax(), x.argmin(), x.argmax(dim=1), x.max(dim=1).indices
    return fn_program(f, (Fl(1, 3, 3, 0, 0, 3).view(2, 3),))

@case("numerics")
def nu_int_promotions():
    def f(a, b, c):
        return a + b, (a + b).dtype, a * c, b - 200, (a > b).sum().dtype, a.to(torch.float16) / 3
    return fn_program(f, (I(100, -100, 5, dtype=torch.int8), I(200, 100, 7, dtype=torch.uint8), Fl(0.5, 1.5, 2.5)))

@case("numerics")
def nu_bitwise_and_shifts():
    def f(a):
        return a << 2, a >> 1, a & 5, a | 8, a ^ 3, ~a, torch.bitwise_left_shift(a, 3)
    return fn_program(f, (I(-8, -1, 0, 5, 100, dtype=torch.int32),))

@case("numerics")
def nu_pow_edge_cases():
    def f(x, n):
        return x ** 2, x ** 0.5, x ** -1, torch.pow(n, 2), n ** 0, 2 ** n, x ** 3
    return fn_program(f, (Fl(-2.0, 0.0, 4.0, -0.5), I(-2, 0, 3, 5)))

@case("numerics")
def nu_int_pow_negative_exponent_raises():
    def f(n):
        return n ** -1
    return fn_program(f, (I(2, 3),))

@case("numerics")
def nu_log_sqrt_negative():
    def f(x):
        return x.log(), x.sqrt(), x.rsqrt(), torch.log1p(x), x.exp().log(), torch.xlogy(x, x)
    return fn_program(f, (Fl(-1.0, 0.0, 1e-30, 4.0),))

@case("numerics")
def nu_softmax_inf_rows():
    def f(x):
        return torch.softmax(x, -1), torch.log_softmax(x, -1), torch.logsumexp(x, -1)
    return fn_program(f, (Fl(float("-inf"), float("-inf"), 1.0, 2.0, 3.0, float("inf")).view(2, 3),))

@case("numerics")
def nu_mean_of_int_raises():
    def f(x):
        return x.mean()
    return fn_program(f, (I(1, 2, 3),))

@case("numerics")
def nu_sum_bool_and_int_dtypes():
    def f(b, i8):
        return b.sum(), b.sum().dtype, i8.sum().dtype, i8.cumsum(0), i8.prod(), b.any(), b.all(), i8.to(torch.bool).sum()
    return fn_program(f, (torch.tensor([True, False, True]), I(100, 100, 100, dtype=torch.int8)))

@case("numerics")
def nu_float16_bfloat16_arith():
    def f(h, b):
        return h * 3 + 1, (h * 1000).sum(), b.exp(), (b + h.to(torch.bfloat16)).dtype, h.float().half(), torch.softmax(h, 0)
    return fn_program(f, (Fl(0.1, 65000.0, -3.0, dtype=torch.float16), Fl(0.1, 2.0, -3.0, dtype=torch.bfloat16)))

@case("numerics")
def nu_int_overflow_wraps_in_arith():
    def f(a):
        return a * 1000000, a + 2147483647, (a * 300).to(torch.int8)
    return fn_program(f, (I(3000000, 5, -7, dtype=torch.int32),))

@case("numerics")
def nu_where_with_mixed_dtypes():
    def f(c, a, b):
        return torch.where(c, a, b), torch.where(c, a, 2.5), torch.where(c, 1, b).dtype
    return fn_program(f, (torch.tensor([True, False, True]), I(1, 2, 3), Fl(0.5, 0.25, 0.125)))

@case("numerics")
def nu_clamp_int_with_float_bounds():
    def f(a):
        return a.clamp(min=1.5), a.clamp(-2, 2), torch.clamp(a, max=0)
    return fn_program(f, (I(-5, 0, 1, 7),))

@case("numerics")
def nu_abs_neg_of_int_min():
    def f(a):
        return a.abs(), -a, a.neg().abs()
    return fn_program(f, (I(-128, 127, 0, dtype=torch.int8),))

@case("numerics")
def nu_trig_and_special():
    def f(x):
        return torch.atan2(x, x.flip(0)), torch.erf(x), torch.erfinv(x.clamp(-0.99, 0.99)), torch.sigmoid(x * 100), torch.tanh(x * 50), torch.special.expm1(x)
    return fn_program(f, (Fl(-2.0, -0.0, 0.0, 0.3, 5.0),))

@case("numerics")
def nu_large_reduction_precision():
    def f(x):
        return x.sum(), x.mean(), x.var(), x.std(unbiased=False), x.norm()
    return fn_program(f, (torch.full((100000,), 0.1),))

@case("numerics")
def nu_reduction_over_empty():
    def f(x):
        return x.sum(0), x.prod(0), x.amax(1) if x.shape[1] else x.sum(1)
    return fn_program(f, (torch.zeros(0, 3),))

@case("numerics")
def nu_cumsum_cumprod_and_cummax():
    def f(x):
        return x.cumsum(0), x.cumprod(0), torch.cummax(x, 0).values, torch.logcumsumexp(x, 0)
    return fn_program(f, (Fl(1.0, -2.0, 3.0, float("nan"), 1.0),))

@case("numerics")
def nu_int_division_true_div_dtype():
    def f(a, b):
        return a / b, torch.true_divide(a, 2), (a / b).dtype
    return fn_program(f, (I(7, -7, 1), I(2, 2, 3)))

@case("numerics")
def nu_comparisons_of_nan_and_int_float():
    def f(x, n):
        return x == x, x != x, x < n, n == 2.0, torch.isclose(x, x, equal_nan=True), torch.eq(n, 2)
    return fn_program(f, (Fl(float("nan"), 2.0, 3.0), I(1, 2, 5)))

@case("numerics")
def nu_mixed_scalar_tensor_0dim_promotion():
    def f(a, s):
        return a * s, (a * s).dtype, a + torch.tensor(1.5), (a + torch.tensor(1.5)).dtype, a.float() * torch.tensor(2, dtype=torch.float64)
    return fn_program(f, (I(1, 2, 3, dtype=torch.int32), torch.tensor(3, dtype=torch.int64)))

@case("numerics")
def nu_gelu_silu_mish_hardswish():
    def f(x):
        return F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.mish(x), F.hardswish(x), F.elu(x), F.leaky_relu(x, 0.2), F.softplus(x, beta=2, threshold=5)
    return fn_program(f, (torch.linspace(-6, 6, 13),))

@case("numerics")
def nu_loss_functions():
    def f(x, y, tgt):
        return F.mse_loss(x, y), F.l1_loss(x, y, reduction="sum"), F.smooth_l1_loss(x, y), F.cross_entropy(x.view(2, 3), tgt), F.binary_cross_entropy_with_logits(x, y.sigmoid())
    return fn_program(f, (t(6), t(6), torch.tensor([0, 2])))

@case("numerics")
def nu_norms():
    def f(x):
        return F.normalize(x, dim=-1), F.layer_norm(x, (4,)), F.group_norm(x.view(1, 4, 2), 2), F.rms_norm(x, (4,)) if hasattr(F, "rms_norm") else x
    return fn_program(f, (t(2, 4),))

@case("numerics")
def nu_indexing_gather_scatter():
    def f(x, idx):
        y = torch.zeros(3, 4)
        y.scatter_add_(1, idx, x)
        return x.gather(1, idx), y, x.index_select(1, idx[0]), torch.take(x, idx.flatten())
    return fn_program(f, (t(3, 4), torch.tensor([[0, 1, 1, 3], [2, 2, 0, 0], [3, 3, 3, 3]])))

@case("numerics")
def nu_index_put_duplicate_indices_accumulate():
    def f(x, idx):
        y = torch.zeros(5)
        y[idx] += x
        z = torch.zeros(5).index_add(0, idx, x)
        return y, z
    return fn_program(f, (Fl(1.0, 2.0, 3.0), torch.tensor([1, 1, 4])))

@case("numerics")
def nu_negative_index_and_out_of_bounds():
    def f(x, idx):
        return x[idx]
    return fn_program(f, (t(4), torch.tensor([-1, 0, -4])), (t(4), torch.tensor([5])))

@case("numerics")
def nu_matmul_shapes_and_dtypes():
    def f(a, b, v):
        return a @ b, a @ v, v @ v, torch.bmm(a.unsqueeze(0), b.unsqueeze(0)), torch.einsum("ij,jk->ik", a, b), torch.outer(v, v)
    return fn_program(f, (t(3, 4), t(4, 2), t(4)[:4].view(4) if False else t(4)))

@case("numerics")
def nu_int_matmul():
    def f(a, b):
        return a @ b
    return fn_program(f, (I(1, 2, 3, 4).view(2, 2), I(5, 6, 7, 8).view(2, 2)))

@case("numerics")
def nu_conv_with_groups_and_stride():
    w = torch.randn(4, 2, 3, 3)
    def f(x):
        return F.conv2d(x, w, stride=2, padding=1, groups=2), F.avg_pool2d(x, 2, ceil_mode=True), F.adaptive_avg_pool2d(x, (2, 3))
    return fn_program(f, (t(1, 4, 5, 5),))

@case("numerics")
def nu_interpolate_and_pad():
    def f(x):
        return F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(3, 5), mode="bilinear", align_corners=False), F.pad(x, (1, 2, 0, 1), mode="reflect"), F.pad(x, (1, 1), value=-1.0)
    return fn_program(f, (t(1, 1, 3, 4),))

@case("numerics")
def nu_embedding_bag_and_one_hot():
    def f(idx):
        return F.one_hot(idx, 5), F.embedding(idx, torch.arange(15.0).view(5, 3)), idx.bincount(minlength=6)
    return fn_program(f, (torch.tensor([0, 3, 3, 1]),))

@case("numerics")
def nu_sort_descending_with_nan_and_topk():
    def f(x):
        return torch.sort(x, descending=True), torch.topk(x, 2, largest=False), torch.kthvalue(x, 2), x.median(), x.nanmedian()
    return fn_program(f, (Fl(3.0, float("nan"), 1.0, 2.0, 1.0),))

@case("numerics")
def nu_tril_triu_diag_and_cat_mixed():
    def f(x, i):
        return x.tril(-1), x.triu(1), torch.diag(x), torch.cat([x, i.float()]), torch.cat([i, i]).dtype, torch.stack([x[0], i[0].float()])
    return fn_program(f, (t(3, 3), I(1, 2, 3, 4, 5, 6, 7, 8, 9).view(3, 3)))

@case("numerics")
def nu_expand_and_inplace_broadcast_error():
    def f(x):
        y = torch.zeros(3)
        y += x
        return y
    return fn_program(f, (t(3),), (t(2, 3),))

@case("numerics")
def nu_type_conversions_float_to_int_trunc():
    def f(x):
        return x.long(), x.to(torch.int8), x.to(torch.uint8), x.round().int(), x.bool()
    return fn_program(f, (Fl(-1.7, -0.5, 0.5, 1.9, 255.0, 300.0),))

@case("numerics")
def nu_ops_on_noncontiguous_inputs():
    def f(x):
        return x * 2 + 1, x.sum(0), x.softmax(1), x.exp().cumsum(1)
    base = t(4, 6)
    return fn_program(f, (base.t(),), (base[:, ::2],), (base[1:, 1:],))

@case("numerics")
def nu_inplace_on_output_of_reduction_chain():
    def f(x):
        m = x.mean(1, keepdim=True)
        x.sub_(m)
        x.div_(x.std(1, keepdim=True) + 1e-5)
        return x
    return fn_program(f, (t(3, 5),))

@case("numerics")
def nu_dropout_eval_and_p_zero_one():
    def f(x):
        return F.dropout(x, 0.5, training=False), F.dropout(x, 0.0, training=True), F.dropout(x, 1.0, training=True)
    return fn_program(f, (t(5),))
