"""The second half of dynrepros_programs.py's table (registered in its PROGRAMS): set_ and shared
storage, buffers updated in forward, grads of outputs that are views of updated inputs, backward
through in-place ops on views, backward and hooks in the frame, out= variants, scalars and dtype
promotion, integer overflow, division by zero, empty tensors, dynamic=True with views and updates.
"""
# ruff: noqa
# mypy: ignore-errors
import torch
import torch.nn as nn

from dynrepros_programs import G, I, NL, R, RESETS, _n, case, cases, dyn, dyn2, g34, nl34, x34

# ------------------------------------------------ set_ and shared storage
@case(x34)
def ss_set_then_write(x):
    y = torch.empty(0)
    y.set_(x)
    y.add_(1)
    return x


@case(x34)
def ss_same_storage_check(x):
    v = x[1:]
    return v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), v


@case(x34)
def ss_storage_offset(x):
    return x[1:].storage_offset(), x[:, 1].storage_offset()


@case(lambda: (R(4, 4),))
def ss_as_strided_overlap_read(x):
    return x.as_strided((3, 3), (1, 1)).sum(0)


# ------------------------------------------------ buffers mutated in forward
class RunningMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.mean.mul_(0.9).add_(x.mean(0).detach(), alpha=0.1)
        self.count += 1
        return self.lin(x - self.mean)


class StepCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)
        return x * self.steps


def _mod_call(mod_fn, *xs):
    torch.manual_seed(1)
    m = mod_fn()
    return (m, *xs)


@case(lambda: _mod_call(RunningMean, R(5, 4)), calls=2, ind=True)
def bf_running_mean(m, x):
    return m(x)


@case(lambda: _mod_call(lambda: nn.BatchNorm1d(4), R(6, 4)), ind=True)
def bf_batchnorm_train(m, x):
    return m(x)


@case(lambda: _mod_call(lambda: nn.BatchNorm1d(4).eval(), R(6, 4)))
def bf_batchnorm_eval(m, x):
    return m(x)


@case(lambda: _mod_call(lambda: nn.BatchNorm2d(3), R(2, 3, 4, 4)))
def bf_batchnorm2d_train(m, x):
    return m(x).sum()


@case(lambda: _mod_call(StepCounter, R(3)))
def bf_step_counter(m, x):
    a = m(x)
    b = m(x)
    return a, b


@case(lambda: _mod_call(lambda: nn.BatchNorm1d(4, momentum=None), R(6, 4)))
def bf_batchnorm_cumulative(m, x):
    m(x)
    return m(x * 2)


# ------------------------------------------------ grads of outputs that are views of mutated inputs
@case(nl34, ind=True)
def gv_mutate_return_view(x, leaf):
    x.mul_(2)
    return x.view(-1)


@case(nl34)
def gv_mutate_view_return_base(x, leaf):
    x[0].mul_(3)
    return x


@case(lambda: (lambda a: (a * 1, a, G(4)))(G(3, 4)))
def gv_mutate_with_other_grad(x, leaf, w):
    x[1].mul_(w)
    return x.t()


@case(lambda: (lambda a: (a.view(-1)[2:], a))(G(3, 4) * 1))
def gv_view_input_mutated(v, base):
    v.add_(1)
    return base


@case(lambda: (lambda a: (a[:, 1], a))(G(3, 4) * 1))
def gv_column_view_input_mul(v, base):
    v.mul_(v)
    return v


# ------------------------------------------------ backward through in-place ops on views
@case(lambda: (G(3, 4), G(4)), ind=True)
def cs_row_assign(x, w):
    y = x * 1
    y[0] = w
    return y


@case(lambda: (G(3, 4), G(3)))
def cs_column_mul(x, w):
    y = x.clone()
    y[:, 1].mul_(w)
    return y


@case(g34)
def cs_t_sigmoid(x):
    y = x.clone()
    y.t().sigmoid_()
    return y


@case(g34)
def cs_flat_exp(x):
    y = x * 2
    y.view(-1).exp_()
    return y


@case(lambda: (G(3, 3), G(3)))
def cs_diag_add(x, w):
    y = x.clone()
    y.diagonal().add_(w)
    return y


@case(lambda: (G(3, 4), G(2, 4)))
def cs_slice_copy(x, w):
    y = x.clone()
    y[1:].copy_(w)
    return y * y


@case(g34)
def cs_two_inplace_views(x):
    y = x.clone()
    y[0].mul_(2)
    y[:, 0].add_(y[:, 1])
    return y


@case(g34)
def cs_relu_inplace_slice(x):
    y = x - 0.1
    y[:, :2].relu_()
    return y.sum(1)


@case(g34)
def cs_masked_intermediate(x):
    y = x.clone()
    y[y > 0] = 0
    return y


@case(lambda: (G(2, 3, 4),))
def cs_unbind_inplace_raises_on_backward(x):
    y = x.clone()
    a, b = y.unbind(0)
    a.mul_(2)  # raises: output of unbind may not be modified in place
    return y


# ------------------------------------------------ backward called in the frame, retain_graph, hooks
@case(g34)
def bw_backward_in_frame(x):
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    return x.grad * 1


@case(g34)
def bw_autograd_grad_create_graph(x):
    y = (x ** 3).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return g


@case(g34)
def bw_autograd_grad_retain(x):
    y = (x.sin()).sum()
    (g1,) = torch.autograd.grad(y, x, retain_graph=True)
    (g2,) = torch.autograd.grad(y, x)
    return g1 + g2


HOOKED: list = []
RESETS.append(HOOKED.clear)


@case(g34, ind=True)
def hk_intermediate_scale(x):
    y = x * 2
    y.register_hook(lambda g: g * 3)
    return y.sum()


@case(g34)
def hk_intermediate_record(x):
    y = x.exp()
    y.register_hook(lambda g: HOOKED.append(g.clone()))
    return (y * 2).sum()


@case(g34)
def hk_on_input(x):
    x.register_hook(lambda g: g + 1)
    return (x * x).sum()


@case(g34)
def hk_retain_grad(x):
    y = x * 3
    y.retain_grad()
    z = (y * y).sum()
    z.backward()
    return y.grad


# ------------------------------------------------ out= variants
@cases(lambda: (R(3, 4), R(3, 4), torch.empty(3, 4)), lambda: (R(3, 4), R(3, 4), torch.empty(0)), ind=(True, False))
def ov_add_out(x, y, out):
    torch.add(x, y, out=out)
    return out


@case(lambda: (R(3, 4), torch.empty(5)))
def ov_sum_out_resize(x, out):
    torch.sum(x, dim=0, out=out)
    return out.shape, out


@case(lambda: (R(3, 4), R(3, 4), torch.empty(4, 3).t()))
def ov_noncontiguous_out(x, y, out):
    torch.mul(x, y, out=out)
    return out.stride(), out


@case(lambda: (R(3, 4), torch.zeros(3, 4, dtype=torch.int64)))
def ov_out_dtype_raises(x, out):
    torch.exp(x, out=out)
    return out


@case(lambda: (R(3, 4), R(4, 5), torch.empty(3, 5)))
def ov_mm_out(a, b, out):
    return torch.mm(a, b, out=out)


@case(lambda: (R(3, 4),))
def ov_out_is_input(x):
    torch.mul(x, 2, out=x)
    return x


@case(lambda: (R(3, 4), torch.empty(3, 4, dtype=torch.float64)))
def ov_out_wider_dtype(x, out):
    torch.add(x, 1, out=out)
    return out


@case(lambda: (R(6), torch.empty(0), torch.empty(0, dtype=torch.long)))
def ov_max_out_pair(x, vals, idx):
    torch.max(x.view(2, 3), 1, out=(vals, idx))
    return vals, idx


@case(lambda: (R(3, 4), G(3, 4)))
def ov_out_requires_grad_raises(x, out):
    torch.add(x, 1, out=out)
    return out


# ------------------------------------------------ scalars, 0-dim, promotion, overflow, division
@cases(lambda: (I(3, 4),), lambda: (I(3, 4, dtype=torch.int32),), lambda: (I(3, 4, dtype=torch.uint8, lo=0, hi=255),),
       ind=(True, False, True))
def sc_int_times_float(x):
    return x * 2.5, x + 1, x / 2, x // 2


@case(lambda: (I(3, 4), torch.tensor(1.5)), ind=True)
def sc_int_tensor_float_0dim(x, s):
    return x * s, x + s


@case(lambda: (R(3, 4, dtype=torch.float16), torch.tensor(3.0, dtype=torch.float64)))
def sc_half_with_double_0dim(x, s):
    return (x * s).dtype, x * s


@case(lambda: (I(3, dtype=torch.int32), torch.tensor(2, dtype=torch.int64)))
def sc_int32_with_long_0dim(x, s):
    return x * s


@case(lambda: (I(3, 4), I(3, 4, dtype=torch.int8)))
def sc_mixed_int_widths(x, y):
    return x + y, y * y


@case(lambda: (torch.tensor([True, False, True]), torch.tensor([True, True, False])))
def sc_bool_ops(a, b):
    return a + b, a & b, a * 3, a.sum(), ~a


@case(lambda: (torch.tensor([True, False]),))
def sc_bool_sub_raises(a):
    return a - a


@case(lambda: (torch.tensor([100, 120, 127], dtype=torch.int8),), ind=True)
def sc_int8_overflow_wraps(x):
    return x + 10, x * 3


@case(lambda: (torch.tensor([0, 1, 5], dtype=torch.uint8),))
def sc_uint8_underflow(x):
    return x - 3, x - torch.tensor(3, dtype=torch.uint8)


@case(lambda: (torch.tensor([2 ** 31 - 1, 5], dtype=torch.int32),))
def sc_int32_overflow(x):
    return x + 1, x * 2


@case(lambda: (torch.tensor([2 ** 62, 3]),))
def sc_int64_overflow(x):
    return x * 4


@case(lambda: (R(3, 4), torch.zeros(3, 4)), ind=True)
def dz_float_div_zero(x, z):
    return x / z, z / z, x / 0.0, torch.zeros(()) / 0


@cases(lambda: (I(3, 4), torch.zeros(3, 4, dtype=torch.int64)), lambda: (I(3, 4, dtype=torch.int32), torch.zeros(3, 4, dtype=torch.int32)))
def dz_int_floor_div_zero_raises(x, z):
    return x // z


@case(lambda: (I(3, 4),))
def dz_int_remainder_zero_raises(x):
    return x % torch.zeros_like(x)


@case(lambda: (I(3, 4), torch.zeros(3, 4, dtype=torch.int64)))
def dz_int_true_div_zero(x, z):
    return x / z


@case(lambda: (I(3, 4),))
def dz_int_div_python_zero_raises(x):
    return torch.div(x, 0, rounding_mode="floor")


@case(lambda: (I(3, 4), I(3, 4, lo=1, hi=4) * torch.tensor([1, -1, 1, -1])))
def sc_int_neg_floor_trunc(x, y):
    return x // y, torch.div(x, y, rounding_mode="trunc"), x % y, torch.fmod(x, y), torch.remainder(x, y)


@case(lambda: (R(3, 4), torch.tensor(2.0)))
def sc_0dim_item(x, s):
    k = s.item()
    return x * k, x + s


@case(lambda: (torch.tensor(3.0), torch.tensor(4.0)))
def sc_0dim_both(a, b):
    return a * b, (a + b).dim(), torch.stack([a, b])


@case(lambda: (torch.tensor(3.0, requires_grad=True),))
def sc_0dim_grad(a):
    return a * a, a.exp()


@case(lambda: (torch.tensor(5),))
def sc_0dim_int_inplace_float_raises(a):
    a.add_(1.5)
    return a


@case(lambda: (torch.tensor(5.0),))
def sc_0dim_inplace(a):
    a.mul_(3).add_(1)
    return a, a.item()


@case(lambda: (R(3, 4),))
def sc_python_number_promotion(x):
    return x.long() * 2.0, (x > 0) * 1, (x > 0) + True, (x > 0).sum() / 2


@case(lambda: (I(4, lo=0, hi=3),))
def sc_int_pow(x):
    return x ** 2, 2 ** x, x.pow(0.5)


@case(lambda: (I(4, lo=-3, hi=3),))
def sc_int_neg_pow_raises(x):
    return x ** -1


@case(lambda: (R(3, 4),))
def sc_nan_inf_handling(x):
    y = x / (x - x)
    return torch.nan_to_num(y), y.isnan().sum(), torch.where(y.isinf(), 0.0, y).sum()


@case(lambda: (R(3, 4, dtype=torch.float64), R(3, 4)))
def sc_double_float_mix(x, y):
    return x + y, (x + y).dtype


@case(lambda: (I(3, 4), R(3, 4)))
def sc_int_inplace_with_float_raises(x, y):
    x.add_(y)
    return x


@case(lambda: (R(3, 4), I(3, 4)))
def sc_float_inplace_with_int(x, y):
    x.add_(y)
    x.mul_(y > 0)
    return x


# ------------------------------------------------ empty tensors
@case(lambda: (torch.empty(0),), ind=True)
def em_sum_mean(x):
    return x.sum(), x.mean(), x.prod()


@case(lambda: (torch.empty(0, 4),))
def em_max_raises(x):
    return x.max()


@case(lambda: (torch.empty(0, 4),))
def em_max_dim_raises(x):
    return x.max(0)


@case(lambda: (torch.empty(0, 4),))
def em_max_dim1(x):
    return x.max(1)


@case(x34)
def em_slice_past_end(x):
    return x[5:], x[:, 4:].sum(1), x[3:] + 1


@case(lambda: (R(3, 4), torch.empty(0, 4)))
def em_cat(x, e):
    return torch.cat([x, e]), torch.cat([e, e])


@case(lambda: (torch.empty(0, 3),))
def em_inplace(x):
    x.add_(1)
    return x, x.t()


@case(lambda: (torch.empty(2, 0, requires_grad=True),))
def em_grad(x):
    return x * 2, x.sum()


# ------------------------------------------------ dynamic=True with views and mutation
@case(dyn, calls=3, dynamic=True, ind=True)
def dy_view_mutate(x):
    x[0].add_(1)
    return x.view(-1)


@case(dyn2, calls=3, dynamic=True)
def dy_t_return(x):
    return x.t(), x.sum(0)


@case(dyn, calls=3, dynamic=True)
def dy_narrow_mutate(x):
    x.narrow(0, 1, x.shape[0] - 1).mul_(2)
    return x


@case(lambda: (lambda t: (t, t[1:]))(R(_n(), 4)), calls=3, dynamic=True)
def dy_aliased_pair(a, b):
    a.add_(1)
    return b * 2


@case(lambda: (R(_n(), 4), R(4)), calls=3, dynamic=True)
def dy_copy_broadcast(x, y):
    x.copy_(y)
    return x


@case(lambda: (NL(_n(), 4)), calls=3, dynamic=True)
def dy_nonleaf_mutate(x, leaf):
    x.mul_(x)
    return x[1:]


@case(dyn, calls=3, dynamic=True)
def dy_unsqueeze_(x):
    x.unsqueeze_(0)
    return x.shape, x


@case(dyn, calls=3, dynamic=True)
def dy_out_resize(x):
    out = torch.empty(0)
    torch.sum(x, 1, out=out)
    return out


@case(lambda: (R(_n(), 3).t(),), calls=3, dynamic=True)
def dy_noncontig_mutate(x):
    x.add_(1)
    return x.stride(), x


@case(lambda: (R(_n()),), calls=3, dynamic=True)
def dy_empty_slice(x):
    return x[x.shape[0]:], x[2:].sum()


@case(dyn, calls=3, dynamic=None)
def dy_auto_views(x):
    y = x.clone()
    y[:, 0] = 0
    return y, x[1:]


@case(lambda: (R(_n(), 4), G(4)), calls=3, dynamic=True)
def dy_cs_grad(x, w):
    y = x.clone()
    y[0] = w
    return y
