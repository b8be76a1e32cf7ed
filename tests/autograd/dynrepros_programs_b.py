"""More programs for test_dynrepros_programs.py (registered in dynrepros_programs.PROGRAMS): aliasing
that changes between calls, views taken before a mutation, saved tensors modified after use (eager's
backward refuses), parameter updates in forward, state kept across calls on modules, globals and
closures, index_put with repeated indices, containers of inputs, out= into views of inputs,
requires_grad_ and detach_ of intermediates.
"""
# ruff: noqa
# mypy: ignore-errors
import torch
import torch.nn as nn

from dynrepros_programs import G, I, NL, R, RESETS, _n, case, cases, g34, nl34, x34, xt

CALL = {"i": 0}
RESETS.append(lambda: CALL.update(i=0))


def _by_call(*makes):
    """The i-th call gets makes[i % len(makes)]()."""
    def make():
        k = CALL["i"]
        CALL["i"] += 1
        return makes[k % len(makes)]()
    return make


def _pair_same():
    t = R(4, 4)
    return (t, t)


def _pair_view():
    t = R(4, 4)
    return (t, t[1:])


def _pair_distinct():
    return (R(4, 4), R(4, 4))


# ------------------------------------------------ aliasing that changes between calls
@case(_by_call(_pair_distinct, _pair_same, _pair_distinct, _pair_view), calls=4)
def ch_alias_changes(a, b):
    a.add_(1)
    return b * 2


@case(_by_call(_pair_same, _pair_distinct, _pair_view), calls=3)
def ch_alias_changes_both_write(a, b):
    b.mul_(2)
    a.add_(1)
    return a.sum(), b.sum()


@case(_by_call(lambda: (R(4, 4),), lambda: (R(4, 4).t(),), lambda: (R(8, 4)[::2],)), calls=3)
def ch_layout_changes(x):
    x.add_(1)
    return x.view(-1) if x.is_contiguous() else x.t()


@case(_by_call(lambda: (R(3, 4), R(3, 4)), lambda: (G(3, 4), R(3, 4)), lambda: (R(3, 4), G(3, 4))), calls=3)
def ch_requires_grad_changes(a, b):
    return a * b, a.t()


# ------------------------------------------------ views taken before a mutation
@cases(x34, nl34)
def vb_view_then_mutate(x, *_):
    y = x[0]
    x.add_(1)
    return y


@case(x34)
def vb_t_then_t_(x):
    y = x.t()
    x.t_()
    return y, x


@cases(x34, g34)
def vb_intermediate_view_then_mutate(x):
    y = x * 2
    v = y[0]
    y.mul_(3)
    return v


@cases(x34, g34)
def vb_two_views_of_intermediate(x):
    y = x.exp()
    a = y[:, :2]
    b = y[:, 1:]
    a.add_(1)
    return b


@case(lambda: (R(4, 3).t(),))
def vb_reshape_copy_write(x):
    y = x.reshape(-1)  # a copy: x is not contiguous
    y.add_(1)
    return x, y


@case(x34)
def vb_view_chain_mutate(x):
    x.view(2, 6)[:, 1:3].view(-1).mul_(0)
    return x


# ------------------------------------------------ saved tensors modified after use
@case(lambda: (R(3, 4), G(3, 4)))
def sv_input_modified_after_save(x, w):
    y = x * w  # saves x for w's gradient
    x.add_(1)
    return y


@case(lambda: (R(3, 4), G(3, 4)))
def sv_input_modified_not_saved(x, w):
    y = x + w  # saves nothing
    x.add_(1)
    return y


@case(lambda: (G(3, 4),))
def sv_intermediate_modified_after_save(w):
    y = w * 2
    z = y * y
    y.add_(1)
    return z


@case(lambda: (G(3, 4),))
def sv_exp_output_modified(w):
    y = w.exp()  # saves its result
    y.add_(1)
    return y


@case(lambda: (G(3, 4),))
def sv_sigmoid_inplace_then_inplace(w):
    y = w * 1
    y.sigmoid_()
    y.mul_(2)
    return y


@case(lambda: (G(3, 4), R(3, 4)))
def sv_param_updated_after_use(w, g):
    y = (w * w).sum()
    with torch.no_grad():
        w.sub_(g)
    return y


# ------------------------------------------------ parameters and state across calls
class DecayInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.no_grad():
            self.w.mul_(0.9)
        return x @ self.w


class DataWriteInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        self.w.data.clamp_(-0.5, 0.5)
        return x * self.w


class CacheOnModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = x.clone()
        else:
            self.cache.add_(x)
        return self.cache * 1


class ClampParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        self.w.data = self.w.data.clamp(-0.5, 0.5)
        return x * self.w


def _mod(cls, *shape):
    def make():
        torch.manual_seed(3)
        return (cls(), R(*shape))
    return make


@case(_mod(DecayInForward, 3, 4), ind=True)
def pm_decay_in_forward(m, x):
    return m(x)


@case(_mod(DataWriteInForward, 3, 4))
def pm_data_clamp_in_forward(m, x):
    return m(x)


@case(_mod(ClampParam, 3, 4))
def pm_data_assign_in_forward(m, x):
    return m(x)


@case(_mod(CacheOnModule, 3, 4))
def pm_cache_on_module_twice(m, x):
    a = m(x)
    b = m(x)
    return a, b, m.cache


KEPT = {"t": None}
RESETS.append(lambda: KEPT.update(t=None))


@case(x34, calls=3)
def pm_global_kept_tensor(x):
    if KEPT["t"] is None:
        KEPT["t"] = torch.zeros(3, 4)
    KEPT["t"].add_(x)
    return KEPT["t"].sum()


def _closure_counter():
    state = torch.zeros(4)

    def step(x):
        state.add_(x)
        return state * 2
    return step


CLOSURE_STEP = [_closure_counter()]
RESETS.append(lambda: CLOSURE_STEP.__setitem__(0, _closure_counter()))


@case(lambda: (R(4),), calls=2)
def pm_closure_state(x):
    return CLOSURE_STEP[0](x)


# ------------------------------------------------ indexing writes
@cases(x34, nl34)
def ix_repeated_index_iadd(x, *_):
    idx = torch.tensor([0, 0, 2])
    x[idx] += 1
    return x


@cases(x34, nl34)
def ix_index_put_accumulate(x, *_):
    idx = torch.tensor([1, 1, 1])
    x.index_put_((idx,), torch.ones(3, 4), accumulate=True)
    return x


@cases(x34, nl34)
def ix_index_add_(x, *_):
    x.index_add_(0, torch.tensor([0, 2, 0]), torch.ones(3, 4))
    return x


@cases(x34, nl34)
def ix_scalar_from_other_element(x, *_):
    x[0, 0] = x[1, 1]
    return x


@cases(x34, nl34)
def ix_full_assign(x, *_):
    x[:] = 0
    x[...] = x + 1
    return x


@case(lambda: (R(3, 4), R(4)))
def ix_row_broadcast_assign(x, y):
    x[1:] = y
    return x


@cases(x34, nl34)
def ix_loop_rows(x, *_):
    for i in range(3):
        x[i].mul_(i)
    return x


@case(lambda: (I(3, 4),))
def ix_int_mask_assign(x):
    x[x < 0] = 100
    return x


@case(lambda: (R(5),))
def ix_neg_index(x):
    x[-1] = x[0]
    return x


@case(lambda: (R(3, 4),))
def ix_out_of_range_raises(x):
    x[3] = 1.0
    return x


# ------------------------------------------------ inputs inside containers
@case(lambda: ([R(3), R(3)],))
def ct_list_mutate(xs):
    xs[0].add_(1)
    return xs[1] * 2


@case(lambda: (lambda t: ([t, t],))(R(3)))
def ct_list_same_tensor(xs):
    xs[0].add_(1)
    return xs[1] * 2


@case(lambda: ({"a": R(3), "b": G(3)},))
def ct_dict_mutate(d):
    d["a"].mul_(2)
    return d["a"] * d["b"]


@case(lambda: ((R(3), R(3)),))
def ct_tuple_return_inputs(xs):
    return xs[1], xs[0]


@case(lambda: ([R(3), R(3)],))
def ct_list_append_frame_tensor(xs):
    xs.append(xs[0] + xs[1])
    return len(xs)


def _helper_mutate(t):
    t.mul_(3)
    return t


@cases(x34, nl34)
def ct_helper_mutates(x, *_):
    y = _helper_mutate(x)
    return y is x, x + 1


@cases(x34, nl34)
def ct_iadd_then_rebind(x, *_):
    x += 1
    x = x + 1
    return x


# ------------------------------------------------ out= into views of inputs
@case(lambda: (R(3, 4), R(2, 4), R(2, 4)))
def ov_into_input_view(x, a, b):
    torch.add(a, b, out=x[1:])
    return x


@case(lambda: (R(4, 3), R(3, 4)))
def ov_into_input_t(x, y):
    torch.mul(y, 2, out=x.t())
    return x


@case(lambda: (R(5),))
def ov_cumsum_into_self(x):
    torch.cumsum(x, 0, out=x)
    return x


# ------------------------------------------------ requires_grad_ / detach_ of intermediates
@case(x34)
def rg_intermediate_requires_grad(x):
    y = x * 2
    y.requires_grad_()
    return y * 3


@case(g34)
def rg_detach_inplace_intermediate(x):
    y = x * 2
    y.detach_()
    return y, x * 1


@case(g34)
def rg_requires_grad_false_on_nonleaf_raises(x):
    y = x * 2
    y.requires_grad_(False)
    return y


@case(x34)
def rg_input_requires_grad_then_mutate_raises(x):
    x.requires_grad_()
    x.add_(1)
    return x


# ------------------------------------------------ more promotion and division
@case(lambda: (I(4, dtype=torch.uint8, lo=0, hi=250), I(4, dtype=torch.int8)))
def pr_uint8_int8(a, b):
    return a + b, (a + b).dtype


@case(lambda: (I(4),))
def pr_int_mean_raises(x):
    return x.mean()


@case(lambda: (I(4),))
def pr_int_sum_dtype(x):
    return x.sum(dtype=torch.int32), x.to(torch.float16).sum()


@case(lambda: (I(4),))
def pr_int_clamp_float_bounds(x):
    return torch.clamp(x, -1.5, 2.5)


@case(lambda: (I(4), R(4)))
def pr_where_int_float(x, y):
    return torch.where(x > 0, x, y), torch.where(x > 0, x, 0.5), torch.where(x > 0, 1, 0)


@case(lambda: (R(4), torch.zeros(4)))
def pr_inplace_div_zero(x, z):
    x.div_(z)
    return x


@case(lambda: (R(4),))
def pr_float_floordiv_zero(x):
    x //= 0
    return x


@case(lambda: (R(4), torch.tensor(0.0)))
def pr_item_in_mutation(x, s):
    x.add_(s.item())
    x.mul_(x.sum().item())
    return x


@case(lambda: (torch.tensor(2.0),))
def pr_0dim_input_mutation(s):
    s.add_(1)
    return s.item(), s * 2


@case(lambda: (I(4, dtype=torch.int16),))
def pr_int16_overflow(x):
    return x * 10000, (x + 32767)


@case(lambda: (R(4, dtype=torch.float16),))
def pr_half_overflow(x):
    return x * 60000, (x * 60000).isinf().sum()


@case(lambda: (torch.tensor([-7, 7, -8]), torch.tensor([2, -2, 3])))
def pr_int_division_signs(a, b):
    return a // b, a % b, torch.div(a, b, rounding_mode="trunc"), a / b


@case(lambda: (torch.tensor([1, 2], dtype=torch.int32),))
def pr_int32_times_python_big(x):
    return x * (2 ** 40)


# ------------------------------------------------ dynamic shapes with more views and mutation
@case(lambda: NL(_n(), 3), calls=3, dynamic=True)
def dy_nonleaf_view_out(x, leaf):
    x[0].mul_(2)
    return x.t(), x[1:]


@case(lambda: (R(_n(), 4),), calls=3, dynamic=True)
def dy_mutate_half(x):
    n = x.shape[0] // 2
    x[:n].zero_()
    return x[n:]


@case(lambda: (R(_n(), 4), R(_n(), 4)), calls=3, dynamic=True)
def dy_cat_mutate(a, b):
    c = torch.cat([a, b])
    a.add_(1)
    return c, a


@case(lambda: (R(_n(), 4),), calls=3, dynamic=True)
def dy_arange_scale(x):
    return torch.arange(x.shape[0]) * x.shape[1], x.new_zeros(x.shape[0])


@case(lambda: (lambda t: (t, t.t()))(R(_n(), _n())), calls=3, dynamic=True)
def dy_aliased_t(a, b):
    a[0].fill_(1)
    return b.sum(0)


@case(lambda: (R(_n(), 4),), calls=3, dynamic=True)
def dy_empty_mutation(x):
    e = x[x.shape[0]:]
    e.add_(1)
    return e, x


# ------------------------------------------------ `.data =` (eager's shallow copy: the new storage, the old counter)
wv = lambda: (G(3, 4), R(3, 4))


@case(lambda: (G(3, 4), R(4, 4)))
def da_view_of_other_input(w, v):
    w.data = v[1:]
    return w * 2


@case(wv, ind=True)
def da_fresh_value_escapes(w, v):
    y = v * 2
    w.data = y
    return y, w + 1


@case(wv)
def da_then_other_mutated(w, v):
    w.data = v
    v.add_(1)
    return w * 1


@case(wv)
def da_then_data_write(w, v):
    w.data = v
    w.data.add_(1)
    return v.sum()


@case(wv)
def da_view_taken_before(w, v):
    u = w.detach()[0]
    w.data = v
    return u, w[0] * 1


@case(wv, calls=3, ind=True)
def da_repeated_calls(w, v):
    w.data = v
    return (w * w).sum()


@case(lambda: (G(3, 4), G(3, 4)))
def da_from_other_param(w, p):
    w.data = p.data
    return w + p


@case(lambda: (R(3, 4), R(3, 4)))
def da_plain_tensor(x, v):
    x.data = v
    x.mul_(2)
    return x


@case(lambda: (G(4), R(4)), dynamic=True, calls=2)
def da_dynamic(w, v):
    w.data = v
    return w.sum()


@case(lambda: (G(3, 4), R(3, 4)))
def da_then_set_back(w, v):
    old = w.data
    w.data = v
    w.data = old * 0 + 1
    return w * 1, v


class _SwapData(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("shadow", torch.randn(4))

    def forward(self, x):
        self.w.data = self.shadow
        return x * self.w


@case(_mod(_SwapData, 3, 4), ind=True)
def da_param_from_buffer(m, x):
    return m(x)
