"""nn.Module instances during capture: attributes guarded, parameters and buffers as graph inputs,
`forward` inlined, and the containers (ModuleList, ModuleDict, Sequential) indexed and iterated.

A module is guarded by type and by its instance attribute names, not by identity (as torch.compile
inlining built-in modules: two instances of a class share a graph); each attribute the trace reads
is guarded where it is read (`self.training` by value, a parameter by its tensor metadata and read
as a graph input through its source, a submodule in turn by type), a container by its keys, and a
called module by having no hooks. Writes to module attributes go to the side-effect log.
Corresponds to torch/_dynamo/variables/nn_module.py (with inline_inbuilt_nn_modules: parameters
are inputs, never constants).
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.distributed import is_ddp
from kiln.capture.sources import AttrSource, ItemSource, Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict, torch.nn.ParameterList,
               torch.nn.ParameterDict)


def _has_hooks(m: torch.nn.Module) -> bool:
    from torch.nn.modules import module as module_mod

    local = (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks, getattr(m, "_backward_pre_hooks", {}))
    global_ = (module_mod._global_forward_hooks, module_mod._global_forward_pre_hooks,
               module_mod._global_backward_hooks, getattr(module_mod, "_global_backward_pre_hooks", {}))
    return any(local) or any(global_)


def _only_forward_hooks(m: torch.nn.Module) -> bool:
    """Hooks that capture can inline: the module's own forward (pre-)hooks, nothing global or
    backward, none that must run even when forward raises."""
    from torch.nn.modules import module as module_mod

    if m._backward_hooks or getattr(m, "_backward_pre_hooks", {}) or getattr(m, "_forward_hooks_always_called", {}):
        return False
    global_ = (module_mod._global_forward_hooks, module_mod._global_forward_pre_hooks,
               module_mod._global_backward_hooks, getattr(module_mod, "_global_backward_pre_hooks", {}))
    return not any(global_)


def _is_none(v: Variable) -> bool:
    return v.is_constant() and v.as_constant() is None


class NNModuleVariable(Variable):
    """An nn.Module reached from the frame (argument, global, attribute of another module)."""

    def __init__(self, module: torch.nn.Module, source: Source | None) -> None:
        self.module = module
        self.source = source

    def describe(self) -> str:
        return f"module {type(self.module).__name__}"

    def python_type(self) -> type:
        return type(self.module)

    def as_python_value(self) -> Any:
        return self.module

    def _child_source(self, table: str, name: str) -> Source | None:
        if self.source is None:
            return None
        return ItemSource(AttrSource(self.source, table), name)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import UserMethodVariable

        m = self.module
        pending = tx.side_effects.pending_attr(m, name)
        if pending is not None:
            return pending
        getattribute = inspect.getattr_static(type(m), "__getattribute__")
        if isinstance(getattribute, types.FunctionType):
            # A Python __getattribute__ on the module class is inlined; its
            # `super().__getattribute__(name)` comes back to generic_getattr.
            return UserMethodVariable(getattribute, self).call(tx, [tx.wrap(name, None)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx: "Tracer", name: str) -> Variable:
        """CPython's order for a module: a data descriptor of the class (a property), then the
        instance dict, then any other class attribute (a method wins over a same-named submodule),
        then `__getattr__`: nn.Module's reads _parameters, _buffers and _modules; a class's own is
        inlined. The instance dict's keys are guarded where the module was wrapped (builder)."""
        from kiln.capture.variables.functions import (BoundMethodVariable, UserMethodVariable, bind_class_attribute,
                                                      bind_python_descriptor)

        m = self.module
        kind = type(m)
        d = m.__dict__
        static = inspect.getattr_static(kind, name, _MISSING)
        if _torch_method(static) and (name in _INTROSPECTION or (isinstance(m, _CONTAINERS) and name in _CONTAINER_METHODS)):
            return BoundMethodVariable(self, name)
        data_descriptor = static is not _MISSING and (hasattr(type(static), "__set__") or hasattr(type(static), "__delete__"))
        if not data_descriptor and name in d:
            return tx.wrap(d[name], None if self.source is None else AttrSource(self.source, name))
        if static is not _MISSING:
            bound = bind_class_attribute(tx, static, self, kind, name)
            if bound is not None:
                return bound
            if type(static).__name__ in ("member_descriptor", "getset_descriptor") or not hasattr(type(static), "__get__"):
                # a slot, or a plain class value (`scale = 2.0`): read through the module as Python does
                return tx.wrap(getattr(m, name), None if self.source is None else AttrSource(self.source, name))
            bound = bind_python_descriptor(tx, static, self, kind, name)
            if bound is not None:
                return bound
            raise Unsupported(f"descriptor {name!r} of {kind.__qualname__}", kind="unsupported_attribute")
        getattr_fn = inspect.getattr_static(kind, "__getattr__", None)
        if isinstance(getattr_fn, types.FunctionType) and getattr_fn is not torch.nn.Module.__getattr__:
            return UserMethodVariable(getattr_fn, self).call(tx, [tx.wrap(name, None)], {})
        return self.table_getattr(tx, name)

    def table_getattr(self, tx: "Tracer", name: str) -> Variable:
        """nn.Module.__getattr__: the parameter, buffer or submodule `name`, else AttributeError."""
        d = self.module.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, {}):
                return tx.wrap(d[table][name], self._child_source(table, name))
        if self.source is not None:  # what the tables lacked is part of what the trace relied on
            for table in ("_parameters", "_buffers", "_modules"):
                if table in d:
                    self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(d[table].keys()))
        from kiln.capture.variables.exception import raise_in_trace
        message = f"{type(self.module).__name__!r} object has no attribute {name!r}"
        raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

        override = inspect.getattr_static(type(self.module), "__call__", None)
        if isinstance(override, types.FunctionType) and override is not torch.nn.Module.__call__:
            # a class's own __call__ is what calling the module runs (`5 * self.forward(x)`)
            guard_class_attribute(tx, type(self.module), "__call__", override, self)
            return UserMethodVariable(override, self).call(tx, args, kwargs)
        return self.call_impl(tx, args, kwargs)

    def call_impl(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Module.__call__: the hooks capture can inline around the forward (also reached by a
        class's own __call__ through `super().__call__`)."""
        if is_ddp(self.module):
            # DDP's forward drives its reducer from Python: it runs natively at the break, and the
            # glue compiles the module it wraps (kiln.capture.distributed.DDPModuleCall).
            raise Unsupported("DistributedDataParallel's forward runs natively; the module it wraps is "
                              "compiled as its own frame", kind="collective")
        if _has_hooks(self.module):
            if _only_forward_hooks(self.module):
                return self._call_with_forward_hooks(tx, args, kwargs)
            raise Unsupported(f"{type(self.module).__name__} has hooks; calling it runs them natively",
                              kind="unsupported_call")
        self._guard_no_hooks(tx)
        forward = self.getattr(tx, "forward")
        return forward.call(tx, args, kwargs)

    def _call_with_forward_hooks(self, tx: "Tracer", args: Sequence[Variable],
                                 kwargs: dict[str, Variable]) -> Variable:
        """Module.__call__ with forward pre-hooks and forward hooks, inlined in its order (what
        transformers installs to collect hidden states and attentions). The hook tables are
        guarded by their keys; each hook is read, and guarded, through its table."""
        from kiln.capture.variables.dict import DictVariable
        from kiln.capture.variables.sequence import TupleVariable

        m = self.module
        for table in ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks_always_called"):
            if hasattr(m, table) and self.source is not None:
                self._guard(tx, AttrSource(self.source, table), "check_len", 0)
        for table in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs"):
            if self.source is not None:
                self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(getattr(m, table).keys()))
        args_var: Variable = TupleVariable(list(args))
        kwargs_var: Variable = DictVariable(dict(kwargs))  # a hook may return anything: checked below
        for hook_id, hook in self._hooks(tx, "_forward_pre_hooks"):
            if hook_id in m._forward_pre_hooks_with_kwargs:
                result = hook.call(tx, [self, args_var, kwargs_var], {})
                if not _is_none(result):
                    args_var, kwargs_var = tx.iterate(result)
            else:
                result = hook.call(tx, [self, args_var], {})
                if not _is_none(result):
                    args_var = result if issubclass(result.python_type(), tuple) else TupleVariable([result])
        if not isinstance(kwargs_var, DictVariable):
            raise Unsupported("a forward pre-hook returned kwargs that are not a dict", kind="unsupported")
        forward = self.getattr(tx, "forward")
        output = forward.call(tx, tx.iterate(args_var), {k: v for k, v in kwargs_var.items.items()})
        for hook_id, hook in self._hooks(tx, "_forward_hooks"):
            if hook_id in m._forward_hooks_with_kwargs:
                result = hook.call(tx, [self, args_var, kwargs_var, output], {})
            else:
                result = hook.call(tx, [self, args_var, output], {})
            if not _is_none(result):
                output = result
        return output

    def _hooks(self, tx: "Tracer", table: str) -> list[tuple[int, Variable]]:
        hooks = getattr(self.module, table)
        table_source = None if self.source is None else AttrSource(self.source, table)
        if table_source is not None:
            self._guard(tx, table_source, "check_keys", tuple(hooks.keys()))
        return [(k, tx.wrap(h, None if table_source is None else ItemSource(table_source, k)))
                for k, h in hooks.items()]

    def _guard(self, tx: "Tracer", source: Source, kind: str, expected: Any) -> None:
        from kiln.capture.guards import Guard
        tx.state.output.guards.append(Guard(source.name(), kind, expected))

    def _guard_no_hooks(self, tx: "Tracer") -> None:
        # Another instance (or this one later) may have hooks the inlined forward would skip.
        if self.source is None:
            return
        for table in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if hasattr(self.module, table):
                self._guard(tx, AttrSource(self.source, table), "check_len", 0)

    # ------------------------------------------------------------------ containers
    def _children(self, tx: "Tracer") -> list[tuple[str, Variable]]:
        m = self.module
        table = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        if self.source is not None:  # the loop over them is unrolled: their names and number are baked
            self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(getattr(m, table).keys()))
        if table == "_parameters":
            return [(k, tx.wrap(v, self._child_source("_parameters", k))) for k, v in m._parameters.items()]
        return [(k, tx.wrap(v, self._child_source("_modules", k))) for k, v in m._modules.items()]

    def iterate(self, tx: "Tracer") -> list[Variable]:
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantVariable(k) for k, _ in self._children(tx)]
        if isinstance(self.module, _CONTAINERS):
            return [v for _, v in self._children(tx)]
        raise Unsupported(f"iterating over {type(self.module).__name__}", kind="unsupported_iter")

    def length(self, tx: "Tracer") -> Variable:
        if isinstance(self.module, _CONTAINERS):
            return ConstantVariable(len(self._children(tx)))
        raise Unsupported(f"len() of {type(self.module).__name__}", kind="unsupported_builtin")

    def truth(self, tx: "Tracer") -> bool:
        if isinstance(self.module, _CONTAINERS):
            return len(self._children(tx)) > 0
        return True

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        from kiln.capture.variables.sequence import ListVariable

        children = self._children(tx)
        index = key.as_constant()
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return dict(children)[index]
        if isinstance(index, slice):
            if isinstance(self.module, torch.nn.Sequential):
                raise Unsupported("slicing an nn.Sequential builds a new module", kind="unsupported_call")
            return ListVariable([v for _, v in children][index])
        if isinstance(self.module, _CONTAINERS):
            return [v for _, v in children][index]
        raise Unsupported(f"indexing {type(self.module).__name__}", kind="unsupported_call")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sequence import ListVariable, TupleVariable

        is_dict = isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict))
        if name == "__getitem__" and isinstance(self.module, _CONTAINERS):
            return self.getitem(tx, args[0])
        if name == "__len__" and isinstance(self.module, _CONTAINERS):
            return self.length(tx)
        if is_dict and name in ("keys", "values", "items"):
            children = self._children(tx)
            if name == "keys":
                return ListVariable([ConstantVariable(k) for k, _ in children])
            if name == "values":
                return ListVariable([v for _, v in children])
            return ListVariable([TupleVariable([ConstantVariable(k), v]) for k, v in children])
        if is_dict and name == "__contains__":
            return ConstantVariable(args[0].as_constant() in dict(self._children(tx)))
        if name in _INTROSPECTION and not args and not kwargs:
            return self._introspect(tx, name)
        if name == "__iter__" and isinstance(self.module, _CONTAINERS):
            from kiln.capture.variables.iterator import IteratorVariable
            return IteratorVariable(self.iterate(tx))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def _introspect(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.iterator import IteratorVariable
        from kiln.capture.variables.sequence import TupleVariable

        if self.source is None:
            raise Unsupported(f"{name}() of a module without a source", kind="unsupported_call")
        # What the walk saw (the names in each submodule's tables) is baked into the unrolled loop.
        for prefix, sub in self.module.named_modules(remove_duplicate=False):
            sub_source: Source = self.source
            for part in prefix.split(".") if prefix else []:
                sub_source = ItemSource(AttrSource(sub_source, "_modules"), part)
            for table in ("_modules", "_parameters", "_buffers"):
                self._guard(tx, AttrSource(sub_source, table), "check_keys", tuple(getattr(sub, table).keys()))
        items: list[Variable] = []
        pairs = list(getattr(self.module, name if name.startswith("named") else "named_" + name)())
        for qualified, value in pairs:
            source: Source = self.source
            parts = qualified.split(".") if qualified else []
            for n, part in enumerate(parts):
                last = n == len(parts) - 1
                table = "_modules"
                if last and isinstance(value, torch.Tensor):
                    owner = self.module.get_submodule(".".join(parts[:-1])) if n else self.module
                    table = "_parameters" if part in owner._parameters else "_buffers"
                source = ItemSource(AttrSource(source, table), part)
            var = tx.wrap(value, source)
            items.append(TupleVariable([ConstantVariable(qualified), var]) if name.startswith("named") else var)
        return IteratorVariable(items)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        return glue.constant(self.module)


_MISSING = object()


def _torch_method(static: Any) -> bool:
    """A method nn.Module (or one of torch's containers) defines, not a subclass's override."""
    return isinstance(static, types.FunctionType) and (static.__module__ or "").startswith("torch.nn.")
_INTROSPECTION = frozenset({"children", "modules", "parameters", "buffers", "named_children",
                            "named_parameters", "named_buffers", "named_modules"})
_CONTAINER_METHODS = frozenset({"__getitem__", "__len__", "keys", "values", "items", "__contains__",
                                "__iter__"})
