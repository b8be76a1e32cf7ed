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
from torch.nn.modules.lazy import LazyModuleMixin

from kiln.capture.distributed import is_ddp
from kiln.capture.guards import ABSENT, Guard
from kiln.capture.sources import AttrSource, GlobalSource, ItemSource, Source
from kiln.capture.variables.base import BoundMethodVariable, Variable, constant_args
from kiln.capture.variables.built_containers import container_base, write_built_container, writes_of
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute
from kiln.capture.variables.sequential_slice import SequentialSliceVariable
from kiln.capture.variables.slice import SliceVariable
from kiln.capture.variables.user_object import CLASS_CALLS, SUBCLASSES_TOO
from kiln.errors import RestartCapture, Unsupported

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
    """Hooks that capture can inline: forward (pre-)hooks, the module's own and global ones
    (register_module_forward_hook), nothing backward, none that must run even when forward raises."""
    from torch.nn.modules import module as module_mod

    if m._backward_hooks or getattr(m, "_backward_pre_hooks", {}) or getattr(m, "_forward_hooks_always_called", {}):
        return False
    global_ = (module_mod._global_backward_hooks, getattr(module_mod, "_global_backward_pre_hooks", {}),
               getattr(module_mod, "_global_forward_hooks_always_called", {}))
    return not any(global_)


# torch.nn.modules.module, whose global hook tables register_module_forward_hook & co. fill
_HOOKS_MODULE = GlobalSource("module", module="torch.nn.modules")
_GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                       "_global_backward_pre_hooks", "_global_forward_hooks_always_called")


def _global_hooks(tx: "Tracer", table: str) -> list[tuple[int, Variable]]:
    """The global forward (pre-)hooks of `table`, in the order Module.__call__ runs them (before
    the module's own), the table guarded by its keys."""
    hooks = getattr(torch.nn.modules.module, table)
    source = AttrSource(_HOOKS_MODULE, table)
    tx.state.output.guards.append(Guard(source.name(), "check_keys", tuple(hooks.keys())))
    return [(k, tx.wrap(h, ItemSource(source, k))) for k, h in hooks.items()]


def _guard_no_global_hooks(tx: "Tracer") -> None:
    """A module call traced without global hooks: a hook registered later (for every module, by
    register_module_forward_hook) must recompile, not be skipped by the inlined forward."""
    for table in _GLOBAL_HOOK_TABLES:
        if hasattr(torch.nn.modules.module, table):
            tx.state.output.guards.append(Guard(AttrSource(_HOOKS_MODULE, table).name(), "check_len", 0))


def _is_none(v: Variable) -> bool:
    return v.is_constant() and v.as_constant() is None


class NNModuleVariable(Variable):
    """An nn.Module reached from the frame (argument, global, attribute of another module)."""

    def __init__(self, module: torch.nn.Module, source: Source | None, pin: Any = None) -> None:
        self.module = module
        self.source = source
        # guarded by type only: `pin` adds the identity guard the first time the trace decides
        # something by which module it is (`a is b`, `l == self.l0`, a dict key, `in` a list)
        self.pin = pin
        # a container the frame built from modules it holds (`nn.Sequential(self.a, nn.ReLU())`):
        # its children as the trace knows them (with their sources), by name
        self.built_children: dict[str, Variable] | None = None
        self.built_written = False  # the trace set an attribute of that container

    def describe(self) -> str:
        return f"module {type(self.module).__name__}"

    def identity(self) -> Any:
        return self.module

    def pin_identity(self) -> None:
        pin, self.pin = self.pin, None
        if pin is not None:
            pin()

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
        if (self.built_children is not None or self.source is None) \
                and name in ("__dict__", "_modules", "_parameters", "_buffers"):
            # its tables hold the real children, not the trace's (a change to them is not followed);
            # a module made at trace time (`MyList()`) the same: a write there would be lost
            raise Unsupported(f"{name} of a {type(m).__name__} built in the frame", kind="unsupported_attribute")
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
        inlined. A name found anywhere but the instance dict is guarded absent from it (an instance
        attribute set later would win); one found there is guarded where it is read."""
        from kiln.capture.variables.functions import (UserMethodVariable, bind_class_attribute,
                                                      bind_python_descriptor)

        m = self.module
        kind = type(m)
        d = m.__dict__
        static = inspect.getattr_static(kind, name, _MISSING)
        data_descriptor = static is not _MISSING and (hasattr(type(static), "__set__") or hasattr(type(static), "__delete__"))
        deleted = tx.side_effects.deleted_attr(m, name)  # `del self.name` earlier in the trace
        if not data_descriptor and name in d and not deleted:
            return tx.wrap(d[name], None if self.source is None else AttrSource(self.source, name))
        if not data_descriptor and self.source is not None and not deleted:
            tx.output.note_absent(AttrSource(self.source, "__dict__"), name)
        if _torch_method(static) and (name in _INTROSPECTION or (isinstance(m, _CONTAINERS) and name in _CONTAINER_METHODS)
                                      or (self.built_children is not None and name in writes_of(kind))):
            return BoundMethodVariable(self, name)
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
            changed = self._changed_table(tx, table)
            if changed is not None:  # `register_buffer` earlier in the trace: the table as it is now
                key = ConstantVariable(name)
                if changed.call_method(tx, "__contains__", [key], {}).as_constant():
                    return changed.call_method(tx, "__getitem__", [key], {})
                continue
            if table == "_modules" and self.built_children is not None and name in self.built_children:
                return dict(self._built_children())[name]
            if name in d.get(table, {}):
                return tx.wrap(d[table][name], self._child_source(table, name))
        if self.source is not None:  # what the tables lacked is part of what the trace relied on
            for table in ("_parameters", "_buffers", "_modules"):
                if table in d:
                    self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(d[table].keys()))
        from kiln.capture.variables.exception import raise_in_trace
        message = f"{type(self.module).__name__!r} object has no attribute {name!r}"
        raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")

    def _refuse_changed_tables(self, tx: "Tracer", what: str, recurse: bool = True) -> None:
        """Unsupported when the trace registered or removed a parameter, buffer or submodule of this
        module (or, with `recurse`, of one below it): `what` reads the real tables, which do not
        have the change yet (it is replayed after the graph)."""
        if self.source is None:
            return
        tables = ("_parameters", "_buffers", "_modules")
        for changed in tx.side_effects.changed_containers_under(self.source):
            name = changed.source.name() if changed.source is not None else ""
            own = name in {s.name() for t in tables
                           for s in (AttrSource(self.source, t), ItemSource(AttrSource(self.source, "__dict__"), t))}
            if own or recurse and any(name.endswith((f".{t}", f"['{t}']")) for t in tables):
                raise Unsupported(f"{what} after the trace changed the module's {name.rsplit('.', 1)[-1]}",
                                  kind="unsupported")

    def _changed_table(self, tx: "Tracer", table: str) -> Variable | None:
        """The module's `table` dict as the trace changed it (read as `self._buffers` or through
        `self.__dict__`), or None when the trace did not change it."""
        if self.source is None:
            return None
        for source in (AttrSource(self.source, table), ItemSource(AttrSource(self.source, "__dict__"), table)):
            changed = tx.side_effects.changed_container(source)
            if changed is not None:
                return changed
        return None

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
        if _uninitialized_lazy(self.module):
            _initialize_lazy(self.module, args, kwargs)
        if is_ddp(self.module):
            # DDP's forward drives its reducer from Python: it runs natively at the break, and the
            # glue compiles the module it wraps (kiln.capture.distributed.DDPModuleCall).
            raise Unsupported("DistributedDataParallel's forward runs natively; the module it wraps is "
                              "compiled as its own frame", kind="collective")
        if isinstance(self.module, torch.nn.RNNBase) and args and _is_packed(args[0]):
            # the packed sequence's batch sizes (its lengths, on the CPU) drive the recurrence: read
            # inside the forward they broke it several times; run natively, it is one break
            raise Unsupported(f"{type(self.module).__name__} over a PackedSequence reads its batch sizes; "
                              "calling it runs natively", kind="data_dependent_shape")
        if _has_hooks(self.module) or any(self._traced_hook_table(tx, t) is not None
                                          for t in ("_forward_hooks", "_forward_pre_hooks")):
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
        module_mod = torch.nn.modules.module
        for table in ("_global_backward_hooks", "_global_backward_pre_hooks", "_global_forward_hooks_always_called"):
            if hasattr(module_mod, table):
                tx.state.output.guards.append(Guard(AttrSource(_HOOKS_MODULE, table).name(), "check_len", 0))
        global_with_kwargs = getattr(module_mod, "_global_forward_hooks_with_kwargs", {})
        tx.state.output.guards.append(Guard(AttrSource(_HOOKS_MODULE, "_global_forward_hooks_with_kwargs").name(),
                                            "check_keys", tuple(global_with_kwargs.keys())))
        for table in ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks_always_called"):
            if hasattr(m, table) and self.source is not None:
                self._guard(tx, AttrSource(self.source, table), "check_len", 0)
        for table in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs"):
            if self.source is not None:
                self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(getattr(m, table).keys()))
        args_var: Variable = TupleVariable(list(args))
        kwargs_var: Variable = DictVariable(dict(kwargs))  # a hook may return anything: checked below
        pre_hooks = [(False, k, h) for k, h in _global_hooks(tx, "_global_forward_pre_hooks")]
        pre_hooks += [(True, k, h) for k, h in self._hooks(tx, "_forward_pre_hooks")]
        for own, hook_id, hook in pre_hooks:
            if own and hook_id in m._forward_pre_hooks_with_kwargs:
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
        post_hooks = [(False, k, h) for k, h in _global_hooks(tx, "_global_forward_hooks")]
        post_hooks += [(True, k, h) for k, h in self._hooks(tx, "_forward_hooks")]
        for own, hook_id, hook in post_hooks:
            if hook_id in (m._forward_hooks_with_kwargs if own else global_with_kwargs):
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
        traced = self._traced_hook_table(tx, table)
        if traced is not None:
            # a hook removed (or added) earlier in this trace, by a hook's handle.remove() for one:
            # the table as the trace left it
            return [(k, v) for k, v in traced.items.items()]
        return [(k, tx.wrap(h, None if table_source is None else ItemSource(table_source, k)))
                for k, h in hooks.items()]

    def _traced_hook_table(self, tx: "Tracer", table: str) -> Any:
        """The module's hook dict `table` as a DictVariable the trace changed in place, else None."""
        from kiln.capture.variables.dict import DictVariable

        hooks = getattr(self.module, table, None)
        known = tx.state.wrapped.get(id(hooks)) if hooks is not None else None
        if known is None or known[0] is not hooks or not isinstance(known[1], DictVariable):
            return None
        return known[1] if tx.side_effects.mutated(known[1]) else None

    def _guard(self, tx: "Tracer", source: Source, kind: str, expected: Any) -> None:
        tx.state.output.guards.append(Guard(source.name(), kind, expected))

    def _guard_no_hooks(self, tx: "Tracer") -> None:
        # Another instance (or this one later) may have hooks the inlined forward would skip.
        _guard_no_global_hooks(tx)
        if self.source is None:
            return
        for table in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if hasattr(self.module, table):
                self._guard(tx, AttrSource(self.source, table), "check_len", 0)

    # ------------------------------------------------------------------ containers
    def _children(self, tx: "Tracer") -> list[tuple[str, Variable]]:
        from kiln.capture.variables.dict import DictVariable

        m = self.module
        table = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        changed = self._changed_table(tx, table)
        if isinstance(changed, DictVariable):
            # append, insert, `del layers[i]`, `d[k] = m` earlier in this forward: the children as
            # the trace left them (the real table is rewritten after the graph)
            return list(changed.items.items())
        if self.built_children is not None:
            return self._built_children()
        self._refuse_changed_tables(tx, f"the children of {type(m).__name__}", recurse=False)
        if self.source is not None:  # the loop over them is unrolled: their names and number are baked
            self._guard(tx, AttrSource(self.source, table), "check_keys", tuple(getattr(m, table).keys()))
        if table == "_parameters":
            return self._parameter_container_items(tx)
        return [(k, tx.wrap(v, self._child_source("_modules", k))) for k, v in m._modules.items()]

    def _built_children(self) -> list[tuple[str, Variable]]:
        """The children of a container built in the frame; one the trace changed since (its real
        table no longer has the names it was built with) is refused."""
        assert self.built_children is not None
        if list(self.module._modules) != list(self.built_children):
            raise Unsupported(f"a {type(self.module).__name__} built in the frame and changed there",
                              kind="unsupported_call")
        return list(self.built_children.items())

    def _parameter_container_items(self, tx: "Tracer") -> list[tuple[str, Variable]]:
        """A ParameterList's or ParameterDict's items in its own order: mostly parameters, but a
        value that is not a tensor (a float, a module) is kept as a plain attribute or a child
        module under the same name, which the container's own order (`_keys`, `_size`) lists."""
        m: Any = self.module
        names = list(m._keys) if isinstance(m, torch.nn.ParameterDict) else [str(i) for i in range(len(m))]
        if names == list(m._parameters):
            return [(k, tx.wrap(v, self._child_source("_parameters", k))) for k, v in m._parameters.items()]
        if self.source is not None:
            if isinstance(m, torch.nn.ParameterDict):
                self._guard(tx, AttrSource(self.source, "_keys"), "check_keys", tuple(m._keys))
            else:
                self._guard(tx, AttrSource(self.source, "_size"), "check_value", m._size)
        items = []
        for i, name in enumerate(names):
            attr = m._key_to_attr(name) if isinstance(m, torch.nn.ParameterDict) else name
            table = next((t for t in ("_parameters", "_modules", "_buffers") if attr in getattr(m, t)), None)
            source = self._child_source(table, attr) if table is not None else \
                None if self.source is None else AttrSource(self.source, attr)
            items.append((name if isinstance(m, torch.nn.ParameterDict) else str(i), tx.wrap(getattr(m, attr), source)))
        return items

    def iterate(self, tx: "Tracer") -> list[Variable]:
        override = self._override(tx, "__iter__")
        if override is not None:
            return tx.iterate(UserMethodVariable(override, self).call(tx, [], {}))
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantVariable(k) for k, _ in self._children(tx)]
        if isinstance(self.module, _CONTAINERS):
            return [v for _, v in self._children(tx)]
        getitem = self._override(tx, "__getitem__")
        if getitem is not None:
            return self._iterate_by_index(tx, getitem)
        raise Unsupported(f"iterating over {type(self.module).__name__}", kind="unsupported_iter")

    def _iterate_by_index(self, tx: "Tracer", getitem: types.FunctionType) -> list[Variable]:
        """The old iteration protocol of a class with `__getitem__` and no `__iter__`: self[0],
        self[1], ... until it raises IndexError (or StopIteration)."""
        from kiln.capture.variables.exception import RaisedInTrace

        items: list[Variable] = []
        while len(items) < 10_000:
            try:
                items.append(UserMethodVariable(getitem, self).call(tx, [ConstantVariable(len(items))], {}))
            except RaisedInTrace as raised:
                if not issubclass(raised.exception.exc_type, (IndexError, StopIteration)):
                    raise
                return items
        raise Unsupported(f"iterating over {type(self.module).__name__} by index without an end", kind="unsupported_iter")

    def length(self, tx: "Tracer") -> Variable:
        override = self._override(tx, "__len__")
        if override is not None:
            return UserMethodVariable(override, self).call(tx, [], {})
        if isinstance(self.module, _CONTAINERS):
            return ConstantVariable(len(self._children(tx)))
        raise Unsupported(f"len() of {type(self.module).__name__}", kind="unsupported_builtin")

    def truth(self, tx: "Tracer") -> bool:
        """`bool(module)` in Python's order: a `__bool__` the class writes, else its `__len__` (a
        container's count of children, or one the class writes) != 0, else True."""
        for name in ("__bool__", "__len__"):
            override = self._override(tx, name)
            if override is not None:
                result = UserMethodVariable(override, self).call(tx, [], {})
                if not result.is_constant() or not isinstance(result.as_constant(), int):
                    raise Unsupported(f"{type(self.module).__qualname__}.{name} does not give a value known at "
                                      "trace time", kind="unsupported_builtin")
                return bool(result.as_constant())
        if isinstance(self.module, _CONTAINERS):
            return len(self._children(tx)) > 0
        return True

    def contains(self, tx: "Tracer", item: Variable) -> bool | None:
        """`item in module` through a `__contains__` the class writes; None when it writes none."""
        override = self._override(tx, "__contains__")
        if override is None:
            return None
        return UserMethodVariable(override, self).call(tx, [item], {}).truth(tx)

    def _override(self, tx: "Tracer", name: str) -> types.FunctionType | None:
        """A protocol method (`__getitem__`, `__len__`, `__iter__`, `__bool__`, `__contains__`) the
        module's class wrote itself: inlined instead of the container's own (its `super()` call comes
        back to the table above), and on any other module class instead of refusing (or, for truth,
        instead of nn.Module's default: true). What the lookup found, or that it found nothing, is
        guarded on the class."""
        kind = type(self.module)
        static = inspect.getattr_static(kind, name, None)
        if isinstance(static, types.FunctionType) and not _torch_method(static):
            guard_class_attribute(tx, kind, name, static, self)
            return static
        if static is None:
            guard_class_attribute(tx, kind, name, ABSENT, self)
        return None

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        from kiln.capture.variables.sequence import ListVariable

        override = self._override(tx, "__getitem__")
        if override is not None:
            return UserMethodVariable(override, self).call(tx, [key], {})
        children = self._children(tx)
        # an int made symbolic (an index argument that changed, a slice's bound such as
        # `self.layers[: config.num_layers]` under dynamic=True) picks children: specialized, as the
        # children called depend on it
        index: Any
        if key.is_constant() or isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            index = key.as_constant()
        elif isinstance(key, SliceVariable):
            index = key.as_slice(tx)
        else:
            index = tx.as_int(key)
        if isinstance(self.module, _CONTAINERS) and not isinstance(index, slice) and \
                (index not in dict(children) if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict))
                 else isinstance(index, int) and not -len(children) <= index < len(children)):
            _raise_missing_item(self.module, index)
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return dict(children)[index]
        if isinstance(index, slice):
            if isinstance(self.module, torch.nn.Sequential):
                start, stop, step = index.indices(len(children))
                return SequentialSliceVariable(self, slice(start, stop, step), [v for _, v in children][index])
            return ListVariable([v for _, v in children][index])
        if isinstance(self.module, _CONTAINERS):
            return [v for _, v in children][index]
        raise Unsupported(f"indexing {type(self.module).__name__}", kind="unsupported_call")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sequence import ListVariable, TupleVariable

        is_dict = isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict))
        if self.built_children is not None:
            written = write_built_container(tx, self, name, args, kwargs)
            if written is not None:
                return written
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
        if name in _INTROSPECTION and _torch_method(inspect.getattr_static(type(self.module), name, None)):
            return self._introspect(tx, name, args, kwargs)
        if name == "__iter__" and isinstance(self.module, _CONTAINERS):
            from kiln.capture.variables.iterator import IteratorVariable
            return IteratorVariable(self.iterate(tx))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def _introspect(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """parameters(), named_modules(prefix=...), buffers(recurse=False), ...: the real method's
        answer on the real module (its recursion, order and de-duplication), each item read through
        its path from this module. The walk that answer depends on is guarded: the names in each
        reachable module's tables, and a module reached through two paths (shared, or a cycle back
        to an ancestor) by identity at the second one."""
        from kiln.capture.variables.iterator import IteratorVariable
        from kiln.capture.variables.sequence import TupleVariable

        if self.source is None:
            raise Unsupported(f"{name}() of a module without a source", kind="unsupported_call")
        consts = constant_args(args, kwargs)
        if consts is None:
            raise Unsupported(f"{name}() with arguments unknown at trace time", kind="unsupported_call")
        self._refuse_changed_tables(tx, f"{name}()")
        self._guard_tree(tx)
        named = name if name.startswith("named_") else "named_" + name
        method = getattr(self.module, name)
        bound = inspect.signature(method).bind(*consts[0], **consts[1])
        prefix = bound.arguments.get("prefix", "")
        if named == name:
            pairs = list(method(*consts[0], **consts[1]))
        else:  # parameters(recurse) is named_parameters(recurse=recurse) without the names
            pairs = list(getattr(self.module, named)(**bound.arguments))
        items: list[Variable] = []
        for qualified, value in pairs:
            path = qualified[len(prefix):].lstrip(".") if prefix and qualified.startswith(prefix) else qualified
            var = tx.wrap(value, self._path_source(path, value))
            items.append(TupleVariable([ConstantVariable(qualified), var]) if named == name else var)
        result = IteratorVariable(items)
        if getattr(type(self.module), name, None) is getattr(torch.nn.Module, name):
            result.made_as = types.GeneratorType  # nn.Module's own methods are generators
        return result

    def _path_source(self, path: str, value: Any) -> Source:
        assert self.source is not None
        source: Source = self.source
        owner = self.module
        parts = path.split(".") if path else []
        for n, part in enumerate(parts):
            table = "_modules"
            if n == len(parts) - 1 and isinstance(value, torch.Tensor):
                table = "_parameters" if part in owner._parameters else "_buffers"
            source = ItemSource(AttrSource(source, table), part)
            if table == "_modules":
                owner = owner._modules[part]  # type: ignore[assignment]  # a path of named_modules
        return source

    def _guard_tree(self, tx: "Tracer") -> None:
        """Guard the names in the tables of every module reachable from this one, each once (a
        cycle back to an ancestor ends the walk there), and the identity of a module met again."""
        assert self.source is not None
        seen: set[int] = set()
        pending: list[tuple[torch.nn.Module, Source]] = [(self.module, self.source)]
        while pending:
            module, source = pending.pop()
            if id(module) in seen:
                self._guard(tx, source, "check_id", module)
                continue
            seen.add(id(module))
            for table in ("_modules", "_parameters", "_buffers"):
                self._guard(tx, AttrSource(source, table), "check_keys", tuple(getattr(module, table).keys()))
            for key, sub in reversed(list(module._modules.items())):
                if sub is not None:
                    pending.append((sub, ItemSource(AttrSource(source, "_modules"), key)))

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        if self.built_children is not None:
            return self._rebuild_container(glue)
        if isinstance(self.module, _CONTAINERS):
            # made at trace time (`MyList()`): one object for every call would carry one call's
            # writes into the next
            raise Unsupported(f"a {type(self.module).__name__} made in the frame, kept after it", kind="reconstruct")
        return glue.constant(self.module)

    def _rebuild_container(self, glue: "GlueBuilder") -> str:
        """A container the frame built and kept (stored on a module, returned, left in a local across
        a break): eager builds a new one on each call around the children as they are then, so the
        glue does too, from the children's own expressions (a submodule's source, a module built in
        the frame). One whose attributes the trace wrote is refused (the writes are not replayed)."""
        kind = type(self.module)
        base = container_base(kind)
        if base is None or self.built_written:
            raise Unsupported(f"a {kind.__name__} built in the frame and changed there, kept after it",
                              kind="reconstruct")
        children = [(key, glue.reconstruct(child)) for key, child in self._built_children()]
        if base is torch.nn.ModuleDict:
            built = f"{glue.constant(kind)}({{{', '.join(f'{key!r}: {child}' for key, child in children)}}})"
        elif base is torch.nn.Sequential:
            built = f"{glue.constant(kind)}({', '.join(child for _, child in children)})"
        else:
            built = f"{glue.constant(kind)}([{', '.join(child for _, child in children)}])"
        name = glue.fresh("v")  # built once: stored and returned, it is one object, as in eager
        glue.line(f"{name} = {built}")
        return name


_MISSING = object()


def _is_packed(var: Variable) -> bool:
    """True for a torch.nn.utils.rnn.PackedSequence argument."""
    try:
        return issubclass(var.python_type(), torch.nn.utils.rnn.PackedSequence)
    except Exception:
        return False


def _uninitialized_lazy(m: torch.nn.Module) -> bool:
    return isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook") and m.has_uninitialized_params()


def _initialize_lazy(m: torch.nn.Module, args: Sequence[Variable], kwargs: dict[str, Variable]) -> None:
    """A lazy module's first call: as torch.compile does, its parameters are made from the shapes
    of the call's inputs (zeros of those shapes stand for them), as its first eager call would
    make them, and the capture starts again over the initialized module (it may have changed
    class). Inputs whose shapes are symbolic, or that are not tensors or constants, break."""
    def real(var: Variable) -> Any:
        from kiln.capture.variables.dict import DictVariable
        from kiln.capture.variables.sequence import ListVariable, TupleVariable, is_namedtuple_type
        from kiln.capture.variables.tensor import TensorVariable

        if isinstance(var, TensorVariable):
            example = var.example
            if not all(isinstance(s, int) for s in example.shape):
                raise Unsupported("initializing a lazy module from an input of symbolic shape", kind="unsupported_call")
            return torch.zeros(tuple(example.shape), dtype=example.dtype, device=example.device)
        if var.is_constant():
            return var.as_constant()
        if isinstance(var, ListVariable):
            return [real(item) for item in var.items]
        if isinstance(var, TupleVariable):  # a tuple, a torch.Size or a namedtuple of inputs
            items = [real(item) for item in var.items]
            return var.tuple_type(*items) if is_namedtuple_type(var.tuple_type) else var.tuple_type(items)
        if isinstance(var, DictVariable):
            return var.dict_type((key, real(value)) for key, value in var.items.items())
        raise Unsupported(f"initializing a lazy module from {var.describe()}", kind="unsupported_call")

    real_args = tuple(real(a) for a in args)
    real_kwargs = {k: real(v) for k, v in kwargs.items()}
    m._infer_parameters(m, real_args, real_kwargs)  # type: ignore[operator]  # LazyModuleMixin's
    raise RestartCapture(f"the lazy module {type(m).__name__} was initialized")


def build_container(tx: "Tracer", cls: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """`nn.Sequential(a, b, ...)` or `nn.ModuleList([a, b])` called in the frame on modules it holds
    (a submodule, one built there): a real container made at trace time around the real children
    (building one has no other effect), whose children are read as the trace's own variables, so a
    child from outside keeps its source (its parameters stay graph inputs). None for anything else."""
    base = container_base(cls)
    if kwargs or base is None:
        return None
    if base is torch.nn.ModuleDict:
        return _build_module_dict(cls, args)
    if base is torch.nn.Sequential:
        items = list(args)
    elif len(args) > 1:
        return None
    else:
        items = tx.iterate(args[0]) if args else []
    if not all(isinstance(v, NNModuleVariable) for v in items):
        return None
    modules = [v.module for v in items if isinstance(v, NNModuleVariable)]
    real = cls(*modules) if base is torch.nn.Sequential else cls(modules)
    built = NNModuleVariable(real, None)
    built.built_children = {str(i): v for i, v in enumerate(items)}
    return built


def _build_module_dict(cls: type, args: Sequence[Variable]) -> Variable | None:
    """`nn.ModuleDict()` or `nn.ModuleDict({"name": module, ...})` (string keys, modules the trace
    holds), as build_container makes the list kinds."""
    from kiln.capture.variables.dict import DictVariable

    if len(args) > 1 or (args and not isinstance(args[0], DictVariable)):
        return None
    items = dict(args[0].items) if args and isinstance(args[0], DictVariable) else {}
    if not all(isinstance(k, str) and isinstance(v, NNModuleVariable) for k, v in items.items()):
        return None
    real = cls({k: v.module for k, v in items.items() if isinstance(v, NNModuleVariable)})
    built = NNModuleVariable(real, None)
    built.built_children = dict(items)
    return built


for _kind in (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict):
    CLASS_CALLS[_kind] = build_container
    SUBCLASSES_TOO.add(_kind)


def _raise_missing_item(m: torch.nn.Module, key: Any) -> None:
    """A container indexed out of range or by a missing key: the exception its own `__getitem__`
    raises (IndexError, KeyError, with its text), raised in the trace, where the frame may catch it
    (the old iteration protocol ends on it)."""
    from kiln.capture.variables.exception import raise_in_trace
    try:
        m[key]  # type: ignore[index]  # one of the containers, which index
    except (IndexError, KeyError) as exc:
        raise raise_in_trace(exc, f"{type(exc).__name__}: {exc} (raised natively)") from exc
    raise Unsupported(f"indexing {type(m).__name__} with {key!r}", kind="unsupported_call")


def _torch_method(static: Any) -> bool:
    """A method nn.Module (or one of torch's containers) defines, not a subclass's override."""
    return isinstance(static, types.FunctionType) and (static.__module__ or "").startswith("torch.nn.")
_INTROSPECTION = frozenset({"children", "modules", "parameters", "buffers", "named_children",
                            "named_parameters", "named_buffers", "named_modules"})
_CONTAINER_METHODS = frozenset({"__getitem__", "__len__", "keys", "values", "items", "__contains__",
                                "__iter__"})
