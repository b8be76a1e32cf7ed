"""nn.Module programs for tests/capture/test_dynmodules_programs.py (part a): each is
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


class Counter(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.counter = 0
    def forward(s, x):
        s.counter += 1
        return s.lin(x) * s.counter


def counter_attr(C):
    m = Counter(); cm = C(m); x = X(2, 4)
    return [d(cm(x)) for _ in range(3)] + [m.counter]


class Cache(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.cache = None
    def forward(s, x):
        y = s.lin(x)
        if s.cache is not None:
            y = y + s.cache
        s.cache = y.detach()
        return y


def cache_tensor_attr(C):
    m = Cache(); cm = C(m); x = X(2, 4)
    return [d(cm(x)) for _ in range(3)] + [d(m.cache)]


class Appender(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.log = []
    def forward(s, x):
        y = s.lin(x); s.log.append(y.sum().detach()); return y


def append_to_list(C):
    m = Appender(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [len(m.log), [d(t) for t in m.log]]


class RegBuf(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        if not hasattr(s, "running"):
            s.register_buffer("running", torch.zeros(4))
        s.running.add_(x.mean(0))
        return s.lin(x) + s.running


def register_buffer_in_forward(C):
    m = RegBuf(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [d(m.running), sorted(dict(m.named_buffers()))]


class RegParam(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        if not hasattr(s, "extra"):
            s.register_parameter("extra", nn.Parameter(torch.ones(4)))
        return s.lin(x) * s.extra


def register_parameter_in_forward(C):
    m = RegParam(); cm = C(m); x = X(2, 4)
    out = []
    for _ in range(3):
        y = cm(x); y.sum().backward(); out.append(d(y))
    return out + [d(m.extra.grad), sorted(n for n, _ in m.named_parameters())]


class SetSub(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4); s.n = 0
    def forward(s, x):
        s.n += 1
        if s.n == 2:
            s.cur = s.b
        elif not hasattr(s, "cur"):
            s.cur = s.a
        return s.cur(x)


def setattr_submodule(C):
    m = SetSub(); cm = C(m); x = X(2, 4)
    return [d(cm(x)) for _ in range(3)]


class Drop(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.drop = nn.Dropout(0.5)
    def forward(s, x):
        return s.drop(s.lin(x)) + (1 if s.training else 0)


class BN(nn.Module):
    def __init__(s):
        super().__init__(); s.bn = nn.BatchNorm1d(4); s.lin = nn.Linear(4, 4)
    def forward(s, x): return s.lin(s.bn(x))


def train_eval_batchnorm(C):
    m = BN(); cm = C(m); x = X(8, 4)
    out = [d(cm(x)), d(m.bn.running_mean), m.bn.num_batches_tracked.item()]
    m.eval(); out += [d(cm(x)), d(m.bn.running_mean)]
    m.train(); out += [d(cm(x * 2)), d(m.bn.running_mean), d(m.bn.running_var), m.bn.num_batches_tracked.item()]
    return out


def submodule_eval_only(C):
    m = Drop(); cm = C(m); x = X(2, 4)
    m.drop.eval()
    a = d(cm(x))
    m.drop.p = 0.0; m.drop.train()
    b = d(cm(x))
    return [a, b]


def training_flag_fn(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    def f(x): return m(x).sum() if m.training else m(x).mean()
    cf = C(f); x = X(4, 4)
    out = [d(cf(x))]; m.eval(); out.append(d(cf(x))); m.train(); out.append(d(cf(x)))
    return out


class ML(nn.Module):
    def __init__(s):
        super().__init__(); s.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    def forward(s, x):
        for l in s.layers: x = l(x)
        for i in range(len(s.layers)): x = s.layers[i](x)
        for l in s.layers[1:]: x = l(x)
        return s.layers[-1](x)


def modulelist_iter_index_slice(C):
    m = ML(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x))]


class Zip(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        s.b = nn.ModuleList([nn.ReLU(), nn.Tanh(), nn.Sigmoid()])
    def forward(s, x):
        for l, act in zip(s.a, s.b): x = act(l(x))
        for i, (l, act) in enumerate(zip(reversed(s.a), s.b)): x = act(l(x)) + i
        return x


def zip_modulelists(C):
    m = Zip(); cm = C(m); x = X(2, 4)
    return [d(cm(x))]


class MLContains(nn.Module):
    def __init__(s):
        super().__init__()
        s.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]); s.special = s.layers[1]
    def forward(s, x):
        for l in s.layers:
            x = l(x)
            if l is s.special: x = x * 2
        return x + (1 if s.special in s.layers else 0)


def modulelist_in(C):
    m = MLContains(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.special = nn.Linear(4, 4)
    out.append(d(cm(x)))
    return out


class DictKeys(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        s.scale = {s.a: 2.0, s.b: 3.0}
    def forward(s, x):
        for mod in (s.a, s.b):
            x = mod(x) * s.scale[mod]
        return x


def module_as_dict_key(C):
    m = DictKeys(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.scale[m.a] = 5.0
    out.append(d(cm(x)))
    return out


class MD(nn.Module):
    def __init__(s):
        super().__init__()
        s.d = nn.ModuleDict({"x": nn.Linear(4, 4), "y": nn.Linear(4, 4), "z": nn.ReLU()})
    def forward(s, x, key):
        x = s.d[key](x)
        for k, v in s.d.items(): x = v(x)
        for k in s.d: x = x + len(k)
        return x + len(s.d) + ("x" in s.d)


def moduledict_mutated_between(C):
    m = MD(); cm = C(m); x = X(2, 4)
    out = [d(cm(x, "x"))]
    m.d["w"] = nn.Tanh()
    out.append(d(cm(x, "x")))
    del m.d["z"]
    out.append(d(cm(x, "x")))
    return out


def nested_sequential_slice(C):
    seq = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), nn.Tanh())
    def f(x):
        y = seq[1][:2](x)
        z = seq[:2](x)
        w = seq[1][-1](y)
        return y + z + w + len(seq[1]) + seq[-1](x)
    cf = C(f); x = X(2, 4)
    return [d(cf(x)), d(cf(x))]


def sequential_append_between(C):
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    cs = C(seq); x = X(2, 4)
    out = [d(cs(x))]
    seq.append(nn.Linear(4, 2))
    out.append(d(cs(x)))
    return out


def modulelist_append_between(C):
    m = ML(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.layers.append(nn.Linear(4, 4))
    out.append(d(cm(x)))
    m.layers[0] = nn.Identity()
    out.append(d(cm(x)))
    return out


class PropMod(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s._scale = 2.0
    @property
    def scale(s): return s._scale * 2
    @property
    def weight_t(s): return s.lin.weight.t()
    def forward(s, x): return x @ s.weight_t * s.scale


def property_attr(C):
    m = PropMod(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m._scale = 3.0
    out.append(d(cm(x)))
    return out


class Desc:
    def __get__(self, obj, typ=None):
        return 7 if obj is None else obj.base * 3


class DescMod(nn.Module):
    k = Desc()
    def __init__(s):
        super().__init__(); s.base = 1
    def forward(s, x): return x * s.k


def descriptor_attr(C):
    m = DescMod(); cm = C(m); x = X(3)
    out = [d(cm(x))]; m.base = 2; out.append(d(cm(x)))
    return out


class GetAttrMod(nn.Module):
    def __init__(s):
        super().__init__(); s.inner = nn.Linear(4, 4)
    def __getattr__(s, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(s.inner, name)
    def forward(s, x): return x @ s.weight.t() + s.bias


def getattr_override(C):
    m = GetAttrMod(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x))]


class CallOverride(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def __call__(s, *args, **kwargs):
        return super().__call__(*args, **kwargs) * 2
    def forward(s, x, *rest, scale=1.0, **kw):
        y = s.lin(x) * scale
        for r in rest: y = y + r
        for k, v in kw.items(): y = y + v
        return y


def call_override_args_kwargs(C):
    m = CallOverride(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x, 1.0, 2.0, scale=3.0, extra=x))]


def forward_pre_hook_modify_input(C):
    m = nn.Linear(4, 4); calls = []
    def pre(mod, args):
        calls.append(1); return (args[0] * 2,)
    h = m.register_forward_pre_hook(pre)
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    h.remove(); out.append(d(cm(x)))
    m.register_forward_pre_hook(pre); out.append(d(cm(x)))
    return out + [len(calls)]


def hooks_with_kwargs(C):
    m = CallOverride(); log = []
    def pre(mod, args, kwargs):
        log.append(sorted(kwargs)); kwargs = dict(kwargs); kwargs["scale"] = 10.0; return args, kwargs
    def post(mod, args, kwargs, out):
        log.append(len(args)); return out * kwargs["scale"]
    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(post, with_kwargs=True)
    cm = C(m); x = X(2, 4)
    return [d(cm(x, scale=2.0)), d(cm(x, scale=2.0)), log]


def hooks_prepend(C):
    m = nn.Linear(4, 4); order = []
    m.register_forward_hook(lambda mod, a, o: (order.append("a"), o * 2)[1])
    m.register_forward_hook(lambda mod, a, o: (order.append("b"), o + 1)[1], prepend=True)
    m.register_forward_pre_hook(lambda mod, a: (order.append("p1"), None)[1])
    m.register_forward_pre_hook(lambda mod, a: (order.append("p0"), (a[0] * 3,))[1], prepend=True)
    cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x)), order]


def hook_added_between_calls_submodule(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)); cnt = [0]
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    h = m[0].register_forward_hook(lambda mod, a, o: (cnt.__setitem__(0, cnt[0] + 1), o * 0)[1])
    out.append(d(cm(x)))
    h.remove()
    out.append(d(cm(x)))
    return out + [cnt[0]]


def hook_on_module_called_from_fn(C):
    m = nn.Linear(4, 4); cnt = []
    def f(x): return m(x) + m(x * 2)
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    h = m.register_forward_pre_hook(lambda mod, a: (cnt.append(1), (a[0] + 1,))[1])
    out.append(d(cf(x)))
    h.remove(); out.append(d(cf(x)))
    return out + [len(cnt)]


def global_forward_hook(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU()); cnt = []
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    h = nn.modules.module.register_module_forward_hook(lambda mod, a, o: (cnt.append(type(mod).__name__), None)[1])
    try:
        out.append(d(cm(x)))
    finally:
        h.remove()
    out.append(d(cm(x)))
    return out + [cnt]


class IterState(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.BatchNorm1d(4)
    def forward(s, x):
        tot = 0
        for p in s.parameters(): tot = tot + p.sum()
        for n, b in s.named_buffers(): tot = tot + b.float().sum()
        for n, mod in s.named_modules(): tot = tot + len(n)
        for k, v in s.state_dict().items(): tot = tot + v.float().mean()
        return s.b(s.a(x)) + tot + len(list(s.children()))


def iterate_state_in_forward(C):
    m = IterState(); cm = C(m); x = X(4, 4)
    out = [d(cm(x))]
    with torch.no_grad(): m.a.weight.add_(1)
    out.append(d(cm(x)))
    return out


class Tied(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(10, 4); s.out = nn.Linear(4, 10, bias=False)
        s.out.weight = s.emb.weight
    def forward(s, i): return s.out(s.emb(i))


def tied_weights(C):
    m = Tied(); cm = C(m); i = torch.tensor([1, 2, 3])
    out = []
    for _ in range(2):
        y = cm(i); y.sum().backward(); out.append(d(y))
    return out + [d(m.emb.weight.grad), m.out.weight is m.emb.weight]


def same_module_twice(C):
    lin = nn.Linear(4, 4)
    m = nn.Sequential(lin, nn.ReLU(), lin)
    cm = C(m); x = X(2, 4)
    y = cm(x); y.sum().backward()
    return [d(y), d(lin.weight.grad), len(list(m.parameters()))]


def module_created_in_frame(C):
    def f(x):
        torch.manual_seed(3)
        lin = nn.Linear(4, 4)
        return lin(x)
    cf = C(f); x = X(2, 4)
    return [d(cf(x)), d(cf(x))]


class TensorAttr(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.offset = torch.ones(4)
    def forward(s, x): return s.lin(x) + s.offset


def tensor_attr_replaced(C):
    m = TensorAttr(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.offset = torch.full((4,), 5.0); out.append(d(cm(x)))
    m.offset.mul_(2); out.append(d(cm(x)))
    m.offset = torch.zeros(2, 4); out.append(d(cm(x)))
    return out


def tensor_attr_replaced_fn(C):
    m = TensorAttr()
    def f(x): return m(x) * 2
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    m.offset = torch.full((4,), 5.0); out.append(d(cf(x)))
    return out


def requires_grad_toggle(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)); cm = C(m); x = X(3, 4)
    out = []
    for step in range(4):
        if step == 1: m[0].weight.requires_grad_(False)
        if step == 2: m[0].weight.requires_grad_(True); m[1].requires_grad_(False)
        if step == 3: m.requires_grad_(True)
        m.zero_grad(set_to_none=True)
        y = cm(x); y.sum().backward()
        out.append([d(y)] + [None if p.grad is None else d(p.grad) for p in m.parameters()])
    return out


def to_dtype_between(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.to(torch.float64); out.append(d(cm(x.double())))
    m.to(torch.float32); out.append(d(cm(x)))
    return out


def freeze_params(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)); cm = C(m); x = X(3, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for step in range(4):
        if step == 2:
            for p in m[0].parameters(): p.requires_grad = False
        opt.zero_grad(); y = cm(x).sum(); y.backward(); opt.step(); out.append(d(y))
    return out + [d(p) for p in m.parameters()]


def param_data_replaced(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.weight.data = torch.ones(4, 4); out.append(d(cm(x)))
    m.bias.data.fill_(3); out.append(d(cm(x)))
    m.weight.data = torch.ones(4, 4, dtype=torch.float64).float().t(); out.append(d(cm(x)))
    return out


def param_data_replaced_fn(C):
    m = nn.Linear(4, 4)
    def f(x): return m(x).relu()
    cf = C(f); x = X(2, 4)
    out = [d(cf(x))]
    m.weight.data = torch.ones(4, 4); out.append(d(cf(x)))
    with torch.no_grad(): m.weight.copy_(torch.eye(4))
    out.append(d(cf(x)))
    return out


def load_state_dict_between(C):
    torch.manual_seed(0); m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    torch.manual_seed(5); other = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with torch.no_grad(): other[1].running_mean.fill_(2)
    cm = C(m); x = X(4, 4)
    out = [d(cm(x))]
    m.load_state_dict(other.state_dict()); out.append(d(cm(x)))
    m.eval(); out.append(d(cm(x)))
    m.load_state_dict({k: v * 2 for k, v in other.state_dict().items()}); out.append(d(cm(x)))
    return out


def functional_call_dict(C):
    m = nn.Linear(4, 4)
    def f(params, x): return torch.func.functional_call(m, params, (x,))
    cf = C(f); x = X(2, 4)
    p1 = {k: v.detach() for k, v in m.named_parameters()}
    p2 = {k: torch.ones_like(v) for k, v in m.named_parameters()}
    return [d(cf(p1, x)), d(cf(p2, x)), d(cf({"weight": torch.eye(4)}, x)), d(m(x))]


def functional_call_grads(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    params = {k: v.detach().clone().requires_grad_() for k, v in m.named_parameters()}
    def f(params, x): return torch.func.functional_call(m, params, x).sum()
    cf = C(f); x = X(3, 4)
    l = cf(params, x); l.backward()
    return [d(l)] + [d(p.grad) for p in params.values()] + [m[0].weight.grad]


def deepcopy_compiled(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU()); cm = C(m); x = X(2, 4)
    a = d(cm(x))
    cm2 = copy.deepcopy(cm)
    with torch.no_grad(): m[0].weight.fill_(1)
    return [a, d(cm(x)), d(cm2(x))]


class Block(nn.Module):
    def __init__(s, k):
        super().__init__(); s.lin = nn.Linear(4, 4); s.k = k
    def forward(s, x): return s.lin(x) * s.k


def fn_over_two_instances(C):
    a, b = Block(2), Block(3)
    def f(m, x): return m(x)
    cf = C(f); x = X(2, 4)
    out = [d(cf(a, x)), d(cf(b, x)), d(cf(a, x))]
    b.k = 7; out.append(d(cf(b, x)))
    return out


class Base(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x): return s.lin(x)


class Derived(Base):
    def forward(s, x): return super().forward(x) * 2 + super(Derived, s).forward(x)


class Derived2(Derived):
    def forward(s, x, y=None):
        out = super().forward(x)
        return out if y is None else out + y


def inheritance_super(C):
    m = Derived2(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x, x)), d(cm(x))]


@dataclasses.dataclass(eq=False)
class DCMod(nn.Module):
    n: int = 4
    scale: float = 2.0
    def __post_init__(s):
        super().__init__(); s.lin = nn.Linear(s.n, s.n)
    def forward(s, x): return s.lin(x) * s.scale


def dataclass_module(C):
    m = DCMod(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]; m.scale = 5.0; out.append(d(cm(x)))
    return out


class Sym(nn.Module):
    def forward(s, X): return X.triu() + X.triu(1).transpose(-1, -2)


def parametrize_custom(C):
    m = nn.Linear(4, 4)
    parametrize.register_parametrization(m, "weight", Sym())
    cm = C(m); x = X(2, 4)
    out = []
    for _ in range(2):
        y = cm(x); y.sum().backward(); out.append(d(y))
    out.append(d(m.parametrizations.weight.original.grad))
    with torch.no_grad(): m.parametrizations.weight.original.fill_(0.5)
    out.append(d(cm(x)))
    return out


def parametrize_orthogonal(C):
    m = nn.Linear(4, 4)
    torch.nn.utils.parametrizations.orthogonal(m)
    cm = C(m); x = X(2, 4)
    y = cm(x); y.sum().backward()
    return [d(y), d(cm(x))]


def parametrize_removed_between(C):
    m = nn.Linear(4, 4)
    parametrize.register_parametrization(m, "weight", Sym())
    cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)
    out.append(d(cm(x)))
    return out


def weight_norm_new(C):
    m = torch.nn.utils.parametrizations.weight_norm(nn.Linear(4, 4))
    cm = C(m); x = X(2, 4)
    out = []
    y = cm(x); y.sum().backward(); out.append(d(y))
    with torch.no_grad(): m.parametrizations.weight.original0.mul_(2)
    out.append(d(cm(x)))
    return out


def spectral_norm_new(C):
    m = torch.nn.utils.parametrizations.spectral_norm(nn.Linear(4, 4))
    cm = C(m); x = X(2, 4)
    out = [d(cm(x)), d(cm(x)), d(m.parametrizations.weight[0]._u)]
    m.eval(); out.append(d(cm(x)))
    return out


class Accum(nn.Module):
    def __init__(s):
        super().__init__(); s.register_buffer("steps", torch.zeros((), dtype=torch.long)); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        s.steps += 1
        return s.lin(x) * s.steps


def buffer_inplace_counter(C):
    m = Accum(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    m.steps.zero_(); out.append(d(cm(x)))
    m.steps = torch.tensor(10); out.append(d(cm(x)))
    return out + [d(m.steps)]


class BufReassign(nn.Module):
    def __init__(s):
        super().__init__(); s.register_buffer("ema", torch.zeros(4))
    def forward(s, x):
        s.ema = 0.9 * s.ema + 0.1 * x.mean(0)
        return x - s.ema


def buffer_reassigned_in_forward(C):
    m = BufReassign(); cm = C(m); x = X(3, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [d(m.ema), "ema" in dict(m.named_buffers())]


class ParamsDict(nn.Module):
    def __init__(s):
        super().__init__()
        s.pd = nn.ParameterDict({"a": nn.Parameter(torch.ones(4)), "b": nn.Parameter(torch.full((4,), 2.0))})
        s.pl = nn.ParameterList([nn.Parameter(torch.ones(4) * i) for i in range(3)])
    def forward(s, x):
        for k, p in s.pd.items(): x = x * p
        for p in s.pl: x = x + p
        return x + s.pl[-1] + s.pd["a"]


def parameterdict_list(C):
    m = ParamsDict(); cm = C(m); x = X(4)
    out = [d(cm(x))]
    m.pl.append(nn.Parameter(torch.ones(4) * 10)); out.append(d(cm(x)))
    m.pd["c"] = nn.Parameter(torch.zeros(4)); out.append(d(cm(x)))
    with torch.no_grad(): m.pd["a"].fill_(3)
    out.append(d(cm(x)))
    return out


def forward_monkeypatched(C):
    m = nn.Linear(4, 4); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    orig = m.forward
    m.forward = lambda x: orig(x) * 3
    out.append(d(cm(x)))
    del m.forward
    out.append(d(cm(x)))
    return out


class ClsAttr(nn.Module):
    k = 2
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x): return s.lin(x) * s.k


def class_attr_changed(C):
    m = ClsAttr(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    ClsAttr.k = 5; out.append(d(cm(x)))
    m.k = 7; out.append(d(cm(x)))
    ClsAttr.k = 2
    return out


class Other(ClsAttr):
    def forward(s, x): return s.lin(x) - 100


def swap_class(C):
    m = ClsAttr(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.__class__ = Other; out.append(d(cm(x)))
    return out


class SelfEval(nn.Module):
    def __init__(s):
        super().__init__(); s.drop = nn.Dropout(0.9); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        s.eval()
        y = s.drop(s.lin(x))
        s.train()
        return y, s.training


def eval_inside_forward(C):
    m = SelfEval(); cm = C(m); x = X(2, 4)
    r = [cm(x) for _ in range(2)]
    return [(d(a), b) for a, b in r] + [m.training, m.drop.training]


class NoGradClip(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        with torch.no_grad():
            s.lin.weight.clamp_(-0.1, 0.1)
        return s.lin(x)


def nograd_clamp_in_forward(C):
    m = NoGradClip(); cm = C(m); x = X(2, 4)
    out = []
    for _ in range(2):
        y = cm(x); y.sum().backward(); out.append(d(y))
        with torch.no_grad(): m.lin.weight.add_(1)
    return out + [d(m.lin.weight), d(m.lin.weight.grad)]


def ema_teacher(C):
    student = nn.Linear(4, 4); teacher = copy.deepcopy(student)
    for p in teacher.parameters(): p.requires_grad_(False)
    def step(x):
        loss = (student(x) - teacher(x)).pow(2).sum() + student(x).sum()
        with torch.no_grad():
            for ps, pt in zip(student.parameters(), teacher.parameters()):
                pt.mul_(0.9).add_(ps, alpha=0.1)
        return loss
    cs = C(step); x = X(2, 4)
    out = []
    for _ in range(3):
        l = cs(x); l.backward(); out.append(d(l))
        with torch.no_grad():
            for p in student.parameters(): p -= 0.1 * p.grad; p.grad = None
    return out + [d(p) for p in teacher.parameters()]


def embedding_max_norm(C):
    m = nn.Embedding(10, 4, max_norm=1.0); cm = C(m)
    with torch.no_grad(): m.weight.mul_(5)
    i = torch.tensor([1, 2, 1])
    out = [d(cm(i)), d(m.weight)]
    out.append(d(cm(torch.tensor([3]))))
    return out + [d(m.weight)]


class HookCountsState(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.calls = 0
        s.register_forward_pre_hook(HookCountsState._pre)
    @staticmethod
    def _pre(mod, args):
        mod.calls += 1
    def forward(s, x): return s.lin(x) * s.calls


def hook_mutates_state_fn(C):
    m = HookCountsState()
    def f(x): return m(x) + m(x)
    cf = C(f); x = X(2, 4)
    return [d(cf(x)) for _ in range(3)] + [m.calls]


def hook_registered_in_frame(C):
    m = nn.Linear(4, 4); seen = []
    def f(x):
        h = m.register_forward_hook(lambda mod, a, o: o * 2)
        y = m(x)
        h.remove()
        return y + m(x)
    cf = C(f); x = X(2, 4)
    return [d(cf(x)), d(cf(x)), len(m._forward_hooks)]


class HasAttr(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        y = s.lin(x)
        if hasattr(s, "extra"): y = y + s.extra
        return y


def hasattr_toggled(C):
    m = HasAttr(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    m.extra = torch.ones(4); out.append(d(cm(x)))
    del m.extra; out.append(d(cm(x)))
    m.register_buffer("extra", torch.full((4,), 2.)); out.append(d(cm(x)))
    m.extra = None; out.append("skip")
    return out


class AddMod(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x):
        if "post" not in s._modules:
            s.add_module("post", nn.ReLU())
        return s.post(s.lin(x))


def add_module_in_forward(C):
    m = AddMod(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x)), sorted(m._modules)]


class DelAttr(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.tmp = 1
    def forward(s, x):
        y = s.lin(x) * s.tmp
        del s.tmp
        s.tmp = 3
        return y


def delattr_in_forward(C):
    m = DelAttr(); cm = C(m); x = X(2, 4)
    return [d(cm(x)), d(cm(x)), m.tmp]


class ApplyInit(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
    def forward(s, x): return s.b(s.a(x))


def apply_init_between(C):
    m = ApplyInit(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    def init(mod):
        if isinstance(mod, nn.Linear):
            nn.init.constant_(mod.weight, 0.1); nn.init.zeros_(mod.bias)
    m.apply(init); out.append(d(cm(x)))
    return out


def fuse_conv_bn_between(C):
    conv = nn.Conv2d(3, 4, 3); bn = nn.BatchNorm2d(4)
    m = nn.Sequential(conv, bn).eval()
    with torch.no_grad(): bn.running_mean.uniform_(); bn.running_var.uniform_(0.5, 1.5)
    cm = C(m); x = X(1, 3, 6, 6)
    out = [d(cm(x))]
    fused = torch.nn.utils.fuse_conv_bn_eval(conv, bn)
    m[0] = fused; m[1] = nn.Identity()
    out.append(d(cm(x)))
    return out


PROGRAMS = [counter_attr, cache_tensor_attr, append_to_list, register_buffer_in_forward, register_parameter_in_forward, setattr_submodule, train_eval_batchnorm, submodule_eval_only, training_flag_fn, modulelist_iter_index_slice, zip_modulelists, modulelist_in, module_as_dict_key, moduledict_mutated_between, nested_sequential_slice, sequential_append_between, modulelist_append_between, property_attr, descriptor_attr, getattr_override, call_override_args_kwargs, forward_pre_hook_modify_input, hooks_with_kwargs, hooks_prepend, hook_added_between_calls_submodule, hook_on_module_called_from_fn, global_forward_hook, iterate_state_in_forward, tied_weights, same_module_twice, module_created_in_frame, tensor_attr_replaced, tensor_attr_replaced_fn, requires_grad_toggle, to_dtype_between, freeze_params, param_data_replaced, param_data_replaced_fn, load_state_dict_between, functional_call_dict, functional_call_grads, deepcopy_compiled, fn_over_two_instances, inheritance_super, dataclass_module, parametrize_custom, parametrize_orthogonal, parametrize_removed_between, weight_norm_new, spectral_norm_new, buffer_inplace_counter, buffer_reassigned_in_forward, parameterdict_list, forward_monkeypatched, class_attr_changed, swap_class, eval_inside_forward, nograd_clamp_in_forward, ema_teacher, embedding_max_norm, hook_mutates_state_fn, hook_registered_in_frame, hasattr_toggled, add_module_in_forward, delattr_in_forward, apply_init_between, fuse_conv_bn_between]
