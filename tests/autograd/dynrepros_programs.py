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

import dynrepros_programs_b  # noqa: E402,F401  # registers its programs in PROGRAMS
import dynrepros_programs_c  # noqa: E402,F401  # registers its programs in PROGRAMS
import dynrepros_programs_d  # noqa: E402,F401  # registers its programs in PROGRAMS
