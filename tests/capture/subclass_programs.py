"""Programs over tensor subclasses, __torch_function__ and torch function / dispatch modes, each run
eagerly and compiled by tests/capture/test_subclass_programs.py.

A program is `fn(*args)`; `make()` builds fresh arguments for each run (subclass instances, their
attributes, modules). What a program's overrides and modes see is appended to `LOG`, which the test
clears before each run and compares: the compiled run must log what eager logs (a mode or an
override Kiln cannot trace runs its frame eagerly, never skipped). Results are compared by value,
by exact Python type (a subclass stays that subclass) and by the attributes on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

LOG: list[str] = []


def _name(func: Any) -> str:
    return getattr(func, "__name__", None) or str(func)


# ---- subclasses with __torch_function__ -------------------------------------------------------

class Logged(torch.Tensor):
    """Logs each torch call, then computes as a tensor does (results stay Logged)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"Logged:{_name(func)}")
        return super().__torch_function__(func, types, args, kwargs or {})


class LoggedChild(Logged):
    """A subclass of a subclass: inherits the override."""

    def twice(self) -> torch.Tensor:
        return self * 2


class AddIsSub(torch.Tensor):
    """Changes what `+` computes: add becomes sub."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
            func = torch.sub
        return super().__torch_function__(func, types, args, kwargs or {})


class PlainOut(torch.Tensor):
    """Every op returns a plain tensor (the override runs the op with subclass handling off)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Other(torch.Tensor):
    pass


class ToOther(torch.Tensor):
    """Tensor results come back as another subclass, Other."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return out.as_subclass(Other) if isinstance(out, torch.Tensor) else out


class Scaled(torch.Tensor):
    """No override; a method, a property and an instance attribute (`scale`) read in the frame."""

    def scaled(self) -> torch.Tensor:
        return self * self.scale

    @property
    def doubled(self) -> torch.Tensor:
        return self * 2


class MyParam(torch.nn.Parameter):
    """A Parameter subclass that computes as a Parameter."""


class LoggedParam(torch.nn.Parameter):
    """A Parameter subclass with its own torch-function override."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"LoggedParam:{_name(func)}")
        return super().__torch_function__(func, types, args, kwargs or {})


# ---- a __torch_dispatch__ wrapper subclass -----------------------------------------------------

class Wrapper(torch.Tensor):
    """Wraps an inner tensor (`_make_wrapper_subclass`); every aten op runs on the inner tensor and
    is logged, results rewrapped. Traceable the way torch.compile asks (__tensor_flatten__)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "Wrapper":  # type: ignore[misc]
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,  # type: ignore[attr-defined]
                                                   device=inner.device, requires_grad=inner.requires_grad)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Wrapper({self.inner!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):  # type: ignore[no-untyped-def]
        return Wrapper(inner_tensors["inner"])

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"Wrapper:{func}")
        args, kwargs = pytree.tree_map_only(Wrapper, lambda w: w.inner, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, Wrapper, out)


# ---- modes ------------------------------------------------------------------------------------

class LogMode(TorchFunctionMode):
    def __init__(self, tag: str = "mode") -> None:
        super().__init__()
        self.tag = tag

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"{self.tag}:{_name(func)}")
        return func(*args, **(kwargs or {}))


class MulForAdd(TorchFunctionMode):
    """Rewrites ops: add becomes mul."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
            func = torch.mul
        return func(*args, **(kwargs or {}))


class AtenLog(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"aten:{func}")
        return func(*args, **(kwargs or {}))


class NegateAdds(TorchDispatchMode):
    """Changes results: aten.add's result is negated."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        return -out if func is torch.ops.aten.add.Tensor else out


# ---- helpers for arguments ----------------------------------------------------------------------

def _t(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _as(cls: type, *shape: int, seed: int = 0, **attrs: Any) -> torch.Tensor:
    t = _t(*shape, seed=seed).as_subclass(cls)
    for k, v in attrs.items():
        setattr(t, k, v)
    return t


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[..., Any]
    make: Callable[[], tuple]
    around: Callable[[], Any] | None = None  # a context manager entered around both runs (a mode)
    grad: bool = False  # the result's sum is backpropagated; the inputs' grads compared


PROGRAMS: list[Program] = []


def program(make: Callable[[], tuple], around: Callable[[], Any] | None = None, grad: bool = False,
            name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        PROGRAMS.append(Program(name or fn.__name__, fn, make, around, grad))
        return fn
    return add


# ---- __torch_function__ subclass inputs ---------------------------------------------------------

@program(lambda: (_as(Logged, 3, 4),))
def logged_input_ops(x):
    return x + 1, x.sin().sum(0)


@program(lambda: (_as(Logged, 3, 4), _t(3, 4, seed=1)))
def logged_with_plain(x, y):
    return torch.add(y, x) * 2


@program(lambda: (_as(AddIsSub, 4), _t(4, seed=1)))
def add_becomes_sub(x, y):
    return x + y, torch.add(x, y), y.mul(3)


@program(lambda: (_as(PlainOut, 4),))
def override_returns_plain(x):
    y = x * 2
    return y, type(y) is torch.Tensor


@program(lambda: (_as(ToOther, 2, 3),))
def override_returns_other(x):
    y = x.cos()
    return y, isinstance(y, Other)


@program(lambda: (_as(LoggedChild, 3),))
def subclass_of_subclass(x):
    return x.twice() + 1, isinstance(x, Logged), type(x).__name__


@program(lambda: (_as(Scaled, 3, scale=3.0),))
def attribute_read(x):
    return x * x.scale


@program(lambda: (_as(Scaled, 3, scale=2.5),))
def method_on_subclass(x):
    return x.scaled() - 1


@program(lambda: (_as(Scaled, 3, scale=2.5),))
def property_on_subclass(x):
    return x.doubled + x


@program(lambda: (_as(Scaled, 2, 2, scale=1.5),))
def isinstance_branch(x):
    if isinstance(x, Scaled):
        return x + 1
    return x - 1


@program(lambda: (_as(Scaled, 2, 2, scale=1.5),))
def type_is_check(x):
    return (x * 2, type(x) is Scaled, type(x) is torch.Tensor)


@program(lambda: (_as(Logged, 4),))
def disable_subclass_block(x):
    with torch._C.DisableTorchFunctionSubclass():
        y = x + 1
    return y, type(y).__name__


@program(lambda: (_as(Logged, 4),))
def overrides_helpers(x):
    return (torch.overrides.has_torch_function((x,)), torch.overrides.is_tensor_like(x),
            torch.overrides.has_torch_function_unary(x), x * 3)


@program(lambda: (_t(4),))
def overrides_helpers_plain(x):
    return torch.overrides.has_torch_function((x,)), x * 3


@program(lambda: (_as(Logged, 3, 3),))
def logged_functional(x):
    return F.relu(x) + torch.softmax(x, -1)


@program(lambda: (_as(Logged, 3),))
def logged_inplace(x):
    x.add_(1)
    return x


@program(lambda: (_as(Scaled, 3, scale=2.0),))
def attribute_write_in_frame(x):
    x.scale = 4.0
    return x * 2


# ---- subclasses made in the frame ----------------------------------------------------------------

@program(lambda: (_t(3, 4),))
def as_subclass_in_frame(x):
    y = x.as_subclass(Logged)
    return y * 2, type(y) is Logged


@program(lambda: (_t(3),))
def as_subclass_with_attribute(x):
    y = x.as_subclass(Scaled)
    y.scale = 2.0
    return y.scaled()


@program(lambda: (_t(3),))
def as_subclass_addsub(x):
    return x.as_subclass(AddIsSub) + x


@program(lambda: (_t(3),))
def as_subclass_result_type(x):
    return x.as_subclass(Other)


@program(lambda: (_t(2, 3),))
def make_subclass_ctor(x):
    return torch.Tensor._make_subclass(Other, x) + 1


# ---- parameters, buffers, modules ----------------------------------------------------------------

class ParamModule(torch.nn.Module):
    def __init__(self, kind: type) -> None:
        super().__init__()
        self.weight = kind(_t(4, 3, seed=2))
        self.register_buffer("shift", torch.nn.Buffer(_t(4, seed=3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.shift


@program(lambda: (ParamModule(MyParam), _t(2, 3)))
def parameter_subclass_module(m, x):
    return m(x), type(m.weight).__name__


@program(lambda: (ParamModule(LoggedParam), _t(2, 3)))
def logged_parameter_module(m, x):
    return m(x)


class BufferModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.buf = torch.nn.Buffer(_t(3, seed=4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.buf


@program(lambda: (BufferModule(), _t(3)))
def buffer_module(m, x):
    return m(x), isinstance(m.buf, torch.nn.Buffer)


class ReturnsSubclass(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).as_subclass(Logged)


@program(lambda: (ReturnsSubclass(), _t(3)))
def module_returns_subclass(m, x):
    return m(x)


@program(lambda: (ReturnsSubclass(), _t(3)))
def module_subclass_then_ops(m, x):
    y = m(x)
    return y + 1


# ---- grads through subclasses --------------------------------------------------------------------

@program(lambda: (_as(Logged, 3, 2).requires_grad_(),), grad=True)
def grad_through_logged(x):
    return (x * x).sum(0)


@program(lambda: (_as(AddIsSub, 3).requires_grad_(), _t(3, seed=1).requires_grad_()), grad=True)
def grad_through_addsub(x, y):
    return (x + y) * y


@program(lambda: (_t(3).requires_grad_(),), grad=True)
def grad_as_subclass_in_frame(x):
    return x.as_subclass(Logged).exp()


# ---- modes --------------------------------------------------------------------------------------

@program(lambda: (_t(3),), around=lambda: LogMode("outer"))
def mode_around_call(x):
    return x + 1, torch.sin(x)


@program(lambda: (_t(3),), around=lambda: MulForAdd())
def rewriting_mode_around_call(x):
    return x + 2


@program(lambda: (_t(3),))
def mode_inside_frame(x):
    with LogMode("inner"):
        y = x + 1
    return y * 2


@program(lambda: (_t(3),))
def rewriting_mode_inside_frame(x):
    with MulForAdd():
        y = x + 3
    return y - 1


@program(lambda: (_t(3),))
def nested_modes_inside_frame(x):
    with LogMode("a"):
        with LogMode("b"):
            y = x.cos()
        z = y + 1
    return z


@program(lambda: (_t(3),), around=lambda: LogMode("outer"))
def nested_mode_inside_and_around(x):
    with LogMode("inner"):
        y = x * 2
    return y + 1


@program(lambda: (_as(Logged, 3),), around=lambda: LogMode("outer"))
def mode_and_subclass(x):
    return x + 1


@program(lambda: (_t(3),), around=lambda: AtenLog())
def dispatch_mode_around_call(x):
    return (x + 1).sin()


@program(lambda: (_t(3),), around=lambda: NegateAdds())
def dispatch_mode_changes_results(x):
    return x + 1


@program(lambda: (_t(3),))
def dispatch_mode_inside_frame(x):
    with AtenLog():
        y = x * 2
    return y + 1


@program(lambda: (_t(3),))
def dispatch_mode_rewrites_inside_frame(x):
    with NegateAdds():
        y = x + 2
    return y * 3


# ---- the wrapper subclass -----------------------------------------------------------------------

@program(lambda: (Wrapper(_t(3)),))
def wrapper_input(x):
    return x * 2 + 1


@program(lambda: (_t(3),))
def wrapper_made_in_frame(x):
    w = Wrapper(x)
    return (w + 1).inner


@program(lambda: (Wrapper(_t(2, 3)), _t(2, 3, seed=1)))
def wrapper_with_plain(x, y):
    return x + y, type(x + y).__name__


# ---- subclasses reached other ways than as an argument ------------------------------------------

GLOBAL_LOGGED = _as(Logged, 3, seed=5)
GLOBAL_ADDSUB = _as(AddIsSub, 3, seed=6)


@program(lambda: (_t(3),))
def subclass_global(x):
    return x + GLOBAL_LOGGED, GLOBAL_ADDSUB + x


def _closure_program() -> Callable[..., Any]:
    held = _as(AddIsSub, 3, seed=7)

    def subclass_in_closure(x):
        return held + x
    return subclass_in_closure


program(lambda: (_t(3),), name="subclass_in_closure")(_closure_program())


@program(lambda: ([_as(Logged, 3), _t(3, seed=1)],))
def subclass_in_list(xs):
    return xs[0] * xs[1], [type(x).__name__ for x in xs]


@program(lambda: ({"a": _as(AddIsSub, 3), "b": _t(3, seed=1)},))
def subclass_in_dict(d):
    return d["a"] + d["b"]


class HoldsSubclass(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = _as(AddIsSub, 3, seed=8)  # a plain attribute, not a parameter or buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table + x


@program(lambda: (HoldsSubclass(), _t(3)))
def subclass_module_attribute(m, x):
    return m(x)


def _make_logged(x: torch.Tensor) -> torch.Tensor:
    return x.as_subclass(Logged)


@program(lambda: (_t(3),))
def subclass_from_callee(x):
    y = _make_logged(x)
    return y + 1, type(y).__name__


@program(lambda: (_t(3),))
def subclass_then_plain_ops(x):
    y = x.as_subclass(AddIsSub)
    z = y.as_subclass(torch.Tensor)
    return z + x, y + x


# ---- plain tensors: attributes, flags, Parameter and Buffer made in the frame --------------------

def _tagged() -> tuple:
    t = _t(3)
    t.meta = {"scale": 2.0}
    return (t,)


@program(_tagged)
def plain_tensor_attribute(x):
    return x * x.meta["scale"], hasattr(x, "meta")


@program(lambda: (_t(3),))
def plain_tensor_attribute_absent(x):
    return x * 2, hasattr(x, "meta")


@program(lambda: (_t(3),))
def parameter_made_in_frame(x):
    p = torch.nn.Parameter(x * 2)
    return p, isinstance(p, torch.nn.Parameter), type(p).__name__


@program(lambda: (_t(3),))
def buffer_made_in_frame(x):
    b = torch.nn.Buffer(x * 2)
    return b, isinstance(b, torch.nn.Buffer), type(b).__name__


@program(lambda: (_t(3),))
def isinstance_parameter_of_plain(x):
    return isinstance(x, torch.nn.Parameter), isinstance(x, torch.nn.Buffer), isinstance(x * 2, torch.nn.Buffer)


def _flagged() -> tuple:
    t = _t(3)
    t._is_param = True
    return (t,)


@program(_flagged)
def plain_tensor_flagged_as_parameter(x):
    return isinstance(x, torch.nn.Parameter), isinstance(x, (int, torch.nn.Parameter)), x + 1


@program(lambda: (torch.nn.Parameter(_t(3)),))
def parameter_input_checks(p):
    return isinstance(p, torch.nn.Parameter), type(p) is torch.nn.Parameter, p * 2


@program(lambda: (MyParam(_t(3)),))
def parameter_subclass_input(p):
    return isinstance(p, torch.nn.Parameter), type(p).__name__, p * 2


# ---- torch function state --------------------------------------------------------------------------

@program(lambda: (_t(3),))
def disable_torch_function_plain(x):
    with torch._C.DisableTorchFunction():
        y = x + 1
    return y * 2


@program(lambda: (_t(3),))
def disable_subclass_plain(x):
    with torch._C.DisableTorchFunctionSubclass():
        y = x.cos()
    return y + 1


@program(lambda: (_t(3),), around=lambda: LogMode("outer"))
def disable_torch_function_under_mode(x):
    with torch._C.DisableTorchFunction():
        y = x + 1
    return y * 2


@program(lambda: (_t(3),))
def torch_function_enabled_query(x):
    return torch._C._is_torch_function_enabled(), x + 1


@program(lambda: (_t(3),))
def mode_entered_by_hand(x):
    mode = LogMode("hand")
    mode.__enter__()
    try:
        y = x * 3
    finally:
        mode.__exit__(None, None, None)
    return y + 1


@program(lambda: (_t(3),))
def mode_stack_query(x):
    with LogMode("q"):
        n = torch._C._len_torch_function_stack()
    return x + n


@program(lambda: (_t(3),))
def mode_then_subclass_in_frame(x):
    with LogMode("m"):
        y = x.as_subclass(Logged) + 1
    return y


@program(lambda: (_t(3),), around=lambda: torch.device("cpu"))
def device_context_around(x):
    return x + torch.ones(3)


@program(lambda: (_t(3),), around=lambda: torch.device("cpu"))
def device_context_and_user_mode(x):
    with LogMode("inner"):
        return x + torch.ones(3)


# ---- dispatch subclasses and modes, more --------------------------------------------------------

@program(lambda: (Wrapper(_t(3)),))
def wrapper_isinstance(x):
    return isinstance(x, Wrapper), x.inner + 1


@program(lambda: (Wrapper(_t(3)).requires_grad_(),), grad=True)
def wrapper_grad(x):
    return x * 3


@program(lambda: (_t(3),), around=lambda: AtenLog())
def dispatch_mode_around_callee(x):
    return _make_logged(x) + 1


@program(lambda: (_t(3).requires_grad_(),), around=lambda: AtenLog(), grad=True)
def dispatch_mode_around_backward(x):
    return (x * x).sum()


# ---- objects that are not tensors but take part in torch's override protocol ---------------------

class Duck:
    """Not a tensor: torch functions given one call its __torch_function__ (which logs and answers
    with the plain computation on its `value`)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        LOG.append(f"Duck:{_name(func)}")
        args, kwargs = pytree.tree_map_only(Duck, lambda d: d.value, (args, kwargs or {}))
        return func(*args, **kwargs)


@program(lambda: (_t(3), Duck(_t(3, seed=1))))
def duck_torch_function(x, d):
    return torch.add(x, d), torch.mul(d, 2)


@program(lambda: (_t(3), Duck(_t(3, seed=1))))
def duck_tensor_operator(x, d):
    return x + d, x * d


@program(lambda: (_t(3), Duck(_t(3, seed=1))))
def duck_functional(x, d):
    return F.relu(d), torch.cat([x, d])


def _aware(x: Any) -> Any:
    """A function written to take part in the protocol, as torch's own Python functions are."""
    if torch.overrides.has_torch_function_unary(x):
        return torch.overrides.handle_torch_function(_aware, (x,), x)
    return x * 2 + 1


@program(lambda: (_t(3),))
def handle_torch_function_plain(x):
    return _aware(x)


@program(lambda: (_as(Logged, 3),))
def handle_torch_function_subclass(x):
    return _aware(x)


@program(lambda: (_t(3), Duck(_t(3, seed=1))))
def handle_torch_function_duck(x, d):
    return _aware(d), x


@program(lambda: (_t(3),))
def tensor_torch_function_called(x):
    return torch.Tensor.__torch_function__(torch.add, (torch.Tensor,), (x, 1), {})


class RaisesOnMul(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__):
            raise TypeError("RaisesOnMul: no products")
        return super().__torch_function__(func, types, args, kwargs or {})


@program(lambda: (_as(RaisesOnMul, 3),))
def override_raises(x):
    y = x + 1
    return y * 2


class NotImpl(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return NotImplemented


@program(lambda: (_as(NotImpl, 3), _t(3)))
def override_not_implemented(x, y):
    return torch.add(y, x)


class RaisingMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in (torch.sin, torch.Tensor.sin):
            raise RuntimeError("RaisingMode: no sin")
        return func(*args, **(kwargs or {}))


@program(lambda: (_t(3),), around=lambda: RaisingMode())
def mode_raises_around(x):
    return (x + 1).sin()


@program(lambda: (_t(3),))
def mode_raises_inside(x):
    y = x * 2
    try:
        with RaisingMode():
            y = y.sin()
    except RuntimeError as e:
        return y, str(e)
    return y, ""


@program(lambda: (_as(Logged, 2, 3),))
def subclass_shape_queries(x):
    return x.shape, x.size(0), x.dim(), x.numel(), len(x)


@program(lambda: (_as(Scaled, 2, 3, scale=2.0),))
def subclass_to_plain_then_compute(x):
    y = x.as_subclass(torch.Tensor)
    return y.sum() * 3, type(y).__name__


class BufferSubclassModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", _as(Logged, 3, seed=9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table


@program(lambda: (BufferSubclassModule(), _t(3)))
def subclass_buffer(m, x):
    return m(x)


@program(lambda: (_t(3), Duck(_t(3, seed=1))))
def override_queries(x, d):
    return (torch.overrides.is_tensor_like(d), torch.overrides.is_tensor_like(x), torch.overrides.is_tensor_like(3),
            torch.overrides.has_torch_function((x, d)), torch.overrides.has_torch_function_unary(d),
            torch.overrides.has_torch_function_variadic(x, 1), torch.overrides.has_torch_function_variadic(x, d),
            torch._C._has_torch_function((x, torch.nn.Parameter(x))), x + 1)


@program(lambda: (_t(3),), around=lambda: torch.device("cpu"))
def override_queries_under_device(x):
    return (torch.overrides.has_torch_function((x,)), torch.overrides.has_torch_function_unary(x),
            torch.overrides.is_tensor_like(x), x + 1)


@program(lambda: (_t(3),), around=lambda: torch.device("cpu"))
def handle_torch_function_under_device(x):
    return _aware(x) + torch.ones(3)


# ---- Parameter subclasses with methods, properties, attributes -----------------------------------

class TaggedParam(torch.nn.Parameter):
    """A Parameter subclass computing as one, with its own constructor, method and property."""

    def __new__(cls, data: torch.Tensor, tag: str = "w") -> "TaggedParam":  # type: ignore[misc]
        made = super().__new__(cls, data)
        made.tag = tag
        return made

    def halved(self) -> torch.Tensor:
        return self / 2

    @property
    def norm_sq(self) -> torch.Tensor:
        return (self * self).sum()


class TaggedModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = TaggedParam(_t(3, seed=10), tag="scale")
        self.w.lr_mult = 0.5

    def forward(self, x: torch.Tensor) -> Any:
        return x * self.w.halved() + self.w.norm_sq * self.w.lr_mult, self.w.tag, isinstance(self.w, TaggedParam)


@program(lambda: (TaggedModule(), _t(3)))
def parameter_subclass_methods(m, x):
    return m(x)


@program(lambda: (TaggedModule(), _t(3)), grad=True)
def parameter_subclass_grad(m, x):
    out = m(x)[0]
    return out, m.w


@program(lambda: (TaggedModule(), _t(3)))
def parameter_subclass_attribute_write(m, x):
    m.w.lr_mult = 2.0
    return x * m.w.lr_mult


@program(lambda: (_t(3),))
def parameter_subclass_made_in_frame(x):
    p = TaggedParam(x * 2, tag="new")
    return p.halved(), p.tag, type(p).__name__


# ---- torch function state across breaks, subclasses constructed by their class ---------------------

@torch.compiler.disable
def _opaque_break(x: torch.Tensor) -> torch.Tensor:
    """Run natively (a graph break at the call, as torch.compile's own disable)."""
    return x * 1


@program(lambda: (_t(3),))
def disabled_state_across_break(x):
    with torch._C.DisableTorchFunctionSubclass():
        y = _opaque_break(x)
        return torch._C._is_torch_function_enabled(), y + 1


@program(lambda: (_t(3),))
def all_disabled_state_restored(x):
    with torch._C.DisableTorchFunction():
        inside = torch._C._is_torch_function_all_disabled()
    return inside, torch._C._is_torch_function_all_disabled(), x + 1


@program(lambda: (_t(3),))
def nested_disable_state(x):
    with torch._C.DisableTorchFunctionSubclass():
        with torch._C.DisableTorchFunctionSubclass():
            x = x + 1
        return torch._C._is_torch_function_enabled(), x * 2


@program(lambda: (_t(2, 2),))
def subclass_class_called(x):
    return Logged(torch.add(x, 1.0)) * 2


@program(lambda: (Duck(_t(3)), Duck(_t(3, seed=1))))
def duck_in_list_argument(a, b):
    return torch.stack([a, b])


@program(lambda: (_t(3),))
def subclass_type_compared(x):
    y = x.as_subclass(Other)
    return type(y) is Other, isinstance(y, Other), type(x) is Other


@program(lambda: (_t(3),))
def dispatch_mode_entered_by_hand(x):
    y = x + 1
    mode = AtenLog()
    mode.__enter__()
    try:
        z = y * 3
    finally:
        mode.__exit__(None, None, None)
    return z - 1


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(_t(2, 3, seed=11))
            self.lin.bias.copy_(_t(2, seed=12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + 1


@program(lambda: (Small(), _t(2, 3)), around=lambda: NegateAdds())
def module_under_dispatch_mode(m, x):
    return m(x)


@program(lambda: (Small(), _t(2, 3)), around=lambda: LogMode("mod"))
def module_under_function_mode(m, x):
    return m(x)


class _Marked:
    pass


def _marked_instance() -> Any:
    made = _Marked()
    made.__torch_function__ = lambda *a, **k: NotImplemented  # type: ignore[attr-defined]
    return made


@program(lambda: (_t(3), _marked_instance()))
def override_queries_of_classes(x, marked):
    return (torch.overrides.has_torch_function((Duck,)), torch.overrides.is_tensor_like(Duck),
            torch.overrides.is_tensor_like(torch.Tensor), torch.overrides.has_torch_function((torch.Tensor,)),
            torch.overrides.has_torch_function_unary(marked), torch.overrides.is_tensor_like(marked),
            torch.overrides.is_tensor_like(_Marked), torch.overrides.has_torch_function((x, int)), x + 1)


# ---- the mode stacks as the program sees them ---------------------------------------------------

@program(lambda: (_t(3),))
def mode_stack_queries_plain(x):
    from torch.utils._python_dispatch import _get_current_dispatch_mode, is_in_torch_dispatch_mode
    return (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(),
            _get_current_dispatch_mode() is None, is_in_torch_dispatch_mode(),
            len(torch.overrides._get_current_function_mode_stack()), torch._C._is_torch_function_mode_enabled(),
            x + 1)


@program(lambda: (_t(3),), around=lambda: torch.device("cpu"))
def mode_stack_queries_under_device(x):
    return torch._C._len_torch_function_stack(), len(torch.overrides._get_current_function_mode_stack()), x + 1


class RegistersBuffer(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.extra = torch.nn.Buffer(x * 2)
        return self.extra + 1


@program(lambda: (RegistersBuffer(), _t(3)))
def buffer_assigned_in_forward(m, x):
    out = m(x)
    return out, list(m._buffers), isinstance(m.extra, torch.nn.Buffer), type(m.extra).__name__


class RegistersParameter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.extra = torch.nn.Parameter(x * 2)
        return self.extra + 1


@program(lambda: (RegistersParameter(), _t(3)))
def parameter_assigned_in_forward(m, x):
    out = m(x)
    return out, list(m._parameters), type(m.extra).__name__
