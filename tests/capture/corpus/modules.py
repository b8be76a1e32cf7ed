"""Corpus: nn.Module behaviours: attribute lookup rules, submodules, ModuleList/ModuleDict/Sequential,
parameters() and buffers, train/eval, attribute writes in forward and on the compiled module, lazy
modules, __call__ overrides, and modules called in different orders.

The subject is usually the module itself (compiled as torch.compile compiles a module); the oracle
compares outputs and the module's state after every call. Each runs under fullgraph=True unless it
says otherwise.
"""
from __future__ import annotations

import pickle

import torch
import torch.nn.functional as F
from torch import nn

from .program import Program, case, fn_program, kw, t


class MLP(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc1 = nn.Linear(width, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


@case("modules")
def mlp_forward():
    return Program(MLP(), ((t(2, 4),),))


@case("modules")
def attribute_counter_written_in_forward():
    return Program(Counting(), ((t(2, 3),), (t(2, 3),), (t(2, 3),)))


@case("modules")
def method_on_class_wins_over_submodule_of_same_name():
    class Shadow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self._modules["helper"] = nn.Linear(2, 2)

        def helper(self, x):
            return x * 100

        def forward(self, x):
            return self.helper(x) + self.lin(x)
    return Program(Shadow(), ((t(2),),))


@case("modules")
def property_on_class_wins_over_parameter_of_same_name():
    class Shadow(nn.Module):
        def __init__(self):
            super().__init__()
            self._parameters["scale"] = nn.Parameter(torch.ones(2))

        @property
        def scale(self):
            return 7.0

        def forward(self, x):
            return x * self.scale
    return Program(Shadow(), ((t(2),),))


@case("modules")
def instance_dict_wins_over_buffer_of_same_name():
    class Shadow(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shift", torch.ones(2))
            self.__dict__["shift"] = torch.full((2,), 5.0)

        def forward(self, x):
            return x + self.shift
    return Program(Shadow(), ((t(2),),))


@case("modules")
def class_attribute_loses_to_submodule():
    class Shadow(nn.Module):
        inner = None

        def __init__(self):
            super().__init__()
            self.add_module("proj", nn.Linear(2, 2))

        def forward(self, x):
            if self.inner is None:
                return self.proj(x)
            return x
    return Program(Shadow(), ((t(2),),))


@case("modules")
def call_override_on_module():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

        def __call__(self, x):
            return 5 * self.forward(x)
    return Program(Scaled(), ((t(2),),))


@case("modules")
def submodule_call_override_inside_forward():
    class Doubling(nn.Linear):
        def __call__(self, x):
            return super().__call__(x) * 2

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Doubling(2, 2)

        def forward(self, x):
            return self.inner(x) + 1
    return Program(Outer(), ((t(2),),))


@case("modules")
def setattr_on_compiled_module_between_calls():
    class Stepper(nn.Module):
        def __init__(self):
            super().__init__()
            self.step = 0
            self.scale = 1.0

        def forward(self, x):
            return x * self.scale + self.step

    def change(compiled, i):
        compiled.step += 1
        compiled.scale = 2.0 * i
    return Program(Stepper(), ((t(2),), (t(2),), (t(2),)), between=change)


@case("modules")
def getattr_and_orig_mod_of_compiled_module():
    mod = MLP()

    def drive(compiled):
        inner = getattr(compiled, "_orig_mod", compiled)
        return compiled.fc1.out_features, inner is mod, compiled.training, "fc1" in dir(compiled)
    return Program(mod, drive=drive)


@case("modules")
def compiled_module_pickles_and_state_dict_values():
    mod = MLP()

    def drive(compiled):
        compiled(torch.ones(1, 4))
        restored = pickle.loads(pickle.dumps(compiled))
        values = sorted(v.sum().item() for v in compiled.state_dict().values())
        return restored(torch.ones(1, 4)), values
    return Program(mod, drive=drive)


@case("modules")
def train_eval_switch_dropout_and_flag():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            if self.training:
                return self.drop(x) * 0 + 1
            return self.drop(x)

    def toggle(compiled, i):
        compiled.train(i % 2 == 0)
    return Program(Net(), ((t(4),), (t(4),), (t(4),)), between=toggle)


@case("modules")
def batchnorm_running_stats_updated():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(x)
    return Program(Net(), ((t(4, 3),), (t(4, 3),)))


@case("modules")
def function_valued_module_attribute():
    class Net(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.act = act
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.act(self.lin(x))
    return Program(Net(F.gelu), ((t(2),),))


@case("modules", fullgraph=False)
def parameter_made_in_frame():
    def f(x):
        p = nn.Parameter(torch.ones(2) * 3)
        return x * p, isinstance(p, nn.Parameter)
    return fn_program(f, (t(2),))


@case("modules")
def module_constructed_in_frame():
    def f(x):
        act = nn.ReLU()
        soft = nn.Softmax(dim=-1)
        return soft(act(x))
    return fn_program(f, (t(2, 3),))


@case("modules")
def lazy_linear_first_call_initialises():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.LazyLinear(3)

        def forward(self, x):
            return self.lin(x)

    def drive(compiled):
        out = compiled(torch.ones(2, 5))
        return out.shape, compiled(torch.ones(2, 5)).shape
    return Program(Net(), drive=drive)


@case("modules")
def module_forward_with_kwargs_and_defaults():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x, scale=1.0, *, bias=None):
            out = self.lin(x) * scale
            if bias is not None:
                out = out + bias
            return out

    return Program(Net(), (kw(t(2)), kw(t(2), 2.0), kw(t(2), bias=t(2)), kw(x=t(2), scale=3.0)))


@case("modules")
def module_returns_dict_and_tuple():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            h = self.lin(x)
            return {"hidden": h, "pair": (h.sum(), h.mean())}
    return Program(Net(), ((t(2),),))


@case("modules")
def module_method_other_than_forward_called():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def encode(self, x):
            return self.lin(x).tanh()

        def forward(self, x):
            return self.encode(x) + self.encode(x * 2)
    return Program(Net(), ((t(2),),))


@case("modules")
def compile_bound_method_of_module():
    net = MLP()
    return Program(net.forward, ((t(1, 4),),))


@case("modules")
def module_getattr_override():
    class Proxy(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.inner, name)

        def forward(self, x):
            return x @ self.weight.t() + self.bias
    return Program(Proxy(), ((t(2),),))


@case("modules")
def module_property_reads_parameter():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.raw = nn.Parameter(torch.zeros(2))

        @property
        def positive(self):
            return F.softplus(self.raw)

        def forward(self, x):
            return x * self.positive
    return Program(Net(), ((t(2),),))


@case("modules")
def module_input_isinstance_dispatch():
    def f(x, mod):
        if isinstance(mod, nn.Linear):
            return mod(x) + 1
        if isinstance(mod, nn.Sequential):
            return mod(x) - 1
        return x
    return fn_program(f, (t(2), nn.Linear(2, 2)), (t(2), nn.Sequential(nn.Linear(2, 2))))


@case("modules")
def module_attribute_list_appended_in_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trace = []

        def forward(self, x):
            self.trace.append(x.shape[0])
            return x * len(self.trace)
    return Program(Net(), ((t(2),), (t(3),)))


@case("modules")
def module_new_attribute_set_in_forward():
    class Net(nn.Module):
        def forward(self, x):
            self.last = x.sum()
            self.seen = True
            return x * 2
    return Program(Net(), ((t(2),),))


@case("modules")
def requires_grad_and_grad_of_output():
    net = MLP()

    def drive(compiled):
        out = compiled(torch.ones(2, 4)).sum()
        out.backward()
        return out, [p.grad for p in net.parameters()]
    return Program(net, drive=drive)


@case("modules")
def module_in_eval_under_no_grad():
    net = MLP().eval()

    def f(x):
        with torch.no_grad():
            return net(x)
    return fn_program(f, (t(1, 4),))


@case("modules")
def module_apply_of_functional_with_weight():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 2))

        def forward(self, x):
            return F.linear(x, self.weight), self.weight.shape
    return Program(Net(), ((t(2),),))


@case("modules")
def identity_and_flatten_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.id = nn.Identity()
            self.flat = nn.Flatten()
            self.unflat = nn.Unflatten(1, (2, 3))

        def forward(self, x):
            return self.unflat(self.flat(self.id(x)))
    return Program(Net(), ((t(2, 2, 3),),))


@case("modules")
def embedding_and_layer_norm():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, ids):
            return self.norm(self.emb(ids))
    return Program(Net(), ((torch.tensor([[1, 2, 3]]),),))


@case("modules")
def conv_pool_module():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.pool = nn.MaxPool2d(2)

        def forward(self, x):
            return self.pool(F.relu(self.conv(x)))
    return Program(Net(), ((t(1, 1, 4, 4),),))


@case("modules")
def module_forward_changes_training_dependent_path():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            out = self.lin(x)
            return out * 2 if self.training else out

    def to_eval(compiled, i):
        compiled.eval()
    return Program(Net(), ((t(2),), (t(2),)), between=to_eval)


@case("modules")
def module_parameter_replaced_between_calls():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            return x * self.w

    def replace(compiled, i):
        compiled.w = nn.Parameter(torch.full((2,), 3.0))
    return Program(Net(), ((t(2),), (t(2),)), between=replace)


@case("modules")
def module_parameter_updated_in_place_between_calls():
    net = nn.Linear(2, 2)

    def step(compiled, i):
        with torch.no_grad():
            net.weight.add_(1.0)
    return Program(net, ((t(2),), (t(2),)), between=step)


@case("modules")
def module_hasattr_on_submodules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            out = self.lin(x)
            if hasattr(self, "missing"):
                out = out * 0
            if hasattr(self.lin, "bias") and self.lin.bias is not None:
                out = out + 1
            return out
    return Program(Net(), ((t(2),),))


# held-out probes (probec): modules

@case("modules")
def named_modules_remove_duplicate_probec():
    lin = nn.Linear(2, 2)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = lin
            self.b = lin

        def forward(self, x):
            return self.b(self.a(x)), [n for n, _ in self.named_modules()], \
                [n for n, _ in self.named_modules(remove_duplicate=False)], len(list(self.parameters()))
    return Program(M(), ((t(1, 2),),))


@case("modules")
def parametrize_read_weight_in_forward_probec():
    import torch.nn.utils.parametrize as P

    class Scale(nn.Module):
        def forward(self, X):
            return X * 2

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(2, 2)
            P.register_parametrization(self.l, "weight", Scale())

        def forward(self, x):
            return self.l(x) + self.l.weight.sum(), P.is_parametrized(self.l), P.is_parametrized(self.l, "bias")
    return Program(M(), ((t(1, 2),),))


@case("modules")
def weight_norm_module_probec():
    lin = torch.nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    return Program(lin, ((t(2, 3),), (t(2, 3),)))


@case("modules")
def module_call_kwargs_probec():
    class Inner(nn.Module):
        def forward(self, x, *, scale=1.0, bias=None):
            return x * scale + (0 if bias is None else bias)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x, scale=3.0), self.inner(x, bias=x), self.inner.forward(x, scale=2)
    return Program(M(), ((t(3),),))


@case("modules")
def parameterlist_dict_probec():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(torch.ones(2) * i) for i in range(3)])
            self.pd = nn.ParameterDict({"s": nn.Parameter(torch.ones(2))})

        def forward(self, x):
            for p in self.ps:
                x = x + p
            return x * self.pd["s"], len(self.ps), "s" in self.pd
    return Program(M(), ((t(2),),))


@case("modules")
def no_grad_decorator_on_method_probec():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(2, 2)

        @torch.no_grad()
        def stats(self, x):
            return self.l(x).mean()

        def forward(self, x):
            return self.l(x), self.stats(x), self.stats(x).requires_grad
    return Program(M(), ((t(1, 2),),))


@case("modules")
def get_submodule_and_parameter_probec():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(2, 2))

        def forward(self, x):
            lin = self.get_submodule("block.0")
            w = self.get_parameter("block.0.weight")
            return lin(x) + w.sum()
    return Program(M(), ((t(1, 2),),))


class _Ema(nn.Module):
    """A buffer rebound to a new tensor in forward, read again after the write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("avg", torch.zeros(3))
        self.register_buffer("cache", None, persistent=False)

    def forward(self, x):
        self.avg = self.avg * 0.5 + x.mean(0)
        if self.cache is None:
            self.cache = x.detach().sum(0)
        return x - self.avg + self.cache, self.avg.sum()


@case("modules")
def buffer_rebound_to_new_tensor_in_forward():
    return Program(_Ema(), [(t(4, 3),), (t(4, 3),), (t(4, 3),)])


@case("modules")
def buffer_rebound_in_submodule_and_read_by_parent():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.ema = _Ema()

        def forward(self, x):
            out, total = self.ema(x)
            return out * self.ema.avg, total, sorted(k for k, _ in self.named_buffers())

    return Program(Parent(), [(t(2, 3),), (t(2, 3),)])


@case("modules", fullgraph=False)
def buffer_rebound_across_a_graph_break():
    class Cache(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("kv", torch.zeros(0, 2))

        def forward(self, x):
            self.kv = torch.cat([self.kv, x])
            print("cached", tuple(self.kv.shape))
            return self.kv.sum(0) * self.kv.shape[0]

    return Program(Cache(), [(t(1, 2),), (t(2, 2),), (t(1, 2),)])


@case("modules")
def buffer_rebound_to_tensor_that_requires_grad():
    class Keep(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("last", torch.zeros(1, 2))

        def forward(self, x):
            y = self.lin(x)
            self.last = y
            return y.sum(), self.last.requires_grad

    m = Keep()

    def drive(subject):
        out = []
        for _ in range(2):
            total, flag = subject(torch.ones(1, 2))
            total.backward()
            out.append((total, flag, m.last.requires_grad, m.last.detach().clone()))
        return out, m.lin.weight.grad

    return Program(m, drive=drive)
