import torch
import torch.nn.functional as F
from harness import case, fn_program, t, Program, kw
from pk import drv

def T(*s, **k):
    return t(*s, **k)
W = lambda *s: T(*s, requires_grad=True)

def gdrive(fn, mk, post=None):
    """Build inputs with mk() (returns (leaves, args)), call, backward, report grads and outputs."""
    def drive(sub):
        leaves, args = mk()
        out = sub(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        snap = [(o.detach().clone(), o.requires_grad, o.stride()) if isinstance(o, torch.Tensor) else o for o in outs]
        loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in outs
                   if isinstance(o, torch.Tensor) and o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
        return snap, [None if l.grad is None else l.grad.clone() for l in leaves], [a.detach().clone() for a in args if isinstance(a, torch.Tensor)]
    return Program(fn, drive=drive)

def mk_view_of_nonleaf():
    x = W(6)
    return [x], (x * 1)[1:4]

@case("tx")
def tx_mutate_view_input_nonleaf_grad():
    def f(a):
        a.mul_(2)
        return a + 1
    return gdrive(f, lambda: (lambda x: ([x], ((x * 1)[1:4],)))(W(6)))

@case("tx")
def tx_mutate_view_input_then_base_grad():
    def drive(sub):
        x = W(6)
        b = x * 1
        sub(b[1:4])
        (b * torch.arange(6.)).sum().backward()
        return b, x.grad
    def f(a):
        a.mul_(3)
    return Program(f, drive=drive)

@case("tx")
def tx_mutate_nonleaf_input_grad_before_after():
    def f(a):
        y = a * 2
        a.mul_(3)
        return y + a
    return gdrive(f, lambda: (lambda x: ([x], (x * 1,)))(W(3)))

@case("tx")
def tx_mutate_leaf_no_grad_inside():
    def f(a):
        with torch.no_grad():
            a.add_(1)
        return a * a
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_mutate_nonleaf_with_grad_value():
    def f(a, w):
        a.mul_(w)
        return a
    return gdrive(f, lambda: (lambda x, w: ([x, w], (x * 1, w)))(W(3), W(3)))

@case("tx")
def tx_mutate_nonleaf_view_with_grad_value():
    def f(a, w):
        a[0].mul_(w)
        return a.sum(1)
    return gdrive(f, lambda: (lambda x, w: ([x, w], (x * 1, w)))(W(2, 3), W(3)))

@case("tx")
def tx_copy_grad_into_nograd_input():
    def drive(sub):
        buf = torch.zeros(4)
        w = W(4)
        o = sub(buf, w)
        o.sum().backward()
        return buf, buf.requires_grad, w.grad, o
    def f(buf, w):
        buf.copy_(w * 2)
        return buf * w
    return Program(f, drive=drive)

@case("tx")
def tx_copy_grad_into_nograd_input_slice():
    def drive(sub):
        buf = torch.zeros(6)
        w = W(3)
        o = sub(buf, w)
        o.sum().backward()
        return buf, buf.requires_grad, w.grad, o, buf.grad_fn is not None
    def f(buf, w):
        buf[2:5].copy_(w.exp())
        return buf * 2
    return Program(f, drive=drive)

@case("tx")
def tx_output_view_of_requires_grad_input_then_backward():
    def f(a):
        return a.t(), a[0], a.sum()
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(2, 3)))

@case("tx")
def tx_output_view_of_nonleaf_input_grad():
    def f(a):
        return a.view(-1), a.t() * 2
    return gdrive(f, lambda: (lambda x: ([x], (x.sin(),)))(W(2, 3)))

@case("tx")
def tx_input_base_and_view_both_grad():
    def f(a, v):
        return a * 2 + v.sum()
    return gdrive(f, lambda: (lambda b: ([b], (b, b[1])))(W(3, 3)))

@case("tx")
def tx_input_base_and_view_mut_base():
    def f(a, v):
        a.add_(1)
        return v * 2
    return gdrive(f, lambda: (lambda x: (lambda b: ([x], (b, b[1])))(x * 1))(W(3, 3)))

@case("tx")
def tx_t_inplace_input():
    def f(a):
        a.t_()
        return a * 1
    return drv(f, T(2, 3))

@case("tx")
def tx_as_strided_inplace_input():
    def f(a):
        a.as_strided_((2, 2), (1, 2), 1)
        return a + 0
    return drv(f, T(6))

@case("tx")
def tx_resize_then_write():
    def f(a):
        a.resize_(6)
        a.fill_(2.0)
        return a
    return drv(f, T(2, 3))

@case("tx")
def tx_resize_grow_local():
    def f(a):
        b = a.clone()
        b.resize_(2, 2)
        return b[:, 0]
    return drv(f, T(4))

@case("tx")
def tx_set_source_storage():
    def f(a, b):
        a.set_(b.untyped_storage(), 1, (2,), (1,))
        return a * 2
    return drv(f, T(3), T(5))

@case("tx")
def tx_matmul_outputs_strides():
    def f(a, b):
        return a.t() @ b, a @ b.t().t(), torch.mm(a.t(), b).t()
    return drv(f, T(3, 2), T(3, 4))

@case("tx")
def tx_bmm_transposed_inputs():
    return drv(lambda a, b: torch.bmm(a.transpose(1, 2), b), T(2, 3, 4), T(2, 3, 5))

@case("tx")
def tx_permute_elementwise_chain_strides():
    return drv(lambda a: (a.permute(1, 0, 2) * 2).exp() + 1, T(2, 3, 4))

@case("tx")
def tx_permuted_plus_contig_strides():
    return drv(lambda a, b: a.permute(1, 0) + b, T(3, 4), T(4, 3))

@case("tx")
def tx_channels_last_conv_bias_relu_strides():
    w = T(5, 3, 3, 3)
    def f(x, w):
        y = F.conv2d(x, w, padding=1)
        return y.relu() + 1, y.sum(1)
    return drv(f, T(2, 3, 5, 5).to(memory_format=torch.channels_last), w)

@case("tx")
def tx_cat_noncontig_strides():
    return drv(lambda a, b: torch.cat([a.t(), b.t()], 1), T(3, 2), T(4, 2))

@case("tx")
def tx_stack_transposed():
    return drv(lambda a, b: torch.stack([a.t(), b.t()]), T(3, 2), T(3, 2))

@case("tx")
def tx_sum_keepdim_permuted():
    return drv(lambda a: a.permute(2, 0, 1).sum(1, keepdim=True), T(2, 3, 4))

@case("tx")
def tx_softmax_transposed_strides():
    return drv(lambda a: a.t().softmax(-1), T(4, 3))

@case("tx")
def tx_expand_then_contiguous():
    return drv(lambda a: a.expand(2, 3, 4).contiguous() + 0, T(3, 1))

@case("tx")
def tx_where_broadcast_strides():
    return drv(lambda c, a: torch.where(c, a.t(), 0.0), torch.tensor([[True, False, True]]), T(3, 2))

@case("tx")
def tx_to_dtype_preserves_strides():
    return drv(lambda a: (a.t().to(torch.float64), a.t().half(), a.t().to(torch.float32)), T(2, 3))

@case("tx")
def tx_to_same_dtype_aliases():
    return drv(lambda a: (a.to(torch.float32), a.float(), a.contiguous(), a.type_as(a)), T(3))

@case("tx")
def tx_to_copy_true():
    return drv(lambda a: a.to(torch.float32, copy=True), T(3))

@case("tx")
def tx_reshape_view_or_copy():
    return drv(lambda a: (a.reshape(2, 3), a.t().reshape(3, 2), a.t().flatten()), T(2, 3))

@case("tx")
def tx_flatten_contig_aliases():
    return drv(lambda a: (a.flatten(), a.view(-1), a.ravel(), a[:, :2].ravel()), T(2, 3))

@case("tx")
def tx_squeeze_unsqueeze_alias():
    return drv(lambda a: (a.squeeze(), a.unsqueeze(-1), a[None]), T(1, 3))

@case("tx")
def tx_detach_alias_output():
    return drv(lambda a: (a.detach(), a.detach()[1:]), W(3))

@case("tx")
def tx_alias_and_mutate_output_version():
    def drive(sub):
        x = T(4)
        y = sub(x)
        v = y._version
        x.add_(1)
        return y, y._version > v
    return Program(lambda x: x[::2], drive=drive)

@case("tx")
def tx_nograd_output_of_grad_input_alias():
    def f(a):
        with torch.no_grad():
            v = a[1:]
        return v, v.requires_grad
    return drv(f, W(4))

@case("tx")
def tx_leaf_view_output_grad():
    def drive(sub):
        x = W(2, 3)
        a, b = sub(x)
        (a.sum() * 2 + b.sum() * 3).backward()
        return x.grad, a._is_view(), b._is_view()
    return Program(lambda x: (x[0], x.t()), drive=drive)

@case("tx")
def tx_unsafe_view_output_backward_inplace():
    def drive(sub):
        x = W(2, 3)
        y = sub(x)
        y.mul_(2)
        y.sum().backward()
        return x.grad, y
    return Program(lambda x: (x * 1).view(6), drive=drive)

@case("tx")
def tx_multi_output_view_inplace_error():
    def drive(sub):
        x = W(6)
        a, b = sub(x)
        a.mul_(2)
        return a
    return Program(lambda x: (x * 1).split(3), drive=drive)

@case("tx")
def tx_unbind_output_inplace_error():
    def drive(sub):
        x = W(2, 3)
        a, b = sub(x)
        b.add_(1)
        return b
    return Program(lambda x: (x * 2).unbind(), drive=drive)

@case("tx")
def tx_index_put_bool_mask_grad():
    def f(x, v):
        y = x.clone()
        y[y > 0] = v
        return y
    return gdrive(f, lambda: (lambda x, v: ([x, v], (x, v)))(W(6), W(1)))

@case("tx")
def tx_setitem_grad_value_broadcast():
    def f(x, v):
        y = x * 1
        y[:, 1] = v
        return y
    return gdrive(f, lambda: (lambda x, v: ([x, v], (x, v)))(W(3, 3), W(1)))

@case("tx")
def tx_inplace_chain_grad():
    def f(x):
        y = x * 1
        y.sin_().mul_(2).add_(y)
        return y
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(4)))

@case("tx")
def tx_inplace_relu_then_grad():
    def f(x):
        y = x * 2
        F.relu(y, inplace=True)
        return y * x
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(5)))

@case("tx")
def tx_inplace_sigmoid_saved_output():
    def f(x):
        y = x + 0
        y.sigmoid_()
        return y * 3
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(5)))

@case("tx")
def tx_inplace_on_input_used_in_grad_later():
    def f(x, w):
        z = w * x
        x.zero_()
        return z
    return gdrive(f, lambda: (lambda w: ([w], (T(3), w)))(W(3)))

@case("tx")
def tx_grad_through_as_strided():
    return gdrive(lambda x: x.as_strided((2, 2), (1, 1), 1) * 2, lambda: (lambda x: ([x], (x,)))(W(5)))

@case("tx")
def tx_grad_through_unfold():
    return gdrive(lambda x: x.unfold(0, 3, 1).prod(-1), lambda: (lambda x: ([x], (x,)))(W(5)))

@case("tx")
def tx_grad_through_diagonal_expand():
    return gdrive(lambda x: x.diagonal().expand(2, 3) * x[0], lambda: (lambda x: ([x], (x,)))(W(3, 3)))

@case("tx")
def tx_grad_int_index_repeated():
    return gdrive(lambda x: x[torch.tensor([0, 0, 1, 0])] * 2, lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_grad_dtype_cast_chain():
    return gdrive(lambda x: x.double().half().float() * 3, lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_grad_half_input():
    return gdrive(lambda x: (x * x).sum(), lambda: (lambda x: ([x], (x,)))(T(4, dtype=torch.float16).requires_grad_()))

@case("tx")
def tx_grad_bf16_mm():
    return gdrive(lambda x, w: x @ w, lambda: (lambda x, w: ([x, w], (x, w)))(T(2, 3, dtype=torch.bfloat16).requires_grad_(), T(3, 2, dtype=torch.bfloat16).requires_grad_()))

@case("tx")
def tx_grad_complex_abs():
    return gdrive(lambda x: torch.view_as_real(x * x).sum(-1), lambda: (lambda x: ([x], (x,)))(torch.randn(3, dtype=torch.complex64, requires_grad=True)))

@case("tx")
def tx_grad_of_output_used_twice():
    def f(x):
        y = x.exp()
        return y, y
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_grad_input_returned_directly_and_used():
    def f(x):
        return x, x * 2
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_grad_nonleaf_input_returned():
    def f(x):
        return x, x.sum()
    return gdrive(f, lambda: (lambda x: ([x], (x * 2,)))(W(3)))

@case("tx")
def tx_grad_embedding_padding_idx():
    return gdrive(lambda i, w: F.embedding(i, w, padding_idx=1), lambda: (lambda w: ([w], (torch.tensor([0, 1, 1, 2]), w)))(W(3, 2)))

@case("tx")
def tx_grad_embedding_max_norm():
    def drive(sub):
        w = T(4, 3) * 3
        w.requires_grad_()
        with torch.no_grad():
            pass
        o = sub(torch.tensor([0, 2]), w)
        o.sum().backward()
        return o, w.grad, w
    return Program(lambda i, w: F.embedding(i, w, max_norm=1.0), drive=drive)

@case("tx")
def tx_grad_layer_norm_no_affine():
    return gdrive(lambda x: F.layer_norm(x, (3,)) * torch.arange(3.), lambda: (lambda x: ([x], (x,)))(W(2, 3)))

@case("tx")
def tx_grad_group_norm():
    return gdrive(lambda x, w: F.group_norm(x, 2, w), lambda: (lambda x, w: ([x, w], (x, w)))(W(2, 4, 3), W(4)))

@case("tx")
def tx_grad_instance_norm_running():
    rm = torch.zeros(3)
    def f(x):
        return F.instance_norm(x, running_mean=rm, running_var=torch.ones(3), use_input_stats=True)
    p = gdrive(f, lambda: (lambda x: ([x], (x,)))(W(2, 3, 4)))
    d = p.drive
    p.drive = lambda sub: (d(sub), rm.clone())
    return p

@case("tx")
def tx_grad_cross_entropy_weights():
    return gdrive(lambda x, y: F.cross_entropy(x, y, weight=torch.tensor([1.0, 2.0, 0.5]), ignore_index=2, label_smoothing=0.1),
                  lambda: (lambda x: ([x], (x, torch.tensor([0, 2, 1, 1]))))(W(4, 3)))

@case("tx")
def tx_grad_nll_reduction_none():
    return gdrive(lambda x, y: F.nll_loss(x.log_softmax(1), y, reduction="none"),
                  lambda: (lambda x: ([x], (x, torch.tensor([0, 2, 1]))))(W(3, 3)))

@case("tx")
def tx_grad_max_pool_indices():
    def f(x):
        v, i = F.max_pool2d(x, 2, return_indices=True)
        return v, i
    return gdrive(f, lambda: (lambda x: ([x], (x,)))(W(1, 1, 4, 4)))

@case("tx")
def tx_grad_sort_stable_ties():
    return gdrive(lambda x: x.sort(stable=True)[0] * torch.arange(5.), lambda: (lambda x: ([x], (x,)))(torch.tensor([1.0, 2.0, 1.0, 0.0, 2.0], requires_grad=True)))

@case("tx")
def tx_grad_topk_ties():
    return gdrive(lambda x: x.topk(2).values, lambda: (lambda x: ([x], (x,)))(torch.tensor([3.0, 3.0, 1.0, 3.0], requires_grad=True)))

@case("tx")
def tx_grad_median_ties():
    return gdrive(lambda x: x.median() + x.kthvalue(2).values, lambda: (lambda x: ([x], (x,)))(torch.tensor([3.0, 1.0, 1.0, 3.0], requires_grad=True)))

@case("tx")
def tx_grad_amax_ties_dim():
    return gdrive(lambda x: x.amax(1) + x.max(1).values, lambda: (lambda x: ([x], (x,)))(torch.tensor([[3.0, 3.0], [1.0, 2.0]], requires_grad=True)))

@case("tx")
def tx_grad_cumprod_zero():
    return gdrive(lambda x: x.cumprod(0), lambda: (lambda x: ([x], (x,)))(torch.tensor([2.0, 0.0, 3.0, 0.0], requires_grad=True)))

@case("tx")
def tx_grad_prod_zero():
    return gdrive(lambda x: x.prod() + x.prod(0).sum(), lambda: (lambda x: ([x], (x,)))(torch.tensor([[2.0, 0.0], [3.0, 0.0]], requires_grad=True)))

@case("tx")
def tx_grad_abs_at_zero_sign():
    return gdrive(lambda x: x.abs() + x.clamp(0, 1) + x.relu(), lambda: (lambda x: ([x], (x,)))(torch.tensor([0.0, -0.0, 1.0], requires_grad=True)))

@case("tx")
def tx_grad_hardtanh_boundary():
    return gdrive(lambda x: F.hardtanh(x) + F.relu6(x), lambda: (lambda x: ([x], (x,)))(torch.tensor([-1.0, 1.0, 6.0, 0.0], requires_grad=True)))

@case("tx")
def tx_grad_sqrt_zero():
    return gdrive(lambda x: x.sqrt() + x.rsqrt() * 0, lambda: (lambda x: ([x], (x,)))(torch.tensor([0.0, 4.0], requires_grad=True)))

@case("tx")
def tx_grad_norm_p_dims():
    return gdrive(lambda x: torch.linalg.vector_norm(x, 3, dim=1) + x.norm(p=1), lambda: (lambda x: ([x], (x,)))(W(2, 3)))

@case("tx")
def tx_grad_where_nan_branch():
    return gdrive(lambda x: torch.where(x > 0, x.log(), torch.zeros_like(x)), lambda: (lambda x: ([x], (x,)))(torch.tensor([-1.0, 2.0, 0.0], requires_grad=True)))

@case("tx")
def tx_grad_masked_fill_inf_softmax():
    return gdrive(lambda x: x.masked_fill(torch.tensor([True, False, False]), float("-inf")).softmax(0), lambda: (lambda x: ([x], (x,)))(W(3)))

@case("tx")
def tx_grad_logsumexp_inf():
    return gdrive(lambda x: torch.logsumexp(x, 0), lambda: (lambda x: ([x], (x,)))(torch.tensor([float("-inf"), float("-inf")], requires_grad=True)))
