"""More programs for test_dynrepros_programs.py (registered in dynrepros_programs.PROGRAMS): dtype
views of inputs written through, overlapping views (unfold, expand) written in place, inputs that
are views of a base requiring grad, custom autograd.Functions that return an input as it is, outputs
the caller updates in place afterwards, layout changes of intermediates.
"""
# ruff: noqa
# mypy: ignore-errors
import torch

from dynrepros_programs import G, I, NL, R, case, cases, g34, nl34, x34


@case(lambda: (torch.arange(-12, 12).reshape(4, 6),), ind=True)
def dv_int_view_then_input_write(x):
    y = x.view(torch.int32) * 2
    y.sub_(-4)
    x[:, 2:5] = 2
    return y.view(torch.int64)


@case(lambda: (R(4, 4), R(4, 4)))
def dv_same_dtype_view_copy(x, y):
    x.view(torch.float32).copy_(y)
    return x


@case(lambda: (R(4, 4),))
def dv_bitcast_write(x):
    x.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # clears the sign bits: abs through the int view
    return x


@case(lambda: (R(2, 5),))
def ov_unfold_inplace(x):
    t = (x + x).unfold(1, 3, 2)
    return t.abs_()


@case(lambda: (R(1, 4),))
def ov_expand_intermediate_inplace_raises(x):
    y = (x * 2).expand(3, 4)
    y.add_(1)
    return y


def _strided_view_of_nonleaf():
    a = G(8)
    base = a * 1
    return (base[0::2], base, a)


@case(_strided_view_of_nonleaf, ind=True)
def bv_strided_view_of_nonleaf(v, base, a):
    v.add_(1.0)


@case(_strided_view_of_nonleaf)
def bv_strided_view_mul_return_base(v, base, a):
    v.mul_(v)
    return base * 1


@case(lambda: (lambda a: (a.view(2, 4)[1], a))(G(8) * 1))
def bv_row_view_of_nonleaf(v, base):
    v.sigmoid_()
    return v


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


@case(g34)
def cf_identity_then_use(x):
    y = _Identity.apply(x)
    return y * 1


@case(nl34)
def cf_identity_then_mutate_raises(x, leaf):
    y = _Identity.apply(x)
    y.add_(1)
    return y


@case(g34)
def cf_scale_inplace_after(x):
    y = _Scale.apply(x)
    y.add_(1)
    return y


@case(x34)
def cf_identity_no_grad_input(x):
    y = _Identity.apply(x)
    y.add_(1)
    return x


# outputs the caller updates in place after the call: the program returns a function of the call
def _caller_writes(fn):
    """A program whose result the caller then updates in place; the program is the compiled part."""
    return fn


@cases(x34, g34)
def ow_unsqueeze_inplace_intermediate(x):
    out = x * 2
    out.unsqueeze_(0)
    return out


@cases(x34, g34)
def ow_t_inplace_intermediate(x):
    out = x + 1
    out.t_()
    return out, out.stride()


@case(g34)
def ow_resize_intermediate(x):
    out = (x * 2).detach()
    out.resize_(2, 3)
    return out


@cases(x34, g34)
def ow_squeeze_inplace_view(x):
    out = (x * 2)[None]
    out.squeeze_(0)
    return out


@case(lambda: (R(3, 4),))
def ow_as_strided_inplace_intermediate(x):
    out = x.clone()
    out.as_strided_((2, 2), (4, 1), 1)
    return out


@case(lambda: (R(3, 4),))
def ow_view_dtype_intermediate(x):
    y = x.clone()
    z = y.view(torch.int32)
    z.zero_()
    return y


@case(lambda: (torch.randn(3, 4, dtype=torch.complex64),))
def ow_complex_real_write(x):
    x.real.mul_(2)
    torch.view_as_real(x)[..., 1].zero_()
    return x


@case(lambda: (torch.randn(3, 4, dtype=torch.complex64, requires_grad=True),))
def ow_complex_grad(x):
    y = x * 2
    y.imag.zero_()
    return torch.view_as_real(y)


@case(lambda: (R(3, 4), I(3, 4, lo=0, hi=2).bool()))
def ow_where_inplace_bool_input(x, m):
    m.logical_not_()
    x.masked_fill_(m, 0.0)
    return x, m


@case(lambda: (R(6),))
def ow_split_then_write(x):
    a, b = x.split(3)
    a.add_(1)
    b.mul_(2)
    return x


@case(lambda: (G(6),))
def ow_split_of_intermediate_grad(x):
    y = x * 1
    a, b = y.split(3)
    a.mul_(2)  # raises: an output of split may not be updated in place (multi-output view)
    return y


@case(lambda: (G(6),))
def ow_chunk_clone_ok(x):
    y = x * 1
    a, b = [t.clone() for t in y.chunk(2)]
    a.mul_(2)
    return a, b


# input version counters when a matmul's result is written into the input (the inductor computes
# it there with an ATen out= call, which moves the counter itself)
mm3 = lambda: (R(3, 4), R(4, 5), R(3, 5))


@case(mm3, ind=True)
def vc_mm_out_input(a, b, out):
    torch.mm(a, b, out=out)
    return out.sum()


@case(mm3, ind=True)
def vc_addmm_inplace(a, b, out):
    out.addmm_(a, b)
    return out


@case(mm3, ind=True)
def vc_mm_out_then_add(a, b, out):
    torch.mm(a, b, out=out)
    out.add_(1)
    return out._version


@case(mm3, ind=True)
def vc_copy_of_mm(a, b, out):
    out.copy_(a @ b)
    return out


@case(mm3, ind=True)
def vc_slice_assign_mm(a, b, out):
    out[:] = a @ b
    return out * 2


@case(lambda: (R(2, 3, 4), R(2, 4, 5), R(2, 3, 5)), ind=True)
def vc_bmm_out(a, b, out):
    torch.bmm(a, b, out=out)
    return out


@case(lambda: (R(2, 3, 4), R(2, 4, 5), R(2, 3, 5)), ind=True)
def vc_baddbmm_inplace(a, b, out):
    out.baddbmm_(a, b, beta=0.5)
    return out


@case(lambda: (R(3, 4), R(4, 5), R(3, 5), R(3, 5)), ind=True)
def vc_two_outs(a, b, o1, o2):
    torch.mm(a, b, out=o1)
    o2.add_(o1)
    return o1._version, o2._version


# inputs that are views (with history) of a non-leaf base that requires grad
def _views_of_nonleaf(*views, with_base=False, shape=(4, 6)):
    def make():
        a = G(*shape)
        base = a * 1
        out = tuple(v(base) for v in views)
        return (*out, base, a) if with_base else (*out, a)
    return make


@case(_views_of_nonleaf(lambda b: b[1:]), ind=True)
def bn_slice_mul(v, a):
    v.mul_(2)
    return v.sum()


@case(_views_of_nonleaf(lambda b: b[:, ::2], with_base=True))
def bn_strided_cols_return_base(v, base, a):
    v.add_(1)
    return base * 1


@case(_views_of_nonleaf(lambda b: b.t()))
def bn_t_relu_inplace(v, a):
    v.relu_()
    return v


@case(_views_of_nonleaf(lambda b: b[0], lambda b: b[1:]))
def bn_two_views_one_written(u, v, a):
    v.mul_(3)
    return u * 1, v * 1


@case(_views_of_nonleaf(lambda b: b[:2], lambda b: b[1:3]))
def bn_overlapping_views_written(u, v, a):
    u.add_(1)
    v.mul_(2)
    return u.sum() + v.sum()


@case(_views_of_nonleaf(lambda b: b.view(-1)))
def bn_flat_index_write(v, a):
    v[3] = 0.0
    return v


@case(_views_of_nonleaf(lambda b: b[1:]))
def bn_read_only(v, a):
    return v.exp()


@case(_views_of_nonleaf(lambda b: b[1:]), calls=2, dynamic=True)
def bn_dynamic(v, a):
    v.mul_(v)
    return v


@case(_views_of_nonleaf(lambda b: b[1:], with_base=True))
def bn_base_written_view_read(v, base, a):
    base.add_(1)
    return v * 2


@case(lambda: (lambda a: (a.detach()[1:],))(G(4, 6) * 1))
def bn_detached_view(v):
    v.add_(1)
    return v


@case(lambda: (lambda b: (b[1:],))((G(4, 6) * 1).detach().requires_grad_()))
def bn_view_of_leaf_raises(v):
    v.add_(1)
    return v


@case(_views_of_nonleaf(lambda b: b[::2]), calls=2)
def bn_mutate_return_views(v, a):
    v.mul_(2)
    return (v * 3).sum(), v[1:], v.t()


# float16 values that overflow (or not) in a fused chain, then read by a predicate: eager stored them
# as float16 (inf), a kernel computing in float32 holds a finite value unless it rounds first
h4 = lambda: (torch.tensor([1.0, -0.3, -2.0, 0.6, 1e-4], dtype=torch.float16),)
b4 = lambda: (torch.tensor([1.0, -0.3, -2.0, 0.6, 1e-4], dtype=torch.bfloat16),)


@cases(h4, b4, ind=(True, True))
def hf_isinf_after_mul(x):
    return (x * 60000).isinf(), (x * 3e38).isinf().sum()


@cases(h4, b4, ind=(True, True))
def hf_isfinite_after_exp(x):
    return (x * 20).exp().isfinite()


@cases(h4, b4, ind=(True, True))
def hf_nan_to_num_after_mul(x):
    return torch.nan_to_num(x * 60000), torch.nan_to_num((x * 3e38) * 10, posinf=1.0)


@cases(h4, b4, ind=(True, True))
def hf_where_isinf(x):
    y = x * 60000
    return torch.where(y.isinf(), torch.zeros_like(y), y)


@cases(h4, b4, ind=(True, True))
def hf_isnan_inf_minus_inf(x):
    y = x * 60000
    return (y - y).isnan(), torch.isnan(y * 0)
