"""Programs that made capture fail with an internal error now trace (or break with a reason).

Each case runs under fullgraph=True where torch.compile traces it, compared with eager, and with
kiln.config.suppress_errors off, so that an internal error fails the test instead of falling
back to eager with a warning: module introspection with arguments and over cyclic or shared
module trees, lazy modules on their first call, names and strings holding `{` and `}` in guards
and glue, keyword arguments to torch functions, super() reaching a classmethod,
contextlib.redirect_stdout/redirect_stderr, and tensor subclasses.
"""
from __future__ import annotations

import contextlib
import io
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln.log import KilnWarning

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402


@pytest.fixture(autouse=True)
def _internal_errors_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.config, "suppress_errors", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # a fallback warning fails the test
        yield


def _check_module(make, x, fullgraph: bool = True, calls: int = 2) -> None:
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    module = make()
    kiln.reset()
    compiled = kiln.compile(module, backend="eager", fullgraph=fullgraph)
    for i in range(calls):
        torch.manual_seed(i)  # a lazy module draws its weights on the first call
        want = eager(x)
        torch.manual_seed(i)
        torch.testing.assert_close(compiled(x), want)


# ------------------------------------------------------------------ parameters() and friends


class Introspects(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.shared = self.a

    def forward(self, x):
        own = sum(p.numel() for p in self.parameters(recurse=False))
        total = sum(p.sum() for _, p in self.named_parameters(prefix="root"))
        every = len(list(self.named_parameters(remove_duplicate=False)))
        buffers = len(list(self.buffers(recurse=True)))
        names = [n for n, _ in self.named_modules(prefix="z")]
        children = len(list(self.children()))
        inner = len(list(self.b.named_buffers(prefix="b", recurse=False)))
        return x + own + total + every + buffers + len(names) + children + inner


class Cyclic(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = nn.Linear(2, 2)
        self.child.parent = self  # a submodule pointing back at its parent

    def forward(self, x):
        return x + sum(p.sum() for p in self.parameters()) + len(list(self.modules()))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.b.weight = self.a.weight

    def forward(self, x):
        return x + sum(p.sum() for p in self.parameters()) + len(list(self.named_parameters()))


@pytest.mark.parametrize("make", [Introspects, Cyclic, Tied])
def test_module_introspection_traces(make) -> None:
    _check_module(make, torch.randn(3, 2))


def test_introspection_sees_a_new_submodule() -> None:
    module = Introspects()
    kiln.reset()
    compiled = kiln.compile(module, backend="eager")
    x = torch.randn(3, 2)
    torch.testing.assert_close(compiled(x), module(x))
    module.extra = nn.Linear(2, 2)
    torch.testing.assert_close(compiled(x), module(x))
    module.shared = nn.Linear(2, 2)  # no longer the same module as `a`
    torch.testing.assert_close(compiled(x), module(x))


# ------------------------------------------------------------------ lazy modules


class LazyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.LazyLinear(5)
        self.bn = nn.LazyBatchNorm1d()
        self.l2 = nn.LazyLinear(2)

    def forward(self, x):
        return self.l2(self.bn(self.l1(x)).relu())


class LazyConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv2d(2, 3)

    def forward(self, x):
        return self.conv(x).relu()


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.LazyLinear(3), (2, 4)),
    (LazyNet, (4, 7)),
    (LazyConv, (1, 3, 8, 8)),
    (lambda: nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2)), (3, 6)),
])
def test_lazy_modules_initialize_then_trace(make, shape) -> None:
    x = torch.randn(*shape)
    _check_module(make, x)


def test_lazy_module_initialized_in_the_trace_is_a_plain_module_after() -> None:
    torch.manual_seed(0)
    module = LazyNet()
    kiln.reset()
    explained = kiln.explain(module)(torch.randn(4, 7))
    assert explained.graph_count == 1 and not explained.break_reasons
    assert isinstance(module.l1, nn.Linear) and module.l1.weight.shape == (5, 7)


# ------------------------------------------------------------------ braces in names and values

WEIRD = types.SimpleNamespace()
setattr(WEIRD, "we{ird}", 4.0)
setattr(WEIRD, "t{}", torch.ones(2))
setattr(WEIRD, "{v}", 2.0)
FORMATS = {"a{0}": 2.0, "}{": 3.0, "{x}": torch.ones(2), "{v}": 5.0}
TEMPLATE = "{}-{v}"


class Braced:
    pass


setattr(Braced, "c{l}s", 5.0)
setattr(Braced, "{v}", "x{v}")


def attribute_names_with_braces(x):
    return x * getattr(WEIRD, "we{ird}") + getattr(WEIRD, "t{}") + getattr(WEIRD, "{v}")


def dict_keys_with_braces(x):
    return x * FORMATS["a{0}"] + FORMATS["}{"] + FORMATS["{x}"] + FORMATS["{v}"] + len(FORMATS)


def string_values_with_braces(x):
    return x + len(TEMPLATE) + (1 if TEMPLATE == "{}-{v}" else 0)


def class_attributes_with_braces(x):
    obj = Braced()
    return x * getattr(obj, "c{l}s") + len(getattr(type(obj), "{v}"))


class Plain:
    pass


PLAIN = Plain()


def attribute_written_under_a_brace_name(x):
    setattr(PLAIN, "out{put}", x + 1)
    setattr(PLAIN, "{v}", 3)
    return x * 2


@pytest.mark.parametrize("fn", [attribute_names_with_braces, dict_keys_with_braces, string_values_with_braces,
                                class_attributes_with_braces, attribute_written_under_a_brace_name])
def test_braces_in_guards_and_glue(fn) -> None:
    check_calls(fn, [(torch.ones(2),), (torch.ones(2) * 2,)], fullgraph=True)


def test_a_changed_brace_string_recompiles() -> None:
    global TEMPLATE
    old = TEMPLATE
    try:
        def change(i: int) -> None:
            global TEMPLATE
            TEMPLATE = "{v}" * (i + 2)
        check_calls(string_values_with_braces, [(torch.ones(2),)] * 3, between=change)
    finally:
        TEMPLATE = old


# ------------------------------------------------------------------ keyword arguments to torch functions


def keyword_queries(y):
    return (y + torch.numel(input=y), torch.is_floating_point(input=y), torch.is_complex(input=y),
            torch.is_floating_point(y), y.is_floating_point(), torch.result_type(tensor=y, other=2))


def keyword_ops(y):
    return (torch.add(input=y, other=y, alpha=2) + torch.sum(input=y, dim=1, keepdim=True)
            + torch.cat(tensors=[y, y], dim=0)[:2] + torch.reshape(input=y, shape=(3, 2)).t()
            + torch.where(condition=y > 0, input=y, other=-y) + torch.full(size=(2, 3), fill_value=2.0)
            + torch.zeros_like(input=y) + torch.clamp(input=y, min=0.5, max=2)
            + torch.nn.functional.softmax(input=y, dim=-1) + torch.split(tensor=y, split_size_or_sections=1, dim=0)[0]
            + torch.narrow(input=y, dim=1, start=0, length=3) + torch.flatten(input=y, start_dim=0).view(2, 3)
            + y.sum(dim=0) + y.new_zeros(size=(3,)) + y.size(dim=1))


@pytest.mark.parametrize("fn", [keyword_queries, keyword_ops])
def test_keyword_arguments_to_torch_functions(fn) -> None:
    check_calls(fn, [(torch.randn(2, 3),), (torch.randn(2, 3),)], fullgraph=True)


# ------------------------------------------------------------------ super() in classmethods


class Base:
    K = 1.0

    @classmethod
    def scale(cls):
        return 2.0

    @classmethod
    def make(cls, v):
        return cls.K * v

    @staticmethod
    def bump(v):
        return v + 1

    def plain(self):
        return 7.0


class Child(Base):
    K = 3.0

    @classmethod
    def scale(cls):
        return super().scale() * 10

    @classmethod
    def make(cls, v):
        return super().make(v) + super().bump(1) + super().plain(None)

    def method(self, x):
        return x * super().scale() + super().bump(1) + super().make(2)


class GrandChild(Child):
    @classmethod
    def scale(cls):
        return super().scale() + 1


class ModuleWithClassmethods(nn.Module):
    @classmethod
    def factor(cls):
        return 2.0


class ModuleChild(ModuleWithClassmethods):
    @classmethod
    def factor(cls):
        return super().factor() * 3

    def forward(self, x):
        return x * self.factor() * super().factor()


CHILD = Child()


def classmethods_through_super(x):
    return x * Child.scale() + Child.make(3) + GrandChild.scale() + GrandChild.make(2) + CHILD.method(x) + CHILD.scale()


def test_super_in_classmethods() -> None:
    check_calls(classmethods_through_super, [(torch.ones(2),)] * 2, fullgraph=True)
    _check_module(ModuleChild, torch.ones(2))


# ------------------------------------------------------------------ redirect_stdout / redirect_stderr


def redirect_with_print(x):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        print("inside")
    return x + len(buffer.getvalue())


def redirect_without_print(x):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        y = x * 2
    return y + 1


@pytest.mark.parametrize("fn", [redirect_with_print, redirect_without_print])
def test_redirected_streams(fn) -> None:
    stdout, stderr = sys.stdout, sys.stderr
    check_calls(fn, [(torch.ones(2),)] * 2)
    assert sys.stdout is stdout and sys.stderr is stderr


# ------------------------------------------------------------------ tensor subclasses


class PlainSubclass(torch.Tensor):
    pass


class FunctionSubclass(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class WrapperSubclass(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.elem if isinstance(t, WrapperSubclass) else t

        def wrap(t):
            return WrapperSubclass(t) if isinstance(t, torch.Tensor) else t
        return torch.utils._pytree.tree_map(wrap, func(*torch.utils._pytree.tree_map(unwrap, args),
                                                       **torch.utils._pytree.tree_map(unwrap, kwargs or {})))


def _plain(t):
    return t.elem if isinstance(t, WrapperSubclass) else t.as_subclass(torch.Tensor)


@pytest.mark.parametrize("make", [lambda x: x.as_subclass(PlainSubclass), lambda x: x.as_subclass(FunctionSubclass),
                                  WrapperSubclass], ids=["plain", "torch_function", "torch_dispatch"])
def test_tensor_subclasses_break_with_a_reason(make) -> None:
    def fn(t):
        return t * 2 + 1

    x = torch.randn(3)
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    want, got = fn(make(x)), compiled(make(x))
    assert type(got) is type(want)
    torch.testing.assert_close(_plain(got), _plain(want))
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="subclass"):
        kiln.compile(fn, backend="eager", fullgraph=True)(make(x))


def test_tensor_subclass_made_in_the_frame() -> None:
    def fn(t):
        return (t.as_subclass(FunctionSubclass) * 2).as_subclass(torch.Tensor) + 1

    check_calls(fn, [(torch.randn(3),)] * 2)


class LazyFromContainers(torch.nn.modules.lazy.LazyModuleMixin, nn.Module):
    """A lazy layer whose inputs are a list and a dict of tensors (initialized from their shapes)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.UninitializedParameter()

    def initialize_parameters(self, items, named):
        with torch.no_grad():
            self.weight.materialize(items[0].shape)
            self.weight.fill_(0.5)

    def forward(self, items, named):
        return sum(items) * self.weight + named["b"]


class HoldsLazyFromContainers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = LazyFromContainers()

    def forward(self, x):
        return self.layer([x, x * 2, x + 1], {"b": x.cos()})


def test_lazy_module_with_container_inputs() -> None:
    _check_module(HoldsLazyFromContainers, torch.randn(3, 4))
