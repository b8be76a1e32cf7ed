"""The tracer: a symbolic CPython 3.11 interpreter that turns one frame into an FX graph plus glue.

A Tracer runs a frame's bytecode over Variables with the opcode table; tensors are FakeTensors and
every op is recorded in the OutputGraph. User functions, methods and modules are inlined by child
tracers sharing the graph. A root tracer given a stop offset raises ReachedBreak there: the graph
break that frame_capture.py chose after a first trace could not go on (glue.py builds it).
CaptureState is what one capture shares across its tracers. Attribute reads, hasattr and writes
are kiln.capture.attribute_access's.
Corresponds to torch/_dynamo/symbolic_convert.py (InstructionTranslator).

Float arguments follow automatic dynamic as in torch.compile 2.13 (specialize_float=False): the
first capture guards a float by value, and once it changes (or from the start under dynamic=True)
it is a SymFloat graph input that the glue feeds with the Python float itself, so tensor arithmetic
keeps Python-scalar promotion; branches on it are guards in the user's words (`f > 0.5`); int(f),
math.sqrt/floor/ceil/trunc stay in the graph; other uses that need the value (math.exp, round, max,
torch.tensor(f), f // c, f % c) guard it by value, where torch.compile keeps some of them symbolic.
"""
from __future__ import annotations

import builtins
import dis
import inspect
import math
import operator
import sys
import types
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln import config
from kiln.capture import code as code_mod
from kiln.capture import constant_fold
from kiln.capture.deferred_checks import may_raise_at_run_time, under_handler
from kiln.capture.attribute_access import get_attribute, has_attribute, set_attribute
from kiln.capture.guards import Guard
from kiln.capture.op_arguments import example_arg, node_arg, scalar_operands
from kiln.capture.options import CompileOptions
from kiln.capture.opcodes import OPCODES
from kiln.capture.output_graph import OutputGraph
from kiln.capture.process_modes import ProcessModes
from kiln.capture.side_effects import SideEffects
from kiln.capture.sources import (AttrSource, CallSource, ClosureSource, GlobalSource, ItemSource, LocalSource, Source, TypeSource,
                                  resume_stack_slot, source_chain)
from kiln.capture.variables.base import Variable
from kiln.capture.variables.builder import wrap_result, wrap_value
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.exception import RaisedInTrace, catch_in_frame, note_raised
from kiln.capture.variables.generator import run_generator
from kiln.capture.variables.numpy_scalar_args import numpy_scalars_as_numbers, symbolic_numpy_scalars
from kiln.capture.variables.functions import CellVariable, UserMethodVariable, bind_class_attribute, guard_class_attribute
from kiln.capture.variables import operators
from kiln.capture.variables.sequence import ListVariable, TupleVariable, is_structseq_type
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.tensor import RealInputs, TensorVariable
from kiln.capture.variables.super_call import SuperVariable
from kiln.errors import Unsupported

GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_MAX_STEPS = 200_000  # instructions per capture: an unrolled loop that long is not worth a graph
_MAX_DEPTH = 32  # inlining depth (recursion is unrolled until this)
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


class ReachedBreak(Exception):
    """The root tracer arrived at the instruction chosen as the graph break."""


class CaptureState:
    """What the root tracer and every inlined tracer share: graph, side effects, grad mode, caches."""

    def __init__(self, fn: types.FunctionType, options: CompileOptions, policy: Any) -> None:
        from kiln.fake import FakeTensorMode
        from kiln.symbolic.lazy_env import LazyShapeEnv

        self.fn = fn
        self.generators: list[Any] = []  # generators made in the frame (variables/generator.py)
        self.options = options
        self.dynamic = options.dynamic
        # weakly: the shape env outlives the capture (fake values in the graphs' node meta reach it
        # through their fake mode), and the state holds the user's objects the trace wrapped.
        # Made with the first symbol: a capture with static sizes never imports sympy.
        this = weakref.ref(self)
        self.shape_env = LazyShapeEnv(lambda: None if (state := this()) is None else state.location())
        self.output = OutputGraph(FakeTensorMode(self.shape_env), self.shape_env, policy, self.dynamic)
        self.policy = policy
        self.side_effects = SideEffects()
        self.wrapped: dict[int, tuple[Any, Variable]] = {}
        self.real_inputs = RealInputs()  # the real tensors behind graph inputs (TensorVariable.real)
        self.initial_grad = torch.is_grad_enabled()
        self.open_contexts: list[Any] = []  # autocast regions entered and not yet exited
        self.grad_enabled = self.initial_grad
        self.modes = ProcessModes()  # the default dtype and other settings the frame changes
        self.innermost: "Tracer | None" = None
        self.steps = 0
        # names of the sources an nn.Module was read from: ints read through one stay constants
        self.module_sources: set[str] = set()
        self.inference_breaks = False  # inference_mode blocks are breaks (one of them escaped: InferenceModeEscapes)
        self.defer_checks = True  # a branch whose other side raises is a deferred check (UnsafeDeferral: off)
        self.hook_breaks = False  # register_hook on a tensor the graph computes breaks (HookedTensorEscapes)
        self.read_compiling = False  # the trace answered torch.compiler.is_compiling() (True)
        self._cells: dict[int, tuple[types.CellType, CellVariable]] = {}

    def real_cell(self, cell: types.CellType, source: Source | None) -> CellVariable:
        """The one CellVariable of a real closure cell, however many functions (or calls of one)
        reach it: a write through one is what a read through another sees."""
        known = self._cells.get(id(cell))
        if known is not None and known[0] is cell:
            var = known[1]
            if var.source is None and source is not None:
                var.source = source
            elif source is not None and var.source != source:
                # reached through a second path: both paths must lead to one cell next time (an
                # aliasing guard, which names no object and so can be stored on disk)
                paths = tuple(s.name().rsplit(".cell_contents", 1)[0] for s in (var.source, source) if s is not None)
                self.output.guards.append(Guard("", "check_aliasing", (paths,)))
            return var
        var = CellVariable(real=cell, source=source)
        self._cells[id(cell)] = (cell, var)
        return var

    def location(self) -> str | None:
        tx = self.innermost
        if tx is None:
            return None
        return f"{tx.code.co_filename}:{tx.lineno}"

    def dynamic_int(self, value: int, source: Source) -> bool:
        if self.policy is None or config.specialize_int or isinstance(value, bool):
            return False
        if not isinstance(source, (LocalSource, ClosureSource, ItemSource)) and not resume_stack_slot(source) \
                and not self._read_number_source(source, is_int=True):
            # arguments, closure contents, items of containers (a config dict whose value a
            # script changes), what the glue passes a resume function (the rest of a `range`
            # loop), and attributes of what the frame was given
            return False
        if not _INT64_MIN <= value <= _INT64_MAX:
            return False  # kernels take a symbolic int as int64: a bigger one stays a constant
        return bool(self.policy.int_is_dynamic(source.name(), value, self.dynamic))

    def _read_number_source(self, source: Source, is_int: bool) -> bool:
        """Whether a number read from `source` may become symbolic once it changes (automatic
        dynamic), as torch.compile decides: what is read (through attributes and items) from the
        frame's arguments, its closure cells, or what the glue passes a resume function (a user
        object's step counter, a dataclass field, a slot, a function attribute, a class attribute
        read through an instance). Ints read through a global (module-level ints are taken as
        fixed) or through an nn.Module (its ints are taken as part of its structure) stay
        constants; floats have neither exception."""
        chain = source_chain(source)
        roots: tuple[type, ...] = (LocalSource, ClosureSource) if is_int else (LocalSource, ClosureSource, GlobalSource)
        if not isinstance(chain[-1], roots):
            return False
        if is_int and any(s.name() in self.module_sources for s in chain[1:]):
            return False
        return all(isinstance(s, (ItemSource, AttrSource, TypeSource)) for s in chain[:-1])

    def symbolic_int(self, value: int, source: Source) -> Variable:
        sym = self.shape_env.create_symbolic_int(value, source.name())
        self.output.guards.append(Guard(source.name(), "check_type", int))
        # ... and a later value outside int64 is a new capture, not the same graph overflowing
        for in_range in (sym <= _INT64_MAX, sym >= _INT64_MIN):
            bool(in_range)  # recorded by the ShapeEnv as a guard on the symbol
        node = self.output.symbol_input(sym, source.name())
        if node is None:
            raise Unsupported("an int argument that is not a plain symbol", kind="dynamic_shape")
        return SymIntVariable(node, sym)

    def symbolic_storage_offset(self, tensor: TensorVariable) -> Variable | None:
        """`t.storage_offset()` where t is an input, or a view made in the frame of the one input
        holding its storage, whose offset changed since an earlier capture of the frame (its
        check_value guard failed): the input's offset read as a symbolic int from
        `L['x'].storage_offset()` (plus t's static distance from it), not a constant guarded per
        offset. torch.compile breaks the graph there and passes the number on as an int, which
        its automatic dynamic makes symbolic the same way."""
        example = tensor.example
        if self.policy is None or example.layout != torch.strided or not torch._C._has_storage(example):
            return None
        storage = torch._C._storage_id(example)  # type: ignore[attr-defined]  # bound in C++, not in the stubs
        holders = [g for g in self.output.inputs if isinstance(g.example, torch.Tensor)
                   and g.example.layout == torch.strided and torch._C._has_storage(g.example)
                   and torch._C._storage_id(g.example) == storage]  # type: ignore[attr-defined]
        if len(holders) != 1:
            return None  # inputs sharing a storage: their offsets are guarded together
        base = holders[0]
        if type(example.storage_offset()) is not int or type(base.example.storage_offset()) is not int:
            return None  # a view's offset that is a size expression (x[1:] of a dynamic row length)
        entry = self.output.graph.find_nodes(op="placeholder", target=base.node_name)
        if not entry or entry[0].meta.get("entry_layout", (0, 0, None))[2] != base.example.storage_offset():
            return None  # the frame changed where the input starts (as_strided_, set_)
        read = f"{base.source}.storage_offset()"
        value = int(base.example.storage_offset())
        if not self.policy.int_is_dynamic(read, value, self.dynamic):
            return None
        sym = self.shape_env.create_symbolic_int(value, read)
        bool(sym >= 0)  # an offset is never negative: recorded as a guard that always holds
        node = self.output.symbol_input(sym, read)
        if node is None:
            return None
        distance = int(example.storage_offset()) - value
        if distance == 0:
            return SymIntVariable(node, sym)
        moved = sym + distance
        return SymIntVariable(self.output.create_node("call_function", operator.add, (node, distance), {}, moved), moved)

    def symbolic_numpy_scalar(self, value: Any, source: Source) -> Variable:
        """A numpy integer or float argument as a symbolic graph input of the number it holds,
        guarded by its numpy type (the glue passes the numpy scalar itself)."""
        number, read = value.item(), CallSource(source, "item").name()  # the graph and the guards take the number
        self.output.guards.append(Guard(source.name(), "check_type", type(value)))
        if isinstance(number, int):
            sym = self.shape_env.create_symbolic_int(number, read)
            for in_range in (sym <= _INT64_MAX, sym >= _INT64_MIN):
                bool(in_range)  # recorded by the ShapeEnv as a guard on the symbol
        else:
            sym = self.shape_env.create_symbolic_float(number, read)
            self.output.guards.append(Guard(f"{read} * 0 == 0", "check_shape",
                                            "a float argument is symbolic while it is finite"))
        node = self.output.symbol_input(sym, read)
        if node is None:
            raise Unsupported("a numpy scalar argument that is not a plain symbol", kind="dynamic_shape")
        return SymIntVariable(node, sym)

    def dynamic_numpy_scalar(self, value: Any, source: Source) -> bool:
        """A numpy integer or float argument may be symbolic from the first call, as torch.compile
        passes one as a tensor input; unless sizes and numbers are static for this compile."""
        if self.policy is None or self.dynamic is False or not isinstance(source, LocalSource):
            return False
        number = value.item()
        if type(number) is int:
            return not config.specialize_int and _INT64_MIN <= number <= _INT64_MAX
        return type(number) is float and not config.specialize_float and math.isfinite(number) and number != 0.0

    def dynamic_float(self, value: float, source: Source) -> bool:
        if self.policy is None or config.specialize_float:
            return False
        if not isinstance(source, (LocalSource, ItemSource, GlobalSource)) and not resume_stack_slot(source) \
                and not self._read_number_source(source, is_int=False):
            # A float held in a dict or list (an optimizer's `param_groups[i]['lr']`, which a
            # scheduler changes every step), an attribute (a user object's scale, a dataclass
            # field, a module's float), or a global (a module-level scale a script changes between
            # calls) becomes a symbol once it changes, as torch.compile's floats do (unlike ints,
            # whose globals and nn.Module attributes stay constants)
            return False
        if value == 0.0:
            # 0.0 == -0.0: a symbol specialized by the trace (copysign, str(), a branch) is guarded
            # equal to its hint, which takes either zero; as a constant its sign is guarded too
            return False
        return bool(self.policy.float_is_dynamic(source.name(), value, self.dynamic))

    def symbolic_float(self, value: float, source: Source) -> Variable:
        """A float argument as a SymFloat graph input: the graph takes the Python float itself, so
        tensor arithmetic with it keeps Python-scalar type promotion (`half * f` stays half)."""
        sym = self.shape_env.create_symbolic_float(value, source.name())
        self.output.guards.append(Guard(source.name(), "check_type", float))
        # Finite only: the graph's arithmetic is rebuilt from sympy, which takes f - f for 0 and
        # orders max's operands, where inf and nan give nan in Python (those stay constants).
        self.output.guards.append(Guard(f"{source.name()} * 0 == 0", "check_shape",
                                        "a float argument is symbolic while it is finite"))
        node = self.output.symbol_input(sym, source.name())
        if node is None:
            raise Unsupported("a float argument that is not a plain symbol", kind="dynamic_shape")
        return SymIntVariable(node, sym)

    def tracer_iterate(self, var: Variable) -> list[Variable]:
        return var.iterate(None)  # type: ignore[arg-type]  # tuples and ranges need no tracer


# --------------------------------------------------------------------------------------- the tracer

class Tracer:
    """Runs one code object symbolically. The root tracer runs the captured frame; children run
    inlined callees and return their result Variable to the caller."""

    def __init__(self, state: CaptureState, code: types.CodeType, f_globals: dict[str, Any],
                 local_vars: dict[str, Variable], cells: dict[str, CellVariable],
                 parent: "Tracer | None" = None, lazy_locals: dict[str, Any] | None = None,
                 stop_offset: int | None = None, stop_arrival: int = 0) -> None:
        self.state = state
        self.code = code
        self.f_globals = f_globals
        self.locals = dict(local_vars)
        self.lazy_locals = dict(lazy_locals or {})
        # a name an untouched local was copied to (`a = ___stack0` at a resume's start): the frame
        # local its value is read from when the trace first uses it
        self.lazy_sources: dict[str, str] = {}
        self.cells = dict(cells)
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.stop_offset = stop_offset
        # The break is the stop_arrival-th arrival at stop_offset (0: the first): inside a loop, the
        # iteration whose instruction failed, so the earlier iterations stay in the graph.
        self.stop_arrival = stop_arrival
        self.arrivals: dict[int, int] = {}  # root only: how often each offset was reached
        listing, self.index_of = code_mod.instructions(code)
        self.instructions = list(listing)
        self.stack: list[Variable] = []
        self.kw_names: tuple[str, ...] | None = None
        self.ip = 0
        self.next_ip = 0
        self.current: dis.Instruction | None = None
        self.lineno = code.co_firstlineno
        self.returned: Variable | None = None
        self.handled: list[Variable] = []  # exceptions whose handlers are running (PUSH_EXC_INFO)
        self.suspend_at_yield = False  # a generator's body (a contextmanager's too): stop at each yield
        self.locals_dict: DictVariable | None = None  # what locals() returned: one dict per frame

    # ------------------------------------------------------------------ the loop
    def run(self) -> Variable:
        state = self.state
        while True:
            if self.ip >= len(self.instructions):
                raise Unsupported("execution ran past the last instruction", kind="unsupported_bytecode")
            ins = self.instructions[self.ip]
            self.current = ins
            if ins.starts_line is not None:
                self.lineno = ins.starts_line
            state.innermost = self
            if self.parent is None:
                arrived = self.arrivals.get(ins.offset, 0)
                self.arrivals[ins.offset] = arrived + 1
                if self.stop_offset == ins.offset and arrived == self.stop_arrival:
                    raise ReachedBreak()
            state.steps += 1
            if state.steps > _MAX_STEPS:
                raise Unsupported(f"more than {_MAX_STEPS} instructions traced (a very long unrolled loop)",
                                  kind="unsupported")
            handler = OPCODES.get(ins.opname)
            if handler is None:
                raise Unsupported(f"the bytecode instruction {ins.opname} is not supported",
                                  kind="unsupported_bytecode")
            self.next_ip = self.ip + 1
            try:
                handler(self, ins)
            except RaisedInTrace as raised:
                note_raised(self, raised)
                if not catch_in_frame(self, raised):
                    raise  # to the caller's CALL, or a graph break at the root
            if self.returned is not None:
                return self.returned
            self.ip = self.next_ip

    # ------------------------------------------------------------------ stack
    def push(self, value: Variable) -> None:
        self.stack.append(value)

    def pop(self) -> Variable:
        return self.stack.pop()

    def popn(self, n: int) -> list[Variable]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, offset: int) -> None:
        self.next_ip = self.index_of[offset]

    # ------------------------------------------------------------------ services for variables
    @property
    def output(self) -> OutputGraph:
        return self.state.output

    @property
    def side_effects(self) -> SideEffects:
        return self.state.side_effects

    def wrap(self, value: Any, source: Source | None) -> Variable:
        return wrap_value(self.state, value, source)

    def wrap_result(self, value: Any) -> Variable:
        return wrap_result(value)

    def call(self, fn: Variable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return fn.call(self, list(args), dict(kwargs))

    def getattr(self, obj: Variable, name: str) -> Variable:
        return get_attribute(self, obj, name)

    def has_attr(self, obj: Variable, name: str) -> bool:
        return has_attribute(self, obj, name)

    def setattr(self, obj: Variable, name: str, value: Variable, bypass: bool = False) -> None:
        set_attribute(self, obj, name, value, bypass)
    def iterate(self, var: Variable) -> list[Variable]:
        return var.iterate(self)

    def as_int(self, var: Variable) -> int:
        if isinstance(var, SymIntVariable):
            return int(var.specialize())
        value = var.as_constant()
        try:
            return operator.index(value)
        except TypeError as error:  # `range(1.5)`, `enumerate(xs, "a")`: eager's TypeError, in the trace
            from kiln.capture.variables.exception import raise_in_trace
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)") from None

    def global_source(self, name: str) -> GlobalSource | None:
        """Where a global of the running code lives: `G[...]`, another module's dict, or nowhere
        reachable (functions exec'd with private globals, such as dataclass-generated methods)."""
        if self.f_globals is self.state.fn.__globals__:
            return GlobalSource(name)
        module = sys.modules.get(self.f_globals.get("__name__") or "")
        if module is not None and getattr(module, "__dict__", None) is self.f_globals:
            return GlobalSource(name, module.__name__)
        return None

    def load_global(self, name: str) -> Variable:
        source = self.global_source(name)
        pending = None if source is None else self.side_effects.pending_global(source)
        if pending is not None:
            return pending
        if name in self.f_globals:
            return self.wrap(self.f_globals[name], source)
        builtins_ns = self.f_globals.get("__builtins__", builtins)
        if isinstance(builtins_ns, types.ModuleType):
            builtins_ns = builtins_ns.__dict__
        if name in builtins_ns:
            return self.wrap(builtins_ns[name], None)
        raise Unsupported(f"name {name!r} is not defined (raised natively)", kind="unsupported")

    def zero_arg_super(self) -> Variable:
        cell = self.cells.get("__class__")
        if cell is None or not self.code.co_argcount:
            raise Unsupported("super() without arguments outside a method", kind="unsupported_call")
        first = self.code.co_varnames[0]
        obj = self.cells[first].load(self) if first in self.cells else self.read_local(first)
        return SuperVariable(cell.load(self).as_python_value(), obj)

    def read_local(self, name: str) -> Variable:
        if name not in self.locals and name in self.lazy_locals:
            self.locals[name] = self.wrap(self.lazy_locals.pop(name), LocalSource(self.lazy_sources.pop(name, name)))
        if name not in self.locals:
            raise Unsupported(f"local variable {name!r} referenced before assignment (raised natively)",
                              kind="unsupported")
        return self.locals[name]

    def frame_locals(self) -> dict[str, Variable]:
        """What `locals()` gives now: the bound fast locals in `co_varnames` order, then the
        frame's other cells and its free variables (an argument held in a cell keeps its place)."""
        code = self.code
        names = list(code.co_varnames) + [c for c in code.co_cellvars if c not in code.co_varnames]
        found: dict[str, Variable] = {}
        for name in names + list(code.co_freevars):
            cell = self.cells.get(name)
            if cell is not None:
                if cell.loaded and cell.contents is None:
                    continue  # a cell not yet assigned
                try:
                    found[name] = cell.load(self)
                except Unsupported:
                    continue  # an empty cell from outside the frame
            elif name in self.locals or name in self.lazy_locals:
                found[name] = self.read_local(name)
        return found

    # ------------------------------------------------------------------ graph ops
    def call_op(self, kind: str, target: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Record `target(*args, **kwargs)` as a node; its example value comes from the fakes."""
        if isinstance(target, torch._library.custom_ops.CustomOpDef):
            target = target._opoverload  # a torch.library.custom_op as called: its operator is the node
        args, kwargs = symbolic_numpy_scalars(
            lambda a, k: self.output.run_fake(kind, target, tuple(example_arg(v) for v in a),
                                              {n: example_arg(v) for n, v in k.items()}), target, args, kwargs)
        args = scalar_operands(target, args)
        args, kwargs = numpy_scalars_as_numbers(
            lambda a, k: self.output.run_fake(kind, target, tuple(example_arg(v) for v in a),
                                              {n: example_arg(v) for n, v in k.items()}), target, args, kwargs)
        if _reads_storage_offset(kind, target, args, kwargs) and isinstance(args[0], TensorVariable):
            offset = self.state.symbolic_storage_offset(args[0]) if target == "storage_offset" else None
            if offset is not None:
                return offset
            self.output.guard_storage_offsets(args[0].example)
        node_args = tuple(node_arg(a) for a in args)
        node_kwargs = {k: node_arg(v) for k, v in kwargs.items()}
        ex_args = tuple(example_arg(a) for a in args)
        ex_kwargs = {k: example_arg(v) for k, v in kwargs.items()}
        try:
            example = self.output.run_fake(kind, target, ex_args, ex_kwargs)
            pinned = self.state.modes.pinned_dtype(lambda t, a, k: self.output.run_fake(kind, t, a, k),
                                                   target, ex_args, ex_kwargs, example)
            if pinned is not None:  # the default dtype the frame set, made explicit (process_modes.py)
                node_kwargs["dtype"] = ex_kwargs["dtype"] = pinned
        except Unsupported as exc:
            # the op read a number out of a tensor whose value capture knows: record it with the number
            reads: list[Any] = []
            swapped = constant_fold.with_numbers(args, kwargs, reads) if exc.kind == "data_dependent" else None
            if swapped is None:
                raise
            result = self.call_op(kind, target, *swapped)
            self.output.guards.extend(reads)
            return result
        if self.output.inference_depth or self.output.inference_made:
            self.output.follow_inference(kind, target, ex_args, ex_kwargs, example)
        node = self.output.create_node(kind, target, node_args, node_kwargs, example)
        if not self.output.ops_under_handler and may_raise_at_run_time(node) and under_handler(self):
            self.output.ops_under_handler = True
        value = constant_fold.after_op(kind, target, args, kwargs, example)
        result = self.wrap_op_result(node, example)
        if value is not None and isinstance(result, TensorVariable):
            result.constant = value
            result.constant_guards = constant_fold.guards_of(args, kwargs)
        return result

    def wrap_op_result(self, node: torch.fx.Node, example: Any) -> Variable:
        if isinstance(example, torch.Tensor):
            return TensorVariable(node, example)
        if isinstance(example, _SYM_TYPES):
            # only here: kiln.symbolic.node loads sympy, and a capture with static sizes makes no SymInt
            from kiln.symbolic import is_symbolic

            if not is_symbolic(example):
                scalar: Callable[[Any], Any] = (
                    bool if isinstance(example, torch.SymBool) else float if isinstance(example, torch.SymFloat) else int)
                return ConstantVariable(scalar(example))
            return SymIntVariable(node, example)
        if isinstance(example, (tuple, list)):
            items = []
            for i, item in enumerate(example):
                sub = self.output.create_node("call_function", operator.getitem, (node, i), {}, item)
                items.append(self.wrap_op_result(sub, item))
            if isinstance(example, list):
                return ListVariable(items)
            kind = type(example) if (is_structseq_type(type(example)) or type(example) is torch.Size) else tuple
            return TupleVariable(items, kind)
        if isinstance(example, (str, bytes)):
            # A string made from fakes would print the fake, not the tensor: run it natively.
            raise Unsupported("turning a tensor into a string", kind="format_tensor")
        if example is None or is_constant_value(example):
            return ConstantVariable(example)
        raise Unsupported(f"an op returned {type(example).__name__}", kind="unsupported")

    # ------------------------------------------------------------------ asked by the kinds (they import none of this)
    def binary_op(self, symbol: str, a: Variable, b: Variable) -> Variable:
        return operators.binary_op(self, symbol, a, b)

    def compare_op(self, symbol: str, a: Variable, b: Variable) -> Variable:
        return operators.compare_op(self, symbol, a, b)

    def subscript(self, obj: Variable, key: Variable) -> Variable:
        return operators.subscript(self, obj, key)

    def known_equal(self, a: Variable, b: Variable) -> bool | None:
        return operators.decided_equal(self, a, b)  # `a == b` when known without running a user __eq__

    def bind_method(self, fn: types.FunctionType, receiver: Variable) -> Variable:
        return UserMethodVariable(fn, receiver)  # a user subclass's method, bound

    def class_attribute(self, static: Any, receiver: Variable, owner: type, name: str | None) -> Variable | None:
        return bind_class_attribute(self, static, receiver, owner, name)

    def guard_class_attribute(self, owner: type, name: str, static: Any) -> None:
        guard_class_attribute(self, owner, name, static)

    # ------------------------------------------------------------------ inlining
    def child(self, code: types.CodeType, f_globals: dict[str, Any], local_vars: dict[str, Variable],
              cells: dict[str, CellVariable]) -> Tracer:
        """A tracer over `code` that records into this one's graph, called from here (not yet run)."""
        return Tracer(self.state, code, f_globals, local_vars, cells, parent=self)

    def inline_call(self, code: types.CodeType, f_globals: dict[str, Any], closure: list[CellVariable] | None,
                    defaults: Sequence[Any], kwdefaults: dict[str, Any], args: list[Variable],
                    kwargs: dict[str, Variable], name: str, fn: Any) -> Variable:
        """Run `code` in a child tracer over the same graph and return its result."""
        is_generator = bool(code.co_flags & inspect.CO_GENERATOR)
        if code.co_flags & GENERATOR_FLAGS and not is_generator:
            raise Unsupported(f"{name} is a coroutine", kind="generator")
        if self.depth >= _MAX_DEPTH:
            raise Unsupported(f"inlining {name} goes deeper than {_MAX_DEPTH} calls", kind="unsupported")
        local_vars = self._bind(code, defaults, kwdefaults, args, kwargs, name)
        cells = dict(zip(code.co_freevars, closure or []))
        child = self.child(code, f_globals, local_vars, cells)
        if is_generator:
            # A generator (a generator expression, a `yield` helper): stepped one yield at a
            # time as its consumer reads it (variables/generator.py)
            return run_generator(child)
        result = child.run()
        self.state.innermost = self
        return result

    def _bind(self, code: types.CodeType, defaults: Sequence[Any], kwdefaults: dict[str, Any],
              args: list[Variable], kwargs: dict[str, Variable], name: str) -> dict[str, Variable]:
        def fail(why: str) -> Unsupported:
            return Unsupported(f"TypeError calling {name}: {why} (raised natively)", kind="unsupported")

        argcount, posonly, kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
        names = code.co_varnames
        positional = names[:argcount]
        keyword_only = names[argcount: argcount + kwonly]
        index = argcount + kwonly
        varargs = varkw = None
        if code.co_flags & inspect.CO_VARARGS:
            varargs, index = names[index], index + 1
        if code.co_flags & inspect.CO_VARKEYWORDS:
            varkw = names[index]
        bound: dict[str, Variable] = dict(zip(positional, args))
        extra = args[argcount:]
        if extra and varargs is None:
            raise fail(f"takes {argcount} positional arguments but {len(args)} were given")
        if varargs is not None:
            bound[varargs] = TupleVariable(extra)
        rest: dict[Any, Variable] = {}
        for key, value in kwargs.items():
            if key in positional[posonly:] or key in keyword_only:
                if key in bound:
                    raise fail(f"got multiple values for argument {key!r}")
                bound[key] = value
            elif varkw is not None:
                rest[key] = value
            else:
                raise fail(f"got an unexpected keyword argument {key!r}")
        if varkw is not None:
            bound[varkw] = DictVariable(rest)
        first_default = argcount - len(defaults)
        for i, arg in enumerate(positional):
            if arg not in bound:
                if i < first_default:
                    raise fail(f"missing argument {arg!r}")
                bound[arg] = self._default(defaults[i - first_default])
        for arg in keyword_only:
            if arg not in bound:
                if arg not in kwdefaults:
                    raise fail(f"missing keyword-only argument {arg!r}")
                bound[arg] = self._default(kwdefaults[arg])
        return bound

    def _default(self, value: Any) -> Variable:
        if isinstance(value, Variable):
            return value
        return self.wrap(value, None)


_AS_STRIDED_FUNCTIONS = (torch.as_strided, torch.Tensor.as_strided, torch.as_strided_, torch.Tensor.as_strided_)


def _reads_storage_offset(kind: str, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """`x.storage_offset()`, and as_strided with an explicit offset (it counts from the start of
    the storage): what they compute depends on where the input starts in its storage."""
    if kind == "call_method" and target == "storage_offset":
        return bool(args)
    as_strided = (kind == "call_method" and target in ("as_strided", "as_strided_")) or (
        kind == "call_function" and any(target is f for f in _AS_STRIDED_FUNCTIONS))
    return as_strided and (len(args) >= 4 or "storage_offset" in kwargs)


__all__ = ["CaptureState", "ReachedBreak", "Tracer"]
