"""Writes to an nn container the frame built (`ml = nn.ModuleList([self.a]); ml.append(self.b)`,
`heads = nn.ModuleDict(); heads["b"] = self.b`, `seq.insert(0, m)`, `del ml[0]`, `md.pop("a")`).

Such a container is a real object made at trace time around the real children (module.py's
build_container), with the trace's variables for those children by name; the glue builds it anew on
each call around the children as they are then. A write runs the container's own method on the
real object (its index rules, its errors, raised in the trace as eager raises them), and the trace's
children are read back from the real table afterwards, so later reads in the trace and the glue's
rebuild see the children as eager's container holds them at the end of the frame. An argument that
is not a module the trace knows (or a constant index or key) is refused, as is any other method. A subclass that keeps torch's construction and attribute
protocol (and the method written) is built and written the same way.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.module import NNModuleVariable

_LIST_WRITES = frozenset({"append", "extend", "insert", "__setitem__", "__delitem__", "pop", "__iadd__"})
# the methods each container kind has that change its children
WRITES: dict[type, frozenset[str]] = {
    torch.nn.ModuleList: _LIST_WRITES,
    torch.nn.Sequential: _LIST_WRITES - {"__iadd__"},
    torch.nn.ModuleDict: frozenset({"__setitem__", "__delitem__", "pop", "update", "clear"}),
}


_OWN = ("__init__", "__new__", "__setattr__", "__getattr__", "__delattr__", "__getattribute__")


def container_base(cls: type) -> type | None:
    """The container kind (Sequential, ModuleList, ModuleDict) that `cls` is, or subclasses without
    changing how it is made or how its attributes are set and read (`class Blocks(nn.ModuleList)`
    with a forward of its own); None for anything else."""
    for base in WRITES:
        if isinstance(cls, type) and issubclass(cls, base):
            if all(inspect.getattr_static(cls, name, None) is inspect.getattr_static(base, name, None)
                   for name in _OWN):
                return base
            return None
    return None


def writes_of(cls: type) -> frozenset[str]:
    """The writes of WRITES that `cls` (a container kind or a subclass) has as torch defines them."""
    base = container_base(cls)
    if base is None:
        return frozenset()
    return frozenset(name for name in WRITES[base]
                     if inspect.getattr_static(cls, name, None) is inspect.getattr_static(base, name, None))


def write_built_container(tx: "Tracer", container: "NNModuleVariable", name: str, args: Sequence[Variable],
                          kwargs: dict[str, Variable]) -> Variable | None:
    """The result of `container.name(*args)` for a write to a container built in the frame, or None
    where `name` is no write of its kind."""
    from kiln.capture.variables.exception import raise_in_trace
    from kiln.capture.variables.module import NNModuleVariable

    module = container.module
    if name not in writes_of(type(module)):
        return None
    known: dict[int, Variable] = {id(child.module): child for _, child in container._built_children()
                                  if isinstance(child, NNModuleVariable)}

    def real(var: Variable) -> Any:
        if isinstance(var, NNModuleVariable):
            known.setdefault(id(var.module), var)
            return var.module
        if var.is_constant():
            value = var.as_constant()
            if isinstance(value, (int, str, slice, type(None))):
                return value
        raise Unsupported(f"{name} of a {type(module).__name__} built in the frame with {var.describe()}",
                          kind="unsupported_call")

    if kwargs:
        raise Unsupported(f"{name} of a built {type(module).__name__} with keywords", kind="unsupported_call")
    real_args: list[Any] = []
    for n, arg in enumerate(args):
        if name in ("extend", "__iadd__") and n == 0:  # a list, tuple or container of modules
            real_args.append([real(item) for item in tx.iterate(arg)])
        elif name == "update" and n == 0:
            real_args.append(_pairs(tx, arg, real))
        else:
            real_args.append(real(arg))
    try:
        result = getattr(module, name)(*real_args)
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        _resync(container, known)
        raise raise_in_trace(exc, f"{type(exc).__name__}: {exc} (raised natively)") from exc
    _resync(container, known)
    if result is module:
        return container
    if isinstance(result, torch.nn.Module):
        return known[id(result)]
    return ConstantVariable(result)


def _pairs(tx: "Tracer", arg: Variable, real: Any) -> list[tuple[Any, Any]]:
    """ModuleDict.update's argument (a dict, or an iterable of key-value pairs) as real pairs, in order."""
    from kiln.capture.variables.dict import DictVariable

    if isinstance(arg, DictVariable):
        return [(key, real(value)) for key, value in arg.items.items()]
    pairs = []
    for item in tx.iterate(arg):
        key, value = tx.iterate(item)
        pairs.append((real(key), real(value)))
    return pairs


def _resync(container: "NNModuleVariable", known: dict[int, Variable]) -> None:
    """The trace's children of `container` as its real table now holds them."""
    container.built_children = {key: known[id(child)] for key, child in container.module._modules.items()
                                if child is not None}
    if len(container.built_children) != len(container.module._modules):
        raise Unsupported(f"a None child in a built {type(container.module).__name__}", kind="unsupported_call")
