"""nn.Module programs for tests/capture/test_dynmodules_programs.py (part b): each is
`program(C) -> observations`, C compiling a module or function (identity for the eager run); the
model is changed between calls (values, parameters, hooks, containers, train/eval) and the
observations are the values returned, gradients, and the state the calls left.
"""
# ruff: noqa: E701, E702
from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import functools
import gc

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize


def d(t):
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def X(*s):
    return torch.randn(*s)


class IntAttr(nn.Module):
    def __init__(s):
        super().__init__(); s.n = 2; s.scale = 0.5; s.sizes = [2, 6]; s.cfg = {"act": "relu", "k": 1.5}
    def forward(s, x):
        y = x.view(s.n, -1) * s.scale
        y = y.reshape(*s.sizes) if y.numel() == s.sizes[0] * s.sizes[1] else y
        y = getattr(F, s.cfg["act"])(y) * s.cfg["k"]
        return y


def int_float_list_dict_attrs_changed(C):
    m = IntAttr(); cm = C(m); x = X(12)
    out = [d(cm(x))]
    m.n = 3; out.append(d(cm(x)))
    m.scale = 2.0; out.append(d(cm(x)))
    m.sizes[0] = 3; m.sizes[1] = 4; out.append(d(cm(x)))
    m.sizes.append(1); out.append(d(cm(x)))
    m.cfg["act"] = "tanh"; out.append(d(cm(x)))
    m.cfg["k"] = -1.0; out.append(d(cm(x)))
    m.n = 4; out.append(d(cm(x)))
    m.scale = 3.0; out.append(d(cm(x)))
    return out


class TensorAttrInplace(nn.Module):
    def __init__(s):
        super().__init__(); s.acc = torch.zeros(4); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        s.acc.add_(x.sum(0))
        return s.lin(x) + s.acc


def tensor_attr_inplace_in_forward(C):
    m = TensorAttrInplace(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    m.acc = torch.ones(4); out.append(d(cm(x)))
    return out + [d(m.acc)]


class BreakState(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.n = 0; s.hist = []
    def forward(s, x):
        s.n += 1
        y = s.lin(x)
        print("", end="")
        s.hist.append(s.n)
        s.last = y
        return y * s.n


def state_across_graph_break(C):
    m = BreakState(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [m.n, m.hist, d(m.last)]


class RaiseAfterMutate(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.n = 0; s.register_buffer("b", torch.zeros(4))
    def forward(s, x):
        s.n += 1
        s.b.add_(1)
        if s.n == 2:
            raise RuntimeError("second")
        return s.lin(x) + s.b


def exception_after_mutation(C):
    m = RaiseAfterMutate(); cm = C(m); x = X(2, 4)
    out = []
    for _ in range(3):
        try: out.append(d(cm(x)))
        except RuntimeError as e: out.append(str(e))
    return out + [m.n, d(m.b)]


def hook_bound_method_state(C):
    class Scaler:
        def __init__(self): self.k = 1.0
        def hook(self, mod, args, out): return out * self.k
    sc = Scaler(); m = nn.Linear(4, 4); m.register_forward_hook(sc.hook)
    def f(x): return m(x) + 1
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]; sc.k = 3.0; out.append(d(cf(x)))
    return out


def hook_closure_cell_changed(C):
    k = [1.0]
    m = nn.Linear(4, 4)
    scale = 1.0
    def hook(mod, args, out): return out * scale
    m.register_forward_hook(hook)
    def f(x): return m(x)
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    scale = 4.0
    out.append(d(cf(x)))
    return out


def param_replaced_by_tensor(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    w = m.weight.detach().clone()
    del m.weight
    m.weight = w * 2
    out.append(d(cm(x)))
    m.weight = w * 3
    out.append(d(cm(x)))
    return out


def same_param_two_compiled(C):
    shared = nn.Linear(4, 4)
    a = nn.Sequential(shared, nn.ReLU()); b = nn.Sequential(nn.Tanh(), shared)
    ca, cb = C(a), C(b); x = X(2, 4)
    out = [d(ca(x)), d(cb(x))]
    with torch.no_grad(): shared.weight.fill_(0.3)
    out += [d(ca(x)), d(cb(x))]
    (ca(x).sum() + cb(x).sum()).backward()
    return out + [d(shared.weight.grad)]


def moduledict_keys_values_len(C):
    md = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
    def f(x, k):
        ys = [md[k](x)]
        ks = list(md.keys())
        for v in md.values(): ys.append(v(x))
        return sum(ys) + len(ks) + ks.index(k)
    cf = C(f); x = X(2, 4)
    out = [d(cf(x, "a")), d(cf(x, "b"))]
    md.update({"c": nn.Identity()})
    out.append(d(cf(x, "c")))
    md.pop("a"); out.append(d(cf(x, "b")))
    return out


def sequential_getitem_negative_and_len(C):
    s = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
    def f(x):
        for i in range(-1, -len(s) - 1, -1): x = s[i](x)
        return x, s[::2](x), s[1:-1][0](x)
    cf = C(f); x = X(2, 4)
    out = [tuple(map(d, cf(x)))]
    del s[0]; out.append(tuple(map(d, cf(x))))
    return out


def named_children_order_changed(C):
    m = nn.Module(); m.a = nn.Linear(4, 4); m.b = nn.ReLU()
    def f(x):
        for n, c in m.named_children(): x = c(x) + len(n)
        return x
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    del m.a; m.a = nn.Linear(4, 4)  # order becomes b, a
    out.append(d(cf(x)))
    return out


def lazy_linear(C):
    m = nn.Sequential(nn.LazyLinear(3), nn.ReLU(), nn.LazyLinear(2)); cm = C(m); x = X(2, 4)
    torch.manual_seed(1)
    a = cm(x); a.sum().backward()
    return [d(a), d(cm(x)), type(m[0]).__name__, d(m[0].weight.grad)]


class CallFwdDirect(nn.Module):
    def __init__(s):
        super().__init__(); s.layer = nn.Linear(4, 4)
        s.layer.register_forward_hook(lambda m, a, o: o * 100)
    def forward(s, x): return s.layer.forward(x) + s.layer(x)


def call_forward_directly_skips_hooks(C):
    m = CallFwdDirect(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x))]


class Cmp(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4); s.c = s.a
    def forward(s, x):
        r = x
        if s.a is s.c: r = r + 1
        if s.a == s.b: r = r + 100
        if s.a != s.b: r = r + 10
        return r


def module_comparison(C):
    m = Cmp(); cm = C(m); x = X(2)
    out = [d(cm(x))]; m.c = m.b; out.append(d(cm(x))); m.b = m.a; out.append(d(cm(x)))
    return out


class CustomIter(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(4, 4); s.l2 = nn.Linear(4, 4)
    def __iter__(s): return iter([s.l2, s.l1])
    def forward(s, x):
        for l in s: x = l(x)
        return x


def custom_iter_module(C):
    m = CustomIter(); cm = C(m); x = X(2, 4)
    return [d(cm(x))]


class AttrPrecedence(nn.Module):
    def __init__(s):
        super().__init__(); s.activation = nn.ReLU(); s.linear = nn.Linear(4, 4); s.initializer = torch.ones([4, 4])
    def activation(s, x): return x * 1.2  # shadowed by submodule
    def initializer(s): return torch.zeros([4, 4])
    def forward(s, x): return s.activation(s.linear(s.initializer + x))


def attribute_precedence(C):
    m = AttrPrecedence(); cm = C(m); x = X(4, 4)
    return [d(cm(x))]


class ParamsMod(nn.Module):
    def __init__(s):
        super().__init__()
        s.scale = nn.Parameter(torch.randn(1, 4)); s.scale2 = nn.Parameter(torch.randn(1, 4))
    def forward(s, x):
        params = list(s.parameters())
        tot = sum(p.sum() for p in params)
        return x * params[0] + params[-1] * tot + len(params)


def parameters_list_in_forward(C):
    m = ParamsMod(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.scale3 = nn.Parameter(torch.ones(1, 4)); out.append(d(cm(x)))
    y = cm(x); y.sum().backward(); out.append(d(m.scale3.grad))
    return out


class SuperParent(nn.Module):
    def __init__(s):
        super().__init__(); s.k = 2
    def forward(s, x): return x * s.k


class Mixin:
    def forward(s, x): return super().forward(x) + 1


class Child(Mixin, SuperParent):
    def forward(s, x): return super().forward(x) * 3


def mro_mixin_super(C):
    m = Child(); cm = C(m); x = X(3)
    out = [d(cm(x))]; m.k = 4; out.append(d(cm(x)))
    return out


class NoInitCall(nn.Module):
    def __init__(s):
        super().__init__(); s.p = nn.Parameter(torch.ones(3))
    def forward(s, x):
        return x * s.p + s._parameters["p"] + s.__dict__.get("missing", 0)


def direct_parameters_dict_access(C):
    m = NoInitCall(); cm = C(m); x = X(3)
    out = [d(cm(x))]
    m._parameters["p"] = nn.Parameter(torch.full((3,), 2.))
    out.append(d(cm(x)))
    m.__dict__["missing"] = 7
    out.append(d(cm(x)))
    return out


def bn_eval_num_batches_unchanged(C):
    m = nn.BatchNorm1d(3).eval(); cm = C(m); x = X(4, 3)
    out = [d(cm(x)), m.num_batches_tracked.item()]
    m.train(); out += [d(cm(x)), m.num_batches_tracked.item(), d(m.running_mean)]
    m.track_running_stats = False; out += [d(cm(x)), m.num_batches_tracked.item()]
    return out


def train_step_compiled_fn(C):
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    def step(x, t):
        opt.zero_grad(); l = F.mse_loss(m(x), t); l.backward(); opt.step(); return l
    cs = C(step); x = X(5, 4); t = X(5, 1)
    return [d(cs(x, t)) for _ in range(4)] + [d(p) for p in m.parameters()]


def swap_params_between(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x): return s.b(s.a(x).relu())
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.a.weight, m.b.weight = m.b.weight, m.a.weight
    out.append(d(cm(x)))
    m.b.weight = m.a.weight
    out.append(d(cm(x)))
    y = cm(x); y.sum().backward(); out.append(d(m.a.weight.grad))
    return out


def bias_removed_between(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.bias = None; out.append(d(cm(x)))
    m.bias = nn.Parameter(torch.ones(4)); out.append(d(cm(x)))
    return out


def tensor_attr_requires_grad(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.w = torch.randn(4, requires_grad=True)
        def forward(s, x): return (x * s.w).sum()
    m = M(); cm = C(m); x = X(4)
    l = cm(x); l.backward(); g1 = d(m.w.grad)
    m.w = torch.randn(4)
    l2 = cm(x)
    m.w = torch.randn(4, requires_grad=True)
    l3 = cm(x); l3.backward()
    return [d(l), g1, d(l2), l2.requires_grad, d(l3), d(m.w.grad)]


def tensor_attr_view_of_base(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.base = torch.zeros(8); s.view = s.base[2:6]
        def forward(s, x): return x + s.view
    m = M(); cm = C(m); x = X(4)
    out = [d(cm(x))]
    m.base.add_(torch.arange(8.)); out.append(d(cm(x)))
    m.view = m.base[4:]; out.append(d(cm(x)))
    return out


def parametrize_assign_weight(C):
    class Sym(nn.Module):
        def forward(s, X): return X.triu() + X.triu(1).transpose(-1, -2)
        def right_inverse(s, A): return A.triu()
    m = nn.Linear(4, 4); parametrize.register_parametrization(m, "weight", Sym())
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    with torch.no_grad(): m.weight = torch.eye(4) * 3
    out.append(d(cm(x)))
    return out


def parametrize_chain_two(C):
    class Scale(nn.Module):
        def __init__(s): super().__init__(); s.k = 2.0
        def forward(s, X): return X * s.k
    m = nn.Linear(4, 4); sc = Scale()
    parametrize.register_parametrization(m, "weight", sc)
    parametrize.register_parametrization(m, "weight", nn.Tanh())
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    sc.k = 5.0; out.append(d(cm(x)))
    return out


def hook_removes_itself(C):
    m = nn.Linear(4, 4); cnt = [0]; handle = [None]
    def hook(mod, a, o):
        cnt[0] += 1
        handle[0].remove()
        return o * 5
    handle[0] = m.register_forward_hook(hook)
    def f(x): return m(x)
    cf = C(f); x = X(2, 4)
    return [d(cf(x)), d(cf(x)), cnt[0]]


def hook_on_child_installs_in_parent_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4); s.installed = False
        def forward(s, x):
            if not s.installed:
                s.l.register_forward_hook(lambda mod, a, o: o + 1)
                s.installed = True
            return s.l(x)
    m = M(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x)), len(m.l._forward_hooks)]


def forward_with_break_and_hooks(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4)
        def forward(s, x):
            y = s.l(x)
            print("", end="")
            return y * 2
    m = M(); order = []
    m.register_forward_pre_hook(lambda mod, a: (order.append("pre"), (a[0] + 1,))[1])
    m.register_forward_hook(lambda mod, a, o: (order.append("post"), o - 3)[1])
    def f(x): return m(x).sum()
    cf = C(f); x = X(2, 4)
    return [d(cf(x)), d(cf(x)), order]


def always_call_hook_fn_raises(C):
    class Boom(nn.Module):
        def forward(s, x):
            if x.shape[0] == 3: raise ValueError("boom")
            return x * 2
    m = Boom(); seen = []
    m.register_forward_hook(lambda mod, a, o: seen.append(o is None), always_call=True)
    def f(x): return m(x)
    cf = C(f)
    out = [d(cf(torch.ones(2)))]
    try: cf(torch.ones(3))
    except ValueError as e: out.append(str(e))
    return out + [seen]


class K(nn.Module):
    def __init__(s, k):
        super().__init__(); s.k = k; s.t = torch.full((2,), float(k))
    def forward(s, x): return x * s.k + s.t


def id_reuse_global(C):
    global GK
    GK = K(1)
    def f(x): return GK(x)
    cf = C(f); x = X(2)
    out = []
    for k in range(2, 8):
        out.append(d(cf(x)))
        del GK; gc.collect()
        GK = K(k)
    return out


def id_reuse_arg(C):
    def f(m, x): return m(x) * m.k
    cf = C(f); x = X(2)
    out = []
    for k in range(1, 7):
        m = K(k); out.append(d(cf(m, x))); del m; gc.collect()
    return out


def id_reuse_submodule_replaced(C):
    class P(nn.Module):
        def __init__(s):
            super().__init__(); s.sub = K(1)
        def forward(s, x): return s.sub(x)
    p = P(); cp = C(p); x = X(2)
    out = []
    for k in range(2, 7):
        out.append(d(cp(x)))
        p.sub = None; gc.collect(); p.sub = K(k)
    return out


def id_reuse_param_replaced(C):
    m = nn.Linear(2, 2); cm = C(m); x = X(2)
    out = []
    for k in range(2, 6):
        out.append(d(cm(x)))
        m.weight = None; gc.collect(); m.weight = nn.Parameter(torch.full((2, 2), float(k)))
    return out


def bwd_hook_called_twice_in_fn(C):
    m = nn.Linear(4, 4); log = []
    m.register_full_backward_hook(lambda mod, gi, go: log.append((d(gi[0]), d(go[0]))))
    def f(x): return (m(x) * 2 + m(x * 3)).sum()
    cf = C(f); x = X(2, 4).requires_grad_()
    l = cf(x); l.backward()
    return [d(l), len(log), log, d(x.grad), d(m.weight.grad)]


def param_hook_registered_between(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    cm(x).sum().backward(); g1 = d(m.weight.grad); m.zero_grad()
    h = m.weight.register_hook(lambda g: g * 3)
    cm(x).sum().backward(); g2 = d(m.weight.grad); m.zero_grad()
    h.remove()
    cm(x).sum().backward(); g3 = d(m.weight.grad)
    return [g1, g2, g3]


def grad_of_param_read_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4)
        def forward(s, x):
            g = s.l.weight.grad
            y = s.l(x)
            return y if g is None else y + g.sum()
    m = M(); cm = C(m); x = X(2, 4)
    out = []
    for _ in range(3):
        y = cm(x); y.sum().backward(); out.append(d(y))
    m.zero_grad(set_to_none=True); out.append(d(cm(x)))
    return out


def requires_grad_false_param_inplace_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4); s.stat = nn.Parameter(torch.zeros(4), requires_grad=False)
        def forward(s, x):
            s.stat.add_(x.mean(0).detach())
            return s.l(x) + s.stat
    m = M(); cm = C(m); x = X(2, 4)
    out = []
    for _ in range(2):
        y = cm(x); y.sum().backward(); out.append(d(y))
    return out + [d(m.stat), d(m.l.weight.grad)]


def plain_list_of_modules(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.plain = [nn.Linear(4, 4), nn.ReLU()]; s.tup = (nn.Tanh(), nn.Sigmoid())
        def forward(s, x):
            for l in s.plain: x = l(x)
            for l in s.tup: x = l(x)
            return x
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.plain.append(nn.Linear(4, 2)); out.append(d(cm(x)))
    m.plain[0] = nn.Identity(); out.append(d(cm(x)))
    m.tup = (nn.Identity(),); out.append(d(cm(x)))
    return out


def explicit_call_forms(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4)
            s.l.register_forward_hook(lambda mod, a, o: o + 100)
        def forward(s, x):
            a = nn.Module.__call__(s.l, x)
            b = s.l._call_impl(x)
            c = type(s.l).forward(s.l, x)
            e = s.l._wrapped_call_impl(x)
            return a, b, c, e, type(s).__name__, s.__class__.__name__
    m = M(); cm = C(m); x = X(2, 4)
    r = cm(x)
    return [tuple(d(t) for t in r)]


def callable_object_attr(C):
    class Scale:
        def __init__(self, k): self.k = k
        def __call__(self, x): return x * self.k
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4); s.post = Scale(2)
        def forward(s, x): return s.post(s.l(x))
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]; m.post.k = 5; out.append(d(cm(x))); m.post = Scale(7); out.append(d(cm(x)))
    m.post = torch.tanh; out.append(d(cm(x)))
    return out


def get_submodule_get_parameter(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 4)))
    def f(x):
        sub = m.get_submodule("1.1")
        w = m.get_parameter("1.1.weight")
        return sub(x) + x @ w.t()
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    m[1][1] = nn.Linear(4, 4); out.append(d(cf(x)))
    return out


def pre_hook_kwargs_returns_none(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(4, 4)
        def forward(s, x, k=1.0): return s.l(x) * k
    m = M(); log = []
    m.register_forward_pre_hook(lambda mod, a, kw: log.append(dict(kw)), with_kwargs=True)
    m.register_forward_hook(lambda mod, a, kw, o: log.append(len(a)), with_kwargs=True, always_call=True)
    cm = C(m); x = X(2, 4)
    return [d(cm(x, k=2.0)), d(cm(x)), log]


PROGRAMS = [int_float_list_dict_attrs_changed, tensor_attr_inplace_in_forward, state_across_graph_break, exception_after_mutation, hook_bound_method_state, hook_closure_cell_changed, param_replaced_by_tensor, same_param_two_compiled, moduledict_keys_values_len, sequential_getitem_negative_and_len, named_children_order_changed, lazy_linear, call_forward_directly_skips_hooks, module_comparison, custom_iter_module, attribute_precedence, parameters_list_in_forward, mro_mixin_super, direct_parameters_dict_access, bn_eval_num_batches_unchanged, train_step_compiled_fn, swap_params_between, bias_removed_between, tensor_attr_requires_grad, tensor_attr_view_of_base, parametrize_assign_weight, parametrize_chain_two, hook_removes_itself, hook_on_child_installs_in_parent_forward, forward_with_break_and_hooks, always_call_hook_fn_raises, id_reuse_global, id_reuse_arg, id_reuse_submodule_replaced, id_reuse_param_replaced, bwd_hook_called_twice_in_fn, param_hook_registered_between, grad_of_param_read_in_forward, requires_grad_false_param_inplace_forward, plain_list_of_modules, explicit_call_forms, callable_object_attr, get_submodule_get_parameter, pre_hook_kwargs_returns_none]
