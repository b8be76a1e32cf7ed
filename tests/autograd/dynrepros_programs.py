"""Programs of the kind PyTorch tests its Dynamo and AOT autograd runtime with (written here, not
copied): mutation of inputs and of their views, inputs that alias each other, metadata mutation,
outputs that alias inputs or each other, parameter updates under no_grad, .data and .detach()
writes, requires_grad_ in the frame, tensors stored on objects and globals, in-place ops on
intermediate views, set_ and shared storage, buffer updates in forward, non-contiguous, expanded
and zero-stride inputs, backward through in-place ops on views, hooks, out= variants, scalar and
dtype promotion, integer overflow, division by zero, empty tensors.

Each program is registered by `case(make, ...)`: `make()` gives fresh arguments (the harness seeds
torch per call, so sizes drawn with `_n()` differ from call to call), `calls` how many calls,
`dynamic` the compile's dynamic=, `ind` whether the program is also run under the default backend
(inductor) in the CI slice. RESETS put module state (globals, stored objects) back before a run.
"""
# ruff: noqa
# mypy: ignore-errors
import torch
import torch.nn as nn
import torch.nn.functional as F

PROGRAMS: list = []  # (name, fn, make, calls, dynamic, ind)
RESETS: list = []


def case(make, calls=1, dynamic=None, ind=False, name=None):
    def deco(fn):
        PROGRAMS.append((name or fn.__name__, fn, make, calls, dynamic, ind))
        return fn
    return deco


def cases(*makes, **kw):
    """The same program on several argument makers: name_<i>."""
    def deco(fn):
        for i, mk in enumerate(makes):
            case(mk, name=f"{fn.__name__}_{i}", **{k: (v[i] if isinstance(v, tuple) else v) for k, v in kw.items()})(fn)
        return fn
    return deco


def R(*s, dtype=torch.float32):
    return torch.randn(*s).to(dtype)


def G(*s):
    return torch.randn(*s, requires_grad=True)


def I(*s, lo=-5, hi=6, dtype=torch.int64):
    return torch.randint(lo, hi, s, dtype=dtype)


def _n(lo=3, hi=8):
    return int(torch.randint(lo, hi, ()))


def NL(*s):
    """A non-leaf that requires grad, with its leaf beside it (the leaf gets the grads)."""
    a = G(*s)
    return a * 1, a


x34 = lambda: (R(3, 4),)
g34 = lambda: (G(3, 4),)
nl34 = lambda: NL(3, 4)
xt = lambda: (R(4, 3).t(),)                    # non-contiguous
xs = lambda: (R(3, 8)[:, ::2],)                # strided
xo = lambda: (R(20)[5:17].view(3, 4),)         # storage offset
xe = lambda: (R(1, 4).expand(3, 4),)           # zero stride
xx = lambda: (R(3, 4), R(3, 4))
xg = lambda: (R(3, 4), G(3, 4))
gg = lambda: (G(3, 4), G(3, 4))
dyn = lambda: (R(_n(), 4),)
dyn2 = lambda: (R(_n(), _n()),)
ALL5 = (x34, nl34, xt, xs, xo)


# ---------------------------------------------------------------- input mutation
@cases(*ALL5, ind=(True, False, True, False, False))
def im_add_(x, *_):
    x.add_(1)
    return x * 2


@cases(x34, nl34, xt)
def im_mul_no_return(x, *_):
    x.mul_(2)


@cases(*ALL5)
def im_row_add_(x, *_):
    x[0].add_(1)
    return x.sum()


@cases(*ALL5, ind=(True, False, False, False, False))
def im_col_zero_(x, *_):
    x[:, 1].zero_()
    return x + 1


@cases(x34, xt, xo)
def im_flat_slice_fill(x):
    x.reshape(-1)[2:5].fill_(3)
    return x


@cases(*ALL5)
def im_t_add_(x, *_):
    x.t().add_(1)
    return x


@cases(x34, nl34, xt)
def im_diag_mul_(x, *_):
    x.diagonal().mul_(0)
    return x.sum(0)


@cases(xx, xg, lambda: (R(4, 3).t(), R(3, 4)), ind=(True, False, False))
def im_copy_(x, y):
    x.copy_(y)
    return x + y


@case(lambda: (R(3, 1), R(3, 4)))
def im_copy_broadcast_wrong_way(x, y):
    x.copy_(y)  # raises: cannot broadcast (3, 4) into (3, 1)
    return x


@case(lambda: (R(3, 4), R(4)))
def im_copy_broadcast(x, y):
    x.copy_(y)
    return x


@cases(x34, nl34)
def im_unsqueeze_view_add_(x, *_):
    x.unsqueeze(0).add_(1)
    return x.shape, x


@cases(x34, nl34, ind=(True, False))
def im_read_after_write(x, *_):
    y = x * 2
    x.add_(y)
    z = x * 3
    return y, z


@case(g34)
def im_leaf_requires_grad_raises(x):
    x.add_(1)
    return x


@case(g34)
def im_view_of_leaf_raises(x):
    x[0].mul_(2)
    return x


@cases(x34, nl34)
def im_index_put_(x, *_):
    x[torch.tensor([0, 2])] = 5.0
    return x.sum()


@cases(x34, nl34)
def im_mask_assign(x, *_):
    x[x > 0] = 0
    return x


@cases(x34, nl34)
def im_scatter_(x, *_):
    idx = torch.tensor([[0, 1, 2, 0]])
    x.scatter_(0, idx, 7.0)
    return x


@cases(x34, nl34, xt, ind=(True, False, False))
def im_pointwise_inplace_chain(x, *_):
    x.clamp_(-0.5, 0.5).relu_()
    x.sigmoid_()
    return x


@cases(x34, nl34)
def im_masked_fill_(x, *_):
    x.masked_fill_(x < 0, -1.0)
    return x.mean()


@cases(lambda: (R(3, 4), R(3, 4), R(3, 4)), lambda: (G(3, 4) * 1, R(3, 4), G(3, 4)))
def im_addcmul_(x, a, b):
    x.addcmul_(a, b, value=0.5)
    return x


@cases(x34, nl34)
def im_pow_(x, *_):
    x.pow_(2)
    return x.sum()


@cases(x34, nl34, ind=(True, False))
def im_twice_with_read(x, *_):
    x.mul_(2)
    a = x.sum()
    x.add_(1)
    return a, x.sum()


@cases(x34, lambda: (R(3, 4) - 10,))
def im_conditional_break(x):
    if x.sum() > 0:
        x.add_(1)
    else:
        x.sub_(1)
    return x


@cases(lambda: (I(3, 4),), lambda: (I(3, 4, dtype=torch.int32),), ind=(True, False))
def im_int_add_(x):
    x.add_(3)
    x.mul_(-2)
    return x


@case(lambda: (I(3, 4),))
def im_int_div_raises(x):
    x.div_(2)  # raises: result type Float can't be cast to Long
    return x


@case(lambda: (I(3, 4),))
def im_int_floor_div_(x):
    x.floor_divide_(2)
    return x


@case(x34)
def im_float_copy_unaffected(x):
    y = x.float()  # same dtype: the same tensor
    y.add_(1)
    z = x.double()
    z.add_(1)
    return x, z


@case(x34)
def im_to_same_dtype_aliases(x):
    y = x.to(torch.float32)
    y.mul_(3)
    return y is x, x


@cases(x34, xt)
def im_contiguous_maybe_alias(x):
    y = x.contiguous()
    y.add_(1)
    return x, y


@cases(x34, xt)
def im_reshape_maybe_alias(x):
    y = x.reshape(12)
    y.add_(1)
    return x, y


@case(xe)
def im_expanded_input_raises(x):
    x.add_(1)
    return x


@case(xe, ind=True)
def im_expanded_input_read(x):
    return x * 2, x.sum(0)


@case(lambda: (torch.ones(1).expand(4),))
def im_zero_stride_read(x):
    return x + torch.arange(4.0)


@case(lambda: (torch.zeros(()).expand(3, 2), R(3, 2)))
def im_zero_stride_copy_raises(x, y):
    x.copy_(y)
    return x


@cases(xt, xs, xo, ind=(True, True, True))
def im_keeps_strides(x):
    x.mul_(2)
    x.add_(x.t().sum(0)[:1].reshape(1, 1) if x.dim() == 2 and x.shape[0] == x.shape[1] else 1)
    return x.stride(), x


@case(lambda: (R(5, 5),))
def im_square_t_add(x):
    x.add_(x.t())  # reads and writes overlapping: eager reads the updated values? no: x.t() is a view
    return x


@case(lambda: (R(4),))
def im_overlapping_self_add(x):
    x[1:].add_(x[:-1])
    return x


# ------------------------------------------------ inputs that alias each other
def _twice(mk):
    def make():
        t = mk()
        return (t, t)
    return make


def _with_view(mk, view):
    def make():
        t = mk()
        return (t, view(t))
    return make


A = lambda: R(4, 4)
AN = lambda: G(4, 4) * 1


@cases(_twice(A), _twice(AN), ind=(True, False))
def al_same_twice(a, b):
    a.add_(1)
    return b * 2


@cases(_twice(A), _twice(AN))
def al_same_twice_both_mutate(a, b):
    a.mul_(2)
    b.add_(1)
    return a + b


@cases(_with_view(A, lambda t: t[1:]), _with_view(AN, lambda t: t[1:]), ind=(True, False))
def al_slice(a, b):
    a.mul_(2)
    return b + 1


@cases(_with_view(A, lambda t: t[1:]), _with_view(AN, lambda t: t[1:]))
def al_slice_mutate_view(a, b):
    b.add_(10)
    return a.sum(), a


@cases(_with_view(A, lambda t: t.t()), _with_view(AN, lambda t: t.t()), ind=(True, False))
def al_transpose(a, b):
    a[0].fill_(1)
    return b.clone()


@cases(_with_view(A, lambda t: t.view(-1)), _with_view(AN, lambda t: t.view(-1)))
def al_flat(a, b):
    b[3] = 100.0
    return a


@cases(_with_view(A, lambda t: t[:, 1]), _with_view(A, lambda t: t.diagonal()))
def al_column(a, b):
    b.mul_(-1)
    a.add_(1)
    return a, b


@case(lambda: (lambda t: (t[:2], t[2:]))(R(4, 4)))
def al_disjoint_halves(a, b):
    a.add_(1)
    b.mul_(2)
    return a, b


@case(lambda: (lambda t: (t[:3], t[1:]))(R(4, 4)))
def al_overlapping_halves(a, b):
    a.add_(1)
    b.mul_(2)
    return a.sum(), b.sum()


@case(lambda: (lambda t: (t, t[1:], t[:, 0]))(R(4, 4)))
def al_three_views(a, b, c):
    c.fill_(0)
    b.add_(1)
    return a * 1


@case(_twice(A), calls=2)
def al_twice_then_distinct(a, b):
    a.add_(1)
    return b.sum()


@case(lambda: (lambda t: (t, t))(R(4, 4)) if torch.rand(()) > 2 else (R(4, 4), R(4, 4)), calls=1)
def al_distinct_pair(a, b):
    a.add_(1)
    return b.sum()


# ------------------------------------------------ metadata mutation
@cases(x34, lambda: (R(3, 4).t(),))
def mm_t_(x):
    x.t_()
    return x.shape, x.stride(), x + 1


@case(x34)
def mm_t_then_add_(x):
    x.t_()
    x.add_(torch.arange(3.0))
    return x


@case(x34, ind=True)
def mm_unsqueeze_(x):
    x.unsqueeze_(0)
    return x * 2


@case(lambda: (R(3, 1, 4),))
def mm_squeeze_(x):
    x.squeeze_(1)
    return x.shape


@case(x34)
def mm_transpose_(x):
    x.transpose_(0, 1)
    return x.sum(1)


@cases(lambda: (R(3, 4),), lambda: (R(12),))
def mm_resize_smaller(x):
    x.resize_(2, 3)
    return x * 1


@case(lambda: (R(3, 4),))
def mm_as_strided_(x):
    x.as_strided_((2, 2), (1, 4))
    return x + 0


@case(lambda: (R(3, 4), R(2, 5)))
def mm_set_(x, y):
    x.set_(y)
    x.add_(1)
    return x, y


@case(lambda: (R(3, 4),))
def mm_unsqueeze_then_write(x):
    x.unsqueeze_(1)
    x[:, 0, 1] = 9.0
    return x


@case(lambda: (R(2, 3, 4),))
def mm_swapdims_(x):
    x.swapdims_(0, 2)
    return x.contiguous()


@case(lambda: (torch.empty(0),))
def mm_resize_empty_grow(x):
    x.resize_(3)
    x.fill_(2)
    return x


# ------------------------------------------------ outputs aliasing inputs / each other
@cases(x34, g34, nl34, ind=(True, False, False))
def oa_return_input(x, *_):
    return x


@cases(x34, g34)
def oa_return_input_twice(x):
    return x, x


@cases(x34, g34, nl34, xt, ind=(True, False, False, False))
def oa_view(x, *_):
    return x.view(-1) if x.is_contiguous() else x.reshape(-1)


@cases(x34, g34, nl34)
def oa_select(x, *_):
    return x[0], x[:, 2]


@cases(x34, g34, ind=(True, False))
def oa_t_and_sum(x):
    return x.t(), x.sum()


@cases(x34, g34, ind=(True, True))
def oa_intermediate_and_view(x):
    y = x * 2
    return y, y.view(-1), y[1]


@cases(x34, g34)
def oa_intermediate_twice(x):
    y = x + 1
    return y, y


@cases(x34, g34)
def oa_two_views_of_input(x):
    return x.view(2, 6), x.view(12), x.unsqueeze(0)


@cases(x34, g34)
def oa_detach(x):
    return x.detach(), x * 1


@cases(x34, g34)
def oa_view_as(x):
    return x.view_as(x)


@cases(x34, g34, ind=(True, False))
def oa_unbind(x):
    return x.unbind(0)


@cases(x34, g34)
def oa_split_chunk(x):
    return x.split(2), x.chunk(2, 1)


@cases(x34, g34)
def oa_diagonal_narrow(x):
    return x.diagonal(), x.narrow(1, 1, 2)


@case(lambda: (torch.randn(3, 4, dtype=torch.complex64),))
def oa_complex_views(x):
    return torch.view_as_real(x), x.real, x.imag


@cases(x34, g34)
def oa_expand(x):
    return x[:, None].expand(3, 5, 4)


@cases(lambda: (R(3, 1, 4),), lambda: (G(3, 1, 4),))
def oa_squeeze(x):
    return x.squeeze(), x.squeeze(1)


@cases(x34, g34)
def oa_as_strided(x):
    return x.as_strided((2, 2), (4, 1), 1)


@cases(x34, nl34, ind=(True, False))
def oa_inplace_returns_self(x, *_):
    return x.add_(1)


@cases(x34, nl34)
def oa_mutate_and_return_view(x, *_):
    x.mul_(2)
    return x[1:], x.t()


@cases(x34, g34)
def oa_view_of_intermediate_only(x):
    y = x.exp()
    return y[0], y[1:]


@cases(x34, g34)
def oa_mixed_alias_and_fresh(x):
    y = x.sin()
    return x, y, x.view(-1), y.t()


@cases(x34, g34)
def oa_ellipsis_none(x):
    return x[..., None], x[None, ...]


@case(x34)
def oa_alias_then_caller_mutates(x):
    return x.view(-1), x[0]


@case(x34)
def oa_return_dict_of_views(x):
    return {"a": x[0], "b": x.t(), "c": x + 1}


@case(x34, calls=3)
def oa_return_input_repeat(x):
    return x, x.view(-1)


# ------------------------------------------------ grad mode x parameter updates
@case(lambda: (G(3, 4), R(3, 4)), ind=True)
def ng_sgd_step(w, g):
    with torch.no_grad():
        w.sub_(0.1 * g)
    return w * 2


@case(lambda: (G(3, 4),))
def ng_data_mul(w):
    w.data.mul_(0.5)
    return w.sum()


@case(lambda: (G(3, 4),))
def ng_detach_add(w):
    w.detach().add_(1)
    return w * 3


def _with_grads():
    ps = [G(3, 4), G(4)]
    for p in ps:
        p.grad = torch.randn_like(p)
    return (ps,)


@case(_with_grads, ind=True)
def ng_optimizer_loop(params):
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.01)
    return [p.sum() for p in params]


@case(_with_grads)
def ng_grad_zero(params):
    for p in params:
        p.grad.zero_()
    return params[0] * 1


@case(_with_grads)
def ng_grad_none(params):
    for p in params:
        p.grad = None
    return params[1] + 1


@case(_with_grads)
def ng_momentum_buffer(params):
    bufs = []
    with torch.no_grad():
        for p in params:
            b = p.grad.clone()
            b.mul_(0.9).add_(p.grad)
            p.add_(b, alpha=-0.1)
            bufs.append(b)
    return bufs


@case(lambda: (G(3, 4),))
def ng_requires_grad_false(w):
    w.requires_grad_(False)
    return w * 2


@case(x34)
def ng_requires_grad_in_frame(x):
    x.requires_grad_()
    y = x * 2
    return y


@case(x34)
def ng_requires_grad_in_frame_then_backward_target(x):
    x.requires_grad_(True)
    return (x * x).sum()


@case(g34)
def ng_no_grad_output(x):
    with torch.no_grad():
        y = x * 2
    return y, x * 3


@case(lambda: (G(3, 4), R(3, 4)))
def ng_copy_under_no_grad(w, v):
    with torch.no_grad():
        w.copy_(v)
    return w + 1


@case(lambda: (G(3, 4), R(3, 4)))
def ng_set_data(w, v):
    w.data = v
    return w * 2


@case(lambda: (G(3, 4), R(3, 4)))
def ng_copy_with_grad_raises(w, v):
    w.copy_(v)
    return w


@case(g34)
def ng_enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 3
    return y, z


@case(g34)
def ng_set_grad_enabled(x):
    torch.set_grad_enabled(False)
    y = x + 1
    torch.set_grad_enabled(True)
    return y, x.exp()


@case(g34)
def ng_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y.sum()


@case(lambda: (G(3, 4),))
def ng_data_read(w):
    return w.data * 2, w.detach().t()


@case(lambda: (G(3, 4),))
def ng_detach_alias_output(w):
    d = w.detach()
    d[0] = 0.0
    return d, w


# ------------------------------------------------ state stored on objects and globals
STORE: list = []
RESETS.append(STORE.clear)


class Holder:
    pass


HOLDER = Holder()
RESETS.append(lambda: HOLDER.__dict__.clear())


@case(x34, ind=True)
def st_global_append(x):
    STORE.append(x * 2)
    return x + 1


@case(x34)
def st_attr_intermediate(x):
    HOLDER.buf = x + 1
    return HOLDER.buf * 2


@case(x34)
def st_attr_input(x):
    HOLDER.inp = x
    x.add_(1)
    return x.sum()


@case(x34)
def st_attr_view_of_input(x):
    HOLDER.v = x[0]
    x.mul_(3)
    return HOLDER.v


@case(g34)
def st_attr_grad_tensor(x):
    HOLDER.y = x * 2
    return HOLDER.y.sum()


@case(x34)
def st_global_then_mutate_stored(x):
    y = x * 2
    STORE.append(y)
    y.add_(1)
    return y


COUNTER = {"t": torch.zeros(())}
RESETS.append(lambda: COUNTER.update(t=torch.zeros(())))


@case(x34, calls=2)
def st_global_tensor_inplace(x):
    COUNTER["t"].add_(x.sum())
    return COUNTER["t"] * 1


@case(x34, calls=2)
def st_global_tensor_rebind(x):
    COUNTER["t"] = COUNTER["t"] + x.sum()
    return x


# ------------------------------------------------ in-place on intermediate views, then the base
@cases(x34, g34, ind=(True, True))
def iv_clone_row_add(x):
    y = x.clone()
    y[0].add_(1)
    return y


@cases(x34, g34, ind=(False, True))
def iv_flat_view_mul(x):
    y = x * 1
    v = y.view(-1)
    v.mul_(2)
    return y


@cases(x34, g34)
def iv_t_add_then_sum(x):
    y = x.clone()
    y.t().add_(1)
    return y.sum()


@cases(x34, g34)
def iv_tail_zero_both(x):
    y = x.clone()
    z = y[1:]
    z.zero_()
    return y, z


@cases(x34, g34, ind=(True, False))
def iv_zeros_column_assign(x):
    y = torch.zeros(3, 4)
    y[:, 0] = x[:, 1]
    return y


@cases(x34, g34)
def iv_diag_fill(x):
    y = x.clone()
    y.diagonal().fill_(0)
    return y


@cases(x34, g34)
def iv_empty_copy(x):
    y = torch.empty(4, 3)
    y.copy_(x.t())
    return y


@cases(x34, g34)
def iv_view_chain(x):
    y = x.clone()
    v = y.view(2, 6)[1].view(3, 2)
    v.mul_(10)
    return y


@cases(x34, g34)
def iv_unbind_mutation(x):
    y = x.clone()
    a, b, c = y.unbind(0)
    b.fill_(5)
    return y


@cases(x34, g34)
def iv_base_mutated_read_view(x):
    y = x * 2
    v = y[1]
    y.add_(1)
    return v


@cases(x34, g34)
def iv_view_mutated_twice(x):
    y = x.clone()
    v1 = y[:, :2]
    v2 = y[:, 1:]
    v1.mul_(2)
    v2.add_(1)
    return y, v1, v2


@case(g34)
def iv_detach_intermediate_write(x):
    y = x * 2
    y.detach()[0] = 0.0
    return y


@case(g34)
def iv_data_intermediate_write(x):
    y = x * 2
    y.data[1] = 5.0
    return y * 1


import dynrepros_programs_a2  # noqa: E402,F401  # registers its programs in PROGRAMS
import dynrepros_programs_b  # noqa: E402,F401  # registers its programs in PROGRAMS
import dynrepros_programs_c  # noqa: E402,F401  # registers its programs in PROGRAMS
import dynrepros_programs_d  # noqa: E402,F401  # registers its programs in PROGRAMS
