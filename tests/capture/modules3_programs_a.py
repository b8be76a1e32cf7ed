"""nn.Module programs of the kind PyTorch tests Dynamo with (test_modules.py / test_hooks.py style),
part a: parametrizations, weight and spectral norm, lazy modules, state_dict between calls, buffers,
walks over a module's tree in forward, hooks. Each program takes `C` (identity for eager,
kiln.compile for the compiled run) and returns what is compared: outputs, gradients, the module's
state after the calls. tests/capture/test_modules3_programs.py runs them.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize


def d(t: Any) -> Any:
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def X(*s: int) -> torch.Tensor:
    return torch.randn(*s)


def G(m: nn.Module) -> list:
    """Each parameter's gradient (None where it has none), in the module's order."""
    return [None if p.grad is None else d(p.grad) for p in m.parameters()]


def step(cm: Any, m: nn.Module, *args: Any, **kwargs: Any) -> list:
    """One call, its backward, and what it leaves: the output and every parameter's gradient."""
    m.zero_grad(set_to_none=True)
    y = cm(*args, **kwargs)
    first = y if isinstance(y, torch.Tensor) else y[0]
    # weighted, not a plain sum of squares: after a normalization that sum is a constant whose
    # gradients are rounding noise
    first.pow(2).mul(torch.arange(first.numel()).reshape(first.shape).sin() + 1.5).sum().backward()
    return [d(y) if isinstance(y, torch.Tensor) else [d(t) for t in y], G(m)]


# ------------------------------------------------------------------ parametrize
class Symmetric(nn.Module):
    def forward(s, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


class Scale(nn.Module):
    def __init__(s, k: float = 2.0):
        super().__init__(); s.k = k

    def forward(s, X):
        return X * s.k

    def right_inverse(s, A):
        return A / s.k


def param_symmetric(C):
    m = nn.Linear(4, 4); parametrize.register_parametrization(m, "weight", Symmetric()); cm = C(m)
    return step(cm, m, X(3, 4)) + step(cm, m, X(3, 4))


def param_stacked_two(C):
    m = nn.Linear(4, 4)
    parametrize.register_parametrization(m, "weight", Symmetric())
    parametrize.register_parametrization(m, "weight", Scale(3.0)); cm = C(m)
    return step(cm, m, X(2, 4)) + [d(m.weight)]


def param_on_bias(C):
    m = nn.Linear(4, 3); parametrize.register_parametrization(m, "bias", Scale(0.5)); cm = C(m)
    return step(cm, m, X(2, 4)) + step(cm, m, X(5, 4))


def param_right_inverse_assign_between(C):
    m = nn.Linear(3, 3); parametrize.register_parametrization(m, "weight", Scale(2.0)); cm = C(m)
    out = step(cm, m, X(2, 3))
    with torch.no_grad():
        m.weight = torch.eye(3)  # right_inverse stores eye / 2 in original
    return out + step(cm, m, X(2, 3)) + [d(m.parametrizations.weight.original)]


def param_removed_between(C):
    m = nn.Linear(3, 3); parametrize.register_parametrization(m, "weight", Scale(2.0)); cm = C(m)
    out = step(cm, m, X(2, 3))
    parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    return out + step(cm, m, X(2, 3)) + [parametrize.is_parametrized(m)]


def param_added_between(C):
    m = nn.Linear(3, 3); cm = C(m)
    out = step(cm, m, X(2, 3))
    parametrize.register_parametrization(m, "weight", Symmetric())
    return out + step(cm, m, X(2, 3))


def param_cached(C):
    m = nn.Linear(4, 4); parametrize.register_parametrization(m, "weight", Symmetric())

    def f(x):
        with parametrize.cached():
            return m(x) + m(x * 2)
    cf = C(f); x = X(2, 4)
    y = cf(x); y.sum().backward()
    return [d(y), G(m)]


def param_cached_outside(C):
    m = nn.Linear(4, 4); parametrize.register_parametrization(m, "weight", Symmetric()); cm = C(m)
    with parametrize.cached():
        a = cm(X(2, 4)); b = cm(X(2, 4))
    (a + b).sum().backward()
    return [d(a), d(b), G(m)]


def param_orthogonal(C):
    m = nn.utils.parametrizations.orthogonal(nn.Linear(4, 4)); cm = C(m)
    return step(cm, m, X(3, 4)) + [d(m.weight @ m.weight.T)]


def param_orthogonal_householder(C):
    m = nn.utils.parametrizations.orthogonal(nn.Linear(5, 3), orthogonal_map="householder"); cm = C(m)
    return step(cm, m, X(2, 5))


def param_in_sequential(C):
    inner = nn.Linear(4, 4); parametrize.register_parametrization(inner, "weight", Symmetric())
    m = nn.Sequential(inner, nn.ReLU(), nn.Linear(4, 2)); cm = C(m)
    return step(cm, m, X(3, 4)) + step(cm, m, X(3, 4))


def param_read_weight_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4)
            parametrize.register_parametrization(s.l, "weight", Scale(2.0))

        def forward(s, x):
            return x @ s.l.weight.T + s.l.weight.sum()
    m = M(); cm = C(m)
    return step(cm, m, X(2, 4))


def param_under_no_grad(C):
    m = nn.Linear(4, 4); parametrize.register_parametrization(m, "weight", Symmetric()); cm = C(m)
    with torch.no_grad():
        y = cm(X(2, 4))
    return [d(y), y.requires_grad]


PARAMETRIZE = [param_symmetric, param_stacked_two, param_on_bias, param_right_inverse_assign_between,
               param_removed_between, param_added_between, param_cached, param_cached_outside, param_orthogonal,
               param_orthogonal_householder, param_in_sequential, param_read_weight_in_forward, param_under_no_grad]


# ------------------------------------------------------------------ weight norm / spectral norm
def weight_norm_old(C):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.utils.weight_norm(nn.Linear(4, 3))
    cm = C(m)
    return step(cm, m, X(2, 4)) + step(cm, m, X(2, 4))


def weight_norm_param(C):
    m = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)); cm = C(m)
    return step(cm, m, X(2, 4)) + step(cm, m, X(2, 4))


def weight_norm_conv_dim1(C):
    m = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 3, 3), dim=1); cm = C(m)
    return step(cm, m, X(2, 2, 6))


def spectral_norm_old_train(C):
    torch.manual_seed(1)
    m = nn.utils.spectral_norm(nn.Linear(4, 3)); cm = C(m); out = []
    for _ in range(3):
        out += step(cm, m, X(2, 4)) + [d(m.weight_u), d(m.weight_v)]
    return out


def spectral_norm_old_eval(C):
    torch.manual_seed(1)
    m = nn.utils.spectral_norm(nn.Linear(4, 3)); m(X(1, 4)); m.eval(); cm = C(m)
    return step(cm, m, X(2, 4)) + [d(m.weight_u)]


def spectral_norm_param_train(C):
    torch.manual_seed(1)
    m = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3)); cm = C(m); out = []
    for _ in range(3):
        out += step(cm, m, X(2, 4)) + [d(m.parametrizations.weight[0]._u)]
    return out


def spectral_norm_param_eval_switch(C):
    torch.manual_seed(1)
    m = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3), n_power_iterations=2); cm = C(m)
    out = step(cm, m, X(2, 4))
    m.eval()
    return out + step(cm, m, X(2, 4)) + [d(m.parametrizations.weight[0]._v)]


def weight_norm_removed_between(C):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.utils.weight_norm(nn.Linear(4, 3))
    cm = C(m); out = step(cm, m, X(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nn.utils.remove_weight_norm(m)
    return out + step(cm, m, X(2, 4))


NORMS = [weight_norm_old, weight_norm_param, weight_norm_conv_dim1, spectral_norm_old_train, spectral_norm_old_eval,
         spectral_norm_param_train, spectral_norm_param_eval_switch, weight_norm_removed_between]


# ------------------------------------------------------------------ lazy modules
def lazy_linear_first_call(C):
    torch.manual_seed(2)
    m = nn.LazyLinear(3); cm = C(m)
    return step(cm, m, X(2, 5)) + step(cm, m, X(4, 5)) + [type(m).__name__, tuple(m.weight.shape)]


def lazy_conv2d_first_call(C):
    torch.manual_seed(2)
    m = nn.LazyConv2d(4, 3); cm = C(m)
    return step(cm, m, X(1, 2, 6, 6)) + [type(m).__name__]


def lazy_in_sequential(C):
    torch.manual_seed(2)
    m = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2)); cm = C(m)
    return step(cm, m, X(3, 6)) + step(cm, m, X(3, 6)) + [[type(l).__name__ for l in m]]


def lazy_batchnorm(C):
    torch.manual_seed(2)
    m = nn.LazyBatchNorm1d(); cm = C(m); out = step(cm, m, X(5, 3))
    return out + [d(m.running_mean), int(m.num_batches_tracked)]


def lazy_submodule_in_forward(C):
    torch.manual_seed(2)

    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.LazyLinear(4); s.b = nn.Linear(4, 2)

        def forward(s, x):
            return s.b(s.a(x).relu())
    m = M(); cm = C(m)
    return step(cm, m, X(2, 7)) + step(cm, m, X(3, 7))


def lazy_under_no_grad(C):
    torch.manual_seed(2)
    m = nn.LazyLinear(3); cm = C(m)
    with torch.no_grad():
        a = cm(X(2, 4))
    b = cm(X(2, 4))
    return [d(a), d(b), a.requires_grad, b.requires_grad]


LAZY = [lazy_linear_first_call, lazy_conv2d_first_call, lazy_in_sequential, lazy_batchnorm, lazy_submodule_in_forward,
        lazy_under_no_grad]


# ------------------------------------------------------------------ state_dict / load_state_dict between calls
def load_state_dict_between(C):
    m = nn.Linear(4, 3); cm = C(m); x = X(2, 4)
    out = step(cm, m, x)
    m.load_state_dict({"weight": torch.ones(3, 4), "bias": torch.zeros(3)})
    return out + step(cm, m, x)


def load_state_dict_buffers_between(C):
    m = nn.BatchNorm1d(3); m.eval(); cm = C(m); x = X(4, 3)
    out = [d(cm(x))]
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["running_mean"] += 1.0; sd["running_var"] *= 4.0
    m.load_state_dict(sd)
    return out + [d(cm(x)), d(m.running_mean)]


def load_state_dict_non_strict(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)); cm = C(m); x = X(2, 4)
    out = step(cm, m, x)
    res = m.load_state_dict({"1.bias": torch.full((2,), 3.0)}, strict=False)
    return out + step(cm, m, x) + [sorted(res.missing_keys)]


def state_dict_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3); s.register_buffer("b", torch.ones(3))

        def forward(s, x):
            sd = s.state_dict()
            return x * sd["b"] + sd["l.weight"].sum(), sorted(sd)
    m = M(); cm = C(m)
    return [cm(X(2, 3)), cm(X(2, 3))]


def load_other_module_state(C):
    a, b = nn.Linear(3, 3), nn.Linear(3, 3); cm = C(a); x = X(2, 3)
    out = step(cm, a, x)
    a.load_state_dict(b.state_dict())
    return out + step(cm, a, x) + [d(a.weight)]


def copy_into_params_between(C):
    m = nn.Linear(3, 2); cm = C(m); x = X(4, 3)
    out = step(cm, m, x)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(-1)
    return out + step(cm, m, x)


STATE = [load_state_dict_between, load_state_dict_buffers_between, load_state_dict_non_strict, state_dict_in_forward,
         load_other_module_state, copy_into_params_between]


# ------------------------------------------------------------------ buffers
class _Buffered(nn.Module):
    def __init__(s, persistent: bool = True):
        super().__init__(); s.l = nn.Linear(3, 3)
        s.register_buffer("scale", torch.full((3,), 2.0), persistent=persistent)

    def forward(s, x):
        return s.l(x) * s.scale


def buffer_non_persistent(C):
    m = _Buffered(persistent=False); cm = C(m)
    return step(cm, m, X(2, 3)) + [sorted(m.state_dict()), sorted(dict(m.named_buffers()))]


def buffer_replaced_same_shape(C):
    m = _Buffered(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.scale = torch.full((3,), -1.0)
    return out + step(cm, m, x)


def buffer_replaced_other_shape(C):
    m = _Buffered(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.scale = torch.tensor(5.0)
    return out + step(cm, m, x)


def buffer_set_to_none(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.register_buffer("shift", torch.ones(3))

        def forward(s, x):
            return x * 2 if s.shift is None else x + s.shift
    m = M(); cm = C(m); x = X(2, 3)
    a = cm(x); m.shift = None; b = cm(x)
    return [d(a), d(b), list(m._buffers)]


def buffer_mutated_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.register_buffer("count", torch.zeros(())); s.register_buffer("acc", torch.zeros(3), persistent=False)

        def forward(s, x):
            s.count += 1
            s.acc.add_(x.sum(0))
            return x * s.count
    m = M(); cm = C(m)
    out = [d(cm(X(2, 3))) for _ in range(3)]
    return out + [d(m.count), d(m.acc), m.count._version > 0]


def buffer_registered_in_forward(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "seen"):
                s.register_buffer("seen", torch.zeros(3), persistent=False)
            s.seen = s.seen + x.sum(0)
            return x + s.seen
    m = M(); cm = C(m)
    out = [d(cm(X(2, 3))) for _ in range(3)]
    return out + [d(m.seen), sorted(m.state_dict())]


def buffer_dtype_changed_between(C):
    m = _Buffered(); cm = C(m); x = X(2, 3)
    out = [d(cm(x))]
    m.double()
    return out + [d(cm(x.double())), m.scale.dtype]


def buffer_reassigned_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.register_buffer("ema", torch.zeros(3))

        def forward(s, x):
            s.ema = 0.9 * s.ema + 0.1 * x.mean(0)
            return x - s.ema
    m = M(); cm = C(m)
    out = [d(cm(X(4, 3))) for _ in range(3)]
    return out + [d(m.ema), "ema" in m._buffers]


BUFFERS = [buffer_non_persistent, buffer_replaced_same_shape, buffer_replaced_other_shape, buffer_set_to_none,
           buffer_mutated_in_forward, buffer_registered_in_forward, buffer_dtype_changed_between, buffer_reassigned_in_forward]


# ------------------------------------------------------------------ walks over the tree in forward
class _Tree(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(3, 3); s.b = nn.Sequential(nn.Linear(3, 3), nn.Tanh()); s.register_buffer("k", torch.ones(3))


def walk_named_parameters(C):
    class M(_Tree):
        def forward(s, x):
            for name, p in s.named_parameters():
                x = x + p.sum() * (2 if "bias" in name else 1)
            return x
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3))


def walk_named_modules(C):
    class M(_Tree):
        def forward(s, x):
            for name, mod in s.named_modules():
                if isinstance(mod, nn.Linear):
                    x = mod(x)
            return x, [n for n, _ in s.named_modules()]
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def walk_children(C):
    class M(_Tree):
        def forward(s, x):
            for c in s.children():
                x = c(x)
            return x
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def walk_apply_in_forward(C):
    class M(_Tree):
        def forward(s, x):
            seen = []
            s.apply(lambda mod: seen.append(type(mod).__name__))
            return s.b(s.a(x)), seen
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def walk_apply_init_between(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)

    def init(mod):
        if isinstance(mod, nn.Linear):
            nn.init.constant_(mod.weight, 0.1); nn.init.zeros_(mod.bias)
    m.apply(init)
    return out + step(cm, m, x)


def walk_buffers_and_parameters_count(C):
    class M(_Tree):
        def forward(s, x):
            n = sum(p.numel() for p in s.parameters())
            return s.b(x) * n + sum(b.sum() for b in s.buffers()), len(list(s.modules()))
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def walk_named_buffers_recurse_false(C):
    class M(_Tree):
        def forward(s, x):
            return x * sum(b.sum() for _, b in s.named_buffers(recurse=False)) + s.a(x)
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def walk_parameters_l2_penalty(C):
    class M(_Tree):
        def forward(s, x):
            y = s.b(s.a(x))
            reg = sum((p ** 2).sum() for p in s.parameters() if p.requires_grad)
            return y.sum() + 0.01 * reg
    m = M(); m.a.bias.requires_grad_(False); cm = C(m)
    return step(cm, m, X(2, 3))


WALKS = [walk_named_parameters, walk_named_modules, walk_children, walk_apply_in_forward, walk_apply_init_between,
         walk_buffers_and_parameters_count, walk_named_buffers_recurse_false, walk_parameters_l2_penalty]


# ------------------------------------------------------------------ hooks
def hook_pre_with_kwargs(C):
    m = nn.Linear(3, 3)

    def pre(mod, args, kwargs):
        return (args[0] * 2,), kwargs
    m.register_forward_pre_hook(pre, with_kwargs=True); cm = C(m)
    return step(cm, m, X(2, 3))


def hook_pre_kwargs_modified(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x, scale=1.0):
            return s.l(x) * scale
    m = M()
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {**kwargs, "scale": 3.0}), with_kwargs=True); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3), scale=5.0)


def hook_forward_with_kwargs(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x, bias=0.0):
            return s.l(x) + bias
    m = M()
    m.register_forward_hook(lambda mod, args, kwargs, out: out * kwargs.get("bias", 1.0), with_kwargs=True); cm = C(m)
    return step(cm, m, X(2, 3), bias=2.0)


def hook_forward_returns_tuple_changed(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            y = s.l(x)
            return y, y.sum()
    m = M()
    m.register_forward_hook(lambda mod, args, out: (out[0].relu(), out[1] * 2)); cm = C(m)
    return step(cm, m, X(2, 3))


def hook_forward_returns_none(C):
    m = nn.Linear(3, 3); calls = []
    m.register_forward_hook(lambda mod, args, out: calls.append(out.shape)); cm = C(m)
    return step(cm, m, X(2, 3)) + [calls]


def hook_pre_returns_single(C):
    m = nn.Linear(3, 3)
    m.register_forward_pre_hook(lambda mod, args: args[0] + 1); cm = C(m)
    return step(cm, m, X(2, 3))


def hook_always_call_on_raise(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            if x.shape[0] == 3:
                raise ValueError("three rows")
            return s.l(x)
    m = M(); log = []
    m.register_forward_hook(lambda mod, args, out: log.append("always"), always_call=True)
    m.register_forward_hook(lambda mod, args, out: log.append("plain"))
    cm = C(m); out = []
    for rows in (2, 3, 2):
        try:
            out.append(d(cm(X(rows, 3))))
        except ValueError as e:
            out.append(str(e))
    return out + [log]


def hook_added_between_calls(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    h = m.register_forward_hook(lambda mod, args, out: out * 10)
    out += step(cm, m, x)
    h.remove()
    return out + step(cm, m, x)


def hook_pre_added_between_on_child(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m[2].register_forward_pre_hook(lambda mod, args: (args[0] * -1,))
    return out + step(cm, m, x)


def hook_global_forward(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh()); cm = C(m); seen = []
    h = nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        out = step(cm, m, X(2, 3))
    finally:
        h.remove()
    return out + step(cm, m, X(2, 3)) + [seen]


def hook_global_pre_modifies(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    h = nn.modules.module.register_module_forward_pre_hook(lambda mod, args: (args[0] * 0.5,))
    try:
        out += step(cm, m, x)
    finally:
        h.remove()
    return out + step(cm, m, x)


def hook_stateful_counter(C):
    m = nn.Linear(3, 3); state = {"n": 0}

    def hook(mod, args, out):
        state["n"] += 1
        return out + state["n"]
    m.register_forward_hook(hook); cm = C(m)
    out = [d(cm(X(2, 3))) for _ in range(3)]
    return out + [state["n"]]


def hook_prepend(C):
    m = nn.Linear(3, 3); order = []
    m.register_forward_hook(lambda mod, a, o: order.append("second") or o * 2)
    m.register_forward_hook(lambda mod, a, o: order.append("first") or o + 1, prepend=True)
    cm = C(m)
    return step(cm, m, X(2, 3)) + [order]


def hook_full_backward(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh()); grads = []
    m[0].register_full_backward_hook(lambda mod, gin, gout: grads.append(d(gout[0])))
    cm = C(m)
    return step(cm, m, X(2, 3)) + [grads]


def hook_backward_pre_scales(C):
    m = nn.Linear(3, 3)
    m.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 3,))
    cm = C(m)
    return step(cm, m, X(2, 3).requires_grad_())


def hook_on_submodule_reads_parent_state(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3); s.factor = 2.0
            s.l.register_forward_hook(lambda mod, a, o: o * s.factor)

        def forward(s, x):
            return s.l(x).sum(1)
    m = M(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.factor = 5.0
    return out + step(cm, m, x)


def hook_state_dict_hooks_untouched(C):
    m = nn.Linear(3, 3); seen = []
    m._register_state_dict_hook(lambda mod, sd, prefix, local: seen.append(prefix))
    cm = C(m)
    return step(cm, m, X(2, 3)) + [sorted(m.state_dict()), seen]


HOOKS = [hook_pre_with_kwargs, hook_pre_kwargs_modified, hook_forward_with_kwargs, hook_forward_returns_tuple_changed,
         hook_forward_returns_none, hook_pre_returns_single, hook_always_call_on_raise, hook_added_between_calls,
         hook_pre_added_between_on_child, hook_global_forward, hook_global_pre_modifies, hook_stateful_counter,
         hook_prepend, hook_full_backward, hook_backward_pre_scales, hook_on_submodule_reads_parent_state,
         hook_state_dict_hooks_untouched]

PROGRAMS_A = PARAMETRIZE + NORMS + LAZY + STATE + BUFFERS + WALKS + HOOKS
