"""torch.optim optimizers during capture: `_init_group` runs for real, the rest of `step` is traced.

Every torch optimizer's `step` starts each parameter group with `self._init_group(group, lists...)`:
Python that walks the group's parameters, reads each `.grad`, creates the state tensors on the
first step (lazy initialisation) and appends parameters, gradients and state to the lists the update
then works on. Traced, the first step would create the state inside its graph and the second would
recompile on the state the first one made. As torch.compile does, capture calls `_init_group` for
real at trace time (what it creates is what eager's first step creates: zeros, step counters) and
hands the traced update lists whose every tensor is read from where it lives: the parameter from
`param_groups[i]['params'][j]`, its gradient from `.grad`, its state from `state[parameter][key]`;
each a graph input with its source and its guard. So the first compiled call initialises the state
and later calls reuse its graph. Corresponds to torch/_dynamo/variables/optimizer.py.
"""
from __future__ import annotations

import collections
import inspect
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import AttrSource, ItemSource, ObjectKeySource, Source
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.trace_rules import NATIVE_FUNCTIONS
from kiln.capture.variables.builder import OBJECT_WRAPPERS
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.sequence import ListVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.user_object import ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


def torch_init_group(kind: type) -> types.FunctionType | None:
    """The `_init_group` of an optimizer class when it is torch's own (its reads are known: the
    group's flags, each parameter's `.grad` and state); None for any other (traced as written)."""
    fn = inspect.getattr_static(kind, "_init_group", None)
    # torch.compile, once used in the process, wraps it in a disable wrapper that keeps the original
    fn = getattr(fn, "_torchdynamo_orig_callable", fn)
    if isinstance(fn, types.FunctionType) and (fn.__module__ or "").startswith("torch.optim."):
        return fn
    return None


def is_fused_step(fn: types.FunctionType) -> bool:
    """torch.optim's drivers of the fused kernels (`_fused_adam`, `_fused_sgd`, ...): never traced,
    as torch.compile leaves them out (each is one native kernel over all the parameters already)."""
    return (fn.__module__ or "").startswith("torch.optim.") and fn.__name__.startswith("_fused_")


class OptimizerVariable(ObjectVariable):
    """A `torch.optim.Optimizer` from outside the frame: an object read attribute by attribute,
    except that its `_init_group` is run for real (InitGroupVariable)."""

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if self.source is None or tx.side_effects.pending_attr(self.value, name) is not None:
            return super().getattr(tx, name)
        if name == "_init_group" and torch_init_group(type(self.value)) is not None \
                and "_init_group" not in vars(self.value):
            return InitGroupVariable(self)
        state = vars(self.value).get("state")
        if name == "state" and type(state) is collections.defaultdict:
            source = AttrSource(self.source, "state")
            tx.state.output.guards.append(Guard(source.name(), "check_type", collections.defaultdict))
            return OptimizerStateVariable(state, source)
        return super().getattr(tx, name)


class OptimizerStateVariable(Variable):
    """`optimizer.state`: a defaultdict keyed by the parameters (hashed by identity). The step
    reads one parameter's entry at a time (`self.state[p]`, where SGD keeps its momentum buffer),
    read from `state[<p's source>]`: no scan of the keys, no guard on the other entries. An entry
    the trace would create (defaultdict's insertion), and any other use of the dict, is a break."""

    def __init__(self, value: collections.defaultdict, source: Source) -> None:
        self.value = value
        self.source = source
        self.state_source = source

    def describe(self) -> str:
        return "optimizer state"

    def python_type(self) -> type:
        return type(self.value)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        key = args[0] if len(args) == 1 and not kwargs else None
        real = key.real() if isinstance(key, TensorVariable) else None
        if name in ("__getitem__", "get", "__contains__") and real is not None and key is not None \
                and key.source is not None:
            entry = dict.get(self.value, real)
            where = ObjectKeySource(self.state_source, key.source)
            if name == "__contains__":
                tx.state.output.guards.append(Guard(f"{key.source.name()} in {self.state_source.name()}", "check_shape",
                                                    "whether a parameter has optimizer state"))
                return ConstantVariable(entry is not None)
            if entry is not None:
                return tx.wrap(entry, where)
        raise Unsupported(f"optimizer state: {name} (only reading a parameter's existing entry is traced)",
                          kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("__getitem__", "get", "__contains__"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of the optimizer state", kind="unsupported_attribute")


class _ReadRecorder(dict):
    """A copy of a parameter group that remembers which keys were read (each read is guarded)."""

    def __init__(self, group: dict) -> None:
        super().__init__(group)
        self.read: list[Any] = []

    def __getitem__(self, key: Any) -> Any:
        self.read.append(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.append(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.append(key)
        return super().__contains__(key)


class InitGroupVariable(Variable):
    """`optimizer._init_group`, bound: calling it runs it for real and fills the traced lists."""

    def __init__(self, opt: OptimizerVariable) -> None:
        self.opt = opt

    def describe(self) -> str:
        return f"method _init_group of {self.opt.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        opt = self.opt.value
        group_var = args[0] if args else kwargs.get("group")
        index = self._group_index(tx, group_var)
        lists = [*args[1:], *(v for k, v in kwargs.items() if k != "group")]
        if index is None or not all(isinstance(v, ListVariable) and v.source is None and not v.items for v in lists):
            # not the shape torch's step calls it with: trace its Python as written
            return ObjectVariable.getattr(self.opt, tx, "_init_group").call(tx, args, kwargs)
        group = opt.param_groups[index]
        assert isinstance(group_var, DictVariable) and group_var.source is not None  # _group_index checked
        recorder = _ReadRecorder(group)
        real_lists: list[list[Any]] = [[] for _ in lists]
        positional = real_lists[:max(len(args) - 1, 0)]
        named = dict(zip([k for k in kwargs if k != "group"], real_lists[len(positional):]))
        try:
            with torch.set_grad_enabled(tx.state.grad_enabled):
                result = opt._init_group(recorder, *positional, **named)
        except Exception as exc:  # raised again where the glue calls it natively
            raise Unsupported(f"{type(opt).__name__}._init_group raised {type(exc).__name__}: {exc} "
                              "(raised natively)", kind="unsupported_call") from exc
        if dict.keys(recorder) != group.keys() or any(dict.__getitem__(recorder, k) is not group[k] for k in group):
            raise Unsupported(f"{type(opt).__name__}._init_group changed its parameter group",
                              kind="unsupported_call")
        places = self._read_group(tx, group, group_var.source)
        self._guard_flags(tx, group, recorder.read, group_var.source)
        for var, real in zip(lists, real_lists):
            assert isinstance(var, ListVariable)  # checked above
            var.items.extend(self._place(tx, item, places) for item in real)
        flags = result if isinstance(result, tuple) else (result,)
        if not all(is_constant_value(flag) for flag in flags):
            raise Unsupported(f"{type(opt).__name__}._init_group returned a {type(result).__name__}",
                              kind="unsupported_call")
        # what torch's return (has_complex, has_sparse_grad) follows from dtypes and layouts, guarded
        return tx.wrap_result(result)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.reconstruct(self.opt)}._init_group"

    def _group_index(self, tx: "Tracer", group_var: Variable | None) -> int | None:
        """The index of the parameter group `group_var` was read from, when it was read as
        `self.param_groups[i]` and the trace has not changed it (or anything of the optimizer)."""
        assert self.opt.source is not None  # OptimizerVariable.getattr made this only with one
        groups_source = AttrSource(self.opt.source, "param_groups")
        if not isinstance(group_var, DictVariable) or not isinstance(group_var.source, ItemSource) \
                or group_var.source.base != groups_source or not isinstance(group_var.source.key, int):
            return None
        if any(tx.side_effects.touches(AttrSource(self.opt.source, name)) for name in ("param_groups", "state")) \
                or tx.side_effects.pending_attr(self.opt.value, "param_groups") is not None:
            return None  # the step wrote into its groups or state before: the real ones are not the trace's
        index = group_var.source.key
        groups = self.opt.value.param_groups
        if not 0 <= index < len(groups):
            return None
        return index

    def _read_group(self, tx: "Tracer", group: dict, group_source: Source) -> dict[int, Variable]:
        """Wrap every parameter of the group, its gradient and its state tensors, each from its
        source (and so guarded), in the order a check should meet them: a parameter's `.grad` is
        checked before its state entry is read (`state[p]` adds an entry to the defaultdict when p
        has none, which only a parameter with a gradient may do, as eager's step does)."""
        state_source = AttrSource(self.opt.source, "state")  # type: ignore[arg-type]
        guards = tx.state.output.guards
        guards.append(Guard(state_source.name(), "check_type", type(self.opt.value.state)))
        places: dict[int, Variable] = {}
        params_source = ItemSource(group_source, "params")
        for j, param in enumerate(group["params"]):
            param_source = ItemSource(params_source, j)
            grad_source = AttrSource(param_source, "grad")
            grad = param.grad
            if grad is None:
                guards.append(Guard(grad_source.name(), "check_none"))
                continue
            places.setdefault(id(param), tx.wrap(param, param_source))
            places.setdefault(id(grad), tx.wrap(grad, grad_source))
            entry = dict.get(self.opt.value.state, param)
            if entry is None:
                continue  # the method read no state for it (SGD without momentum)
            entry_source = ObjectKeySource(state_source, param_source)
            guards.append(Guard(entry_source.name(), "check_type", type(entry)))
            guards.append(Guard(entry_source.name(), "check_keys", tuple(entry.keys())))
            for key, value in entry.items():
                if isinstance(value, torch.Tensor):
                    places.setdefault(id(value), tx.wrap(value, ItemSource(entry_source, key)))
        return places

    def _guard_flags(self, tx: "Tracer", group: dict, read: list[Any], group_source: Source) -> None:
        """Guard what the method read of the group: flags by value; numbers by sign (what it
        decides on, `momentum != 0`; a learning rate it reads only to initialise the state must
        not pin the graph to one rate); tensors (a tensor learning rate) by their metadata."""
        guards = tx.state.output.guards
        for key in dict.fromkeys(read):
            if key == "params" or key not in group:
                continue
            value = group[key]
            source = ItemSource(group_source, key)
            if isinstance(value, torch.Tensor):
                tx.wrap(value, source)
            elif type(value) is float:
                sign = (value > 0) - (value < 0)
                guards.append(Guard(f"(({source.name()} > 0) - ({source.name()} < 0)) == {sign}",
                                    "check_shape", f"the sign of {key!r} in the parameter group"))
            elif value is None:
                guards.append(Guard(source.name(), "check_none"))
            elif is_constant_value(value):
                guards.append(Guard(source.name(), "check_value", value))
            else:
                raise Unsupported(f"_init_group read {key!r} of its parameter group, a {type(value).__name__}",
                                  kind="unsupported_call")

    def _place(self, tx: "Tracer", item: Any, places: dict[int, Variable]) -> Variable:
        if item is None:
            return ConstantVariable(None)  # a state entry the method found missing: its keys are guarded
        found = places.get(id(item)) if isinstance(item, torch.Tensor) else None
        if found is None:
            raise Unsupported(f"{type(self.opt.value).__name__}._init_group listed a "
                              f"{type(item).__name__} that is not a parameter, gradient or state tensor",
                              kind="unsupported_call")
        return found


__all__ = ["InitGroupVariable", "OptimizerStateVariable", "OptimizerVariable", "is_fused_step", "torch_init_group"]


OBJECT_WRAPPERS.append((torch.optim.Optimizer, OptimizerVariable))
NATIVE_FUNCTIONS.append(is_fused_step)
