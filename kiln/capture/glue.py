"""The glue: generated Python that runs a capture's graph and puts the frame's world back together.

For each capture the tracer builds one function `__glue(L, G, F)`: it calls the compiled graph on
its input expressions, replays side effects, and then either returns the frame's result or performs
the graph break (rebuild the stack and live locals, run the offending call or branch natively, call
the resume function). It is built as readable Python source (what KILN_LOGS=bytecode prints) and
exec'd in a namespace holding the compiled graph, the constants and the resume functions.
Corresponds to torch/_dynamo/codegen.py (PyCodegen), written as source instead of bytecode.
"""
from __future__ import annotations

import ast
import dis
from dataclasses import dataclass
import itertools
import linecache
import os
import re
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx

from kiln.capture import code as code_mod
from kiln.capture.code import ResumeRequest, resume_callable
from kiln.capture.deferred_checks import emit_checks
from kiln.capture.device_context import runs_without_modes
from kiln.capture.guards import Guard, shape_guard
from kiln.capture.native_instructions import NATIVE_INSTRUCTIONS
from kiln.capture.sources import LocalSource
from kiln.capture.trace_rules import is_disabled
from kiln.capture.variables.base import NullVariable, Variable
from kiln.capture.variables.constant import literal_or_none
from kiln import log
from kiln.errors import KilnError, Unsupported, reraise
from kiln.fake.tensor import FakeTensor

if TYPE_CHECKING:
    from kiln.capture.breaks import BreakRecord
    from kiln.capture.output_graph import CompiledGraph, OutputGraph

_glue_ids = itertools.count()


class GlueBuilder:
    """Collects the glue's lines and names; `finish` compiles the graph and execs the source."""

    def __init__(self, output: "OutputGraph", f_globals: dict[str, Any], name: str) -> None:
        self.output = output
        self.f_globals = f_globals
        self.name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
        self.namespace: dict[str, Any] = {}
        self.lines: list[str] = []
        self.outputs: list[torch.fx.Node] = []
        self._output_index: dict[torch.fx.Node, int] = {}
        self._const_names: dict[int, str] = {}
        self._counter = itertools.count()
        self._reconstructed: dict[int, tuple[Any, str]] = {}
        self._rebuilding: set[int] = set()  # what reconstruct() is building now (a cycle check)
        self._reading_first = False
        # rebuilding values a resume function receives (the stack and locals it continues with):
        # an iterator is then a Live* stand-in its capture reads by index; anywhere else (a value
        # returned, stored into a global or an object) it is a real iterator of eager's own type
        self.to_resume = False
        # symbol inputs the glue reads, each bound before the graph runs: `L['x'].size()[1]` read
        # after a graph that re-strided x (x.t_()) would be the new size, not the traced symbol's
        self._entry_symbols: dict[str, str] = {}
        # side-effect key of a tensor hook registration -> the name its replay binds the handle to
        self.hook_handles: dict[tuple, str] = {}

    # ------------------------------------------------------------------ names and values
    def fresh(self, prefix: str) -> str:
        return f"__{prefix}{next(self._counter)}"

    def line(self, text: str) -> None:
        self.lines.append(text)

    def constant(self, value: Any) -> str:
        """An expression for a trace-time constant: a literal when it has one, else a bound name."""
        literal = literal_or_none(value)
        if literal is not None:
            return literal
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, FakeTensor)):
            # a trace-time stand-in as a constant would answer every later call with the traced value
            raise KilnError(f"internal: the glue would keep a trace-time {type(value).__name__} as a constant")
        name = self._const_names.get(id(value))
        if name is None:
            label = getattr(value, "__name__", type(value).__name__)
            label = "".join(c if c.isalnum() else "_" for c in str(label))[:24]
            name = f"__const_{label}_{len(self._const_names)}"
            self._const_names[id(value)] = name
            self.namespace[name] = value
        return name

    def bind(self, prefix: str, value: Any) -> str:
        """Put an object (a resume function, a wrapped callee) in the namespace under a fresh name."""
        name = self.fresh(prefix)
        self.namespace[name] = value
        return name

    def iterator_maker(self, prefix: str, live: type) -> str:
        """The bound name of what rebuilds an iterator: the Live* stand-in `live` when the value
        goes on to a resume function (`to_resume`), else the maker of the real iterator of eager's
        type that it stands for (same arguments)."""
        from kiln.capture.variables.live_iterators import real_iterator_maker

        return self.bind(prefix, live if self.to_resume else real_iterator_maker(live))

    def reconstruct(self, var: "Variable") -> str:
        """The expression of `var`, built once per glue: a value reachable twice stays one object."""
        from kiln.capture.variables.deque import DequeVariable
        from kiln.capture.variables.dict import DictVariable
        from kiln.capture.variables.exception import ExceptionVariable
        from kiln.capture.variables.functions import CellVariable, NestedFunctionVariable
        from kiln.capture.variables.iterator import IteratorVariable
        from kiln.capture.variables.sequence import ListVariable
        from kiln.capture.variables.sets import SetVariable

        cached = self._reconstructed.get(id(var))
        if cached is not None:
            return cached[1]
        if id(var) in self._rebuilding:
            # a container holding itself (the dict of locals() seen through its own name)
            raise Unsupported(f"rebuilding {var.describe()}, which contains itself", kind="reconstruct")
        self._rebuilding.add(id(var))
        try:
            expr = var.reconstruct(self)
        finally:
            self._rebuilding.discard(id(var))
        # a value read out of a container (kwargs['old']) is read once, where it is first needed:
        # replayed mutations of that container (kwargs.pop('old')) come before a later use
        nested_read = var.source is not None and expr.count("[") >= 2 and expr[:2] in ("L[", "G[")
        # a value read from outside, taken into a name before the side effects are replayed
        early_read = self._reading_first and var.source is not None and not _FRAME_LOCAL.fullmatch(expr)
        if nested_read or early_read or var.source is None and isinstance(var, (ListVariable, DictVariable, SetVariable,
                                                                  DequeVariable, NestedFunctionVariable,
                                                                  IteratorVariable, CellVariable,
                                                                  ExceptionVariable)):
            name = self.fresh("v")
            self.line(f"{name} = {expr}")
            expr = name
        self._reconstructed[id(var)] = (var, expr)
        return expr

    def read_first(self, values: Sequence[Any]) -> None:
        """Read every value from outside the frame that `values` hold (through containers, objects,
        closures made in the frame) into a name now, before the side effects are replayed: each
        stands for what the trace read (the frame's own later writes to that place are effects),
        and `old = o.v; o.v = new; return old` must return the old value, which reading `o.v`
        after the replay would not. Values that cannot be rebuilt are left for their use to report."""
        self._reading_first = True
        try:
            seen: set[int] = set()
            pending = list(values)
            while pending:
                var = pending.pop()
                if id(var) in seen or var is None:
                    continue
                seen.add(id(var))
                if getattr(var, "source", None) is not None:
                    if self._reads_its_source(var):
                        self.reconstruct(var)
                    continue
                pending.extend(_held_values(var))
        finally:
            self._reading_first = False

    def _reads_its_source(self, var: Any) -> bool:
        """Whether rebuilding `var` reads its source (most values from outside), rather than naming
        a constant, a cell or a graph value: tried on a scratch glue, whose lines are dropped."""
        if id(var) in self._reconstructed:
            return False
        scratch = GlueBuilder(self.output, self.f_globals, "scratch")
        scratch.outputs = list(self.outputs)
        scratch._output_index = dict(self._output_index)
        scratch._entry_symbols = dict(self._entry_symbols)
        try:
            return bool(var.reconstruct(scratch) == var.source.name())
        except (Unsupported, KilnError):
            return False

    def graph_value(self, var: Any) -> str:
        """A tensor or symbolic number the graph computes: its input expression or an output slot."""
        node = var.node
        if node.op == "placeholder":
            source = node.meta["source"]
            if not isinstance(node.meta.get("example_value"), (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return source
            if source not in self._entry_symbols:
                self._entry_symbols[source] = f"__entry_{node.name}"
            return self._entry_symbols[source]
        index = self._output_index.get(node)
        if index is None:
            index = len(self.outputs)
            self.outputs.append(node)
            self._output_index[node] = index
        return f"__out[{index}]"

    # ------------------------------------------------------------------ finishing
    def finish(self, compiler: Callable[..., Any] | None, graph_name: str
               ) -> tuple[Callable[..., Any], str, "CompiledGraph | None"]:
        """Close and compile the graph, and exec the glue source; returns (glue, source, graph)."""
        head = [f"{name} = {source}" for source, name in self._entry_symbols.items()]
        compiled = None
        # deferred checks: their condition becomes an output before the graph is closed
        call = emit_checks(self, self.output, "__out = __GRAPH__") if self.output.has_ops() else []
        self.output.close(self.outputs)
        if self.output.has_ops():
            compiled = self.output.compile(compiler, graph_name)
            run = compiled.fn
            if self.output.default_device is not None:
                run = runs_without_modes(run)
            self.namespace[f"__{graph_name}"] = run
            args = ", ".join(compiled.inputs)
            head += [line.replace("__GRAPH__", f"__{graph_name}({args})") for line in call]
        elif any(n.op != "placeholder" for n in self.outputs):
            raise AssertionError("the glue reads graph outputs of a graph without ops")
        body = head + self.lines
        glue_name = f"__glue_{self.name}"
        source = f"def {glue_name}(L, G, F):\n" + "".join(f"    {line}\n" for line in body)
        filename = f"<kiln glue {next(_glue_ids)}: {self.name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        # the frame's module name: a class the glue makes natively (type(name, bases, ns) at a break)
        # takes its __module__ from the globals of the code that calls type()
        self.namespace["__name__"] = self.f_globals.get("__name__")
        exec(compile(source, filename, "exec"), self.namespace)
        return self.namespace[glue_name], source, compiled


_FRAME_LOCAL = re.compile(r"L\[[^\[\]]*\]")  # `L['x']`: the frame's own locals, never an effect's target


def _held_values(var: Any) -> list[Any]:
    """The values a Variable made in the frame holds (a container's items, an object's attributes,
    a function's closure cells and defaults, a bound method's object, a view's dict)."""
    held: list[Any] = []
    for name in ("items", "attrs", "fields", "args", "kwargs", "closure", "defaults", "kwdefaults", "obj",
                 "dict_var", "contents", "fn", "out"):
        value = getattr(var, name, None)
        if isinstance(value, dict):
            held.extend(value.values())
        elif isinstance(value, (list, tuple)):
            held.extend(value)
        elif value is not None and hasattr(value, "reconstruct"):
            held.append(value)
    return [v for v in held if hasattr(v, "reconstruct")]


class ResumeFunctions:
    """Makes resume functions for one frame (`fn`), each wrapped by the entry's `wrap_frame`.

    A frame with a closure gets its resume functions per closure at run time (`F` can be another
    closure instance of the same code), so the glue calls `__resumeN(F)(...)` in that case.
    `native`: the resume functions run as plain Python (a break inside a try block), not compiled.
    """

    def __init__(self, fn: types.FunctionType, wrap_frame: Callable[[Any], Any], native: bool = False) -> None:
        self.fn = fn
        self.wrap_frame = wrap_frame
        self.native = native

    def expression(self, glue: GlueBuilder, offset: int, stack: Sequence["Variable"],
                   live: Sequence[str], live_values: Sequence["Variable"]) -> str:
        """`resume(stack..., locals...)`: the call continuing the frame at `offset`."""
        null_slots = [i for i, v in enumerate(stack) if isinstance(v, NullVariable)]
        request = ResumeRequest(offset, len(stack), tuple(live), tuple(null_slots), self.native)
        glue.to_resume = True
        try:
            args = [glue.reconstruct(v) for v in stack if not isinstance(v, NullVariable)]
            args += [glue.reconstruct(v) for v in live_values]
        finally:
            glue.to_resume = False
        callee = glue.bind("resume", resume_callable(self.fn, request, self.wrap_frame))
        if self.fn.__closure__ is not None:
            callee += "(F)"
        return f"{callee}({', '.join(args)})"


# --------------------------------------------------------------------------- finishing a capture

_CALLS = frozenset({"CALL", "CALL_FUNCTION_EX"})
_BRANCHES = frozenset({"POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE",
                       "POP_JUMP_BACKWARD_IF_FALSE", "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"})
_BACKWARD = frozenset({"JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "POP_JUMP_BACKWARD_IF_TRUE",
                       "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"})
_graph_ids = itertools.count()
def _in_loop(code: types.CodeType, offset: int) -> bool:
    """True when a backward jump at or after `offset` goes back to or before it."""
    return any(i.opname in _BACKWARD and i.offset >= offset and i.argval <= offset
               for i in dis.get_instructions(code))


def in_try_block(code: types.CodeType, offset: int, *, with_blocks: bool = False) -> bool:
    """True when `offset` is covered by a try block; a with-block's cleanup handler counts only
    when `with_blocks` is set."""
    instrs = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    index = {i.offset: n for n, i in enumerate(instrs)}
    for entry in code_mod.exception_entries(code):
        if entry.start <= offset < entry.end:
            n = index.get(entry.target)
            handler = instrs[n + 1].opname if n is not None and n + 1 < len(instrs) else None
            if with_blocks or handler != "WITH_EXCEPT_START":
                return True
    return False


def handled_in_trace(tx: Any) -> bool:
    """Whether a try or with block of a frame being traced (the innermost and its callers) covers
    its current instruction: a handler there may catch what the instruction raises."""
    while tx is not None:
        if tx.current is not None and in_try_block(tx.code, tx.current.offset, with_blocks=True):
            return True
        tx = tx.parent
    return False


def check_breakable(root: Any, exc: Unsupported, record: Any) -> None:
    """Raise (the frame then runs eagerly) unless the root instruction can be a graph break.

    A call, an expression instruction of NATIVE_INSTRUCTIONS, a `with` whose manager cannot be
    entered in the trace and a branch on a tensor can, also
    inside loops (the iterator is a stack slot of the resume function). Inside a try block the
    frame continues natively from the breaking instruction itself, so that the exception handlers
    still cover it (see finish_break).
    """
    if exc.kind in ("frame_introspection", "frame_eager"):
        raise exc  # a split frame's glue is not the frame the call would read: no break helps
    ins = root.current
    native = ins.opname in _CALLS or ins.opname in NATIVE_INSTRUCTIONS or ins.opname == "BEFORE_WITH"
    if not native and not (ins.opname in _BRANCHES and exc.kind == "data_dependent_branch"):
        raise exc


def unbacked_break(state: Any, exc: Unsupported) -> int | None:
    """For a branch on a data-dependent size (nonzero's length) that cannot be decided: the index
    of the op that made the first symbol it depends on, so that the next pass breaks at that op.

    The branch itself is often no place for a break (a comparison inside a callee, or one whose
    stack holds the symbolic size); at the op the break is an ordinary call, and after it the
    resume function sees a real tensor with a real size. None for any other reason to stop.
    """
    from kiln.symbolic.shape_env import GuardOnDataDependentSymNode

    made = state.output.fake_mode.unbacked
    if not isinstance(exc, GuardOnDataDependentSymNode) or not made:
        return None
    symbols: set[Any] = getattr(exc.expr, "free_symbols", set())
    found = [made.index(s) for s in symbols if s in made]
    return min(found) if found else 0


def _restore_grad_node(state: Any) -> None:
    # A graph must leave grad mode (and autocast) as it found it; the glue sets the traced mode
    # again natively (and enters a real autocast region for a break inside one).
    from kiln.capture.variables.context_manager import close_open_contexts
    close_open_contexts(state)
    if state.grad_enabled != state.initial_grad:
        state.output.create_node("call_function", torch._C._set_grad_enabled, (state.initial_grad,), {}, None)
    state.modes.restore_in_graph(state)


def _grad_line(glue: GlueBuilder, state: Any) -> None:
    if state.grad_enabled != state.initial_grad:
        glue.line(f"{glue.constant(torch._C._set_grad_enabled)}({state.grad_enabled})")
    state.modes.set_in_glue(glue)


def _live_values(root: Any, names: Sequence[str]) -> tuple[list[str], list["Variable"]]:
    """The live locals that are bound at the break, with their values.

    A local the liveness analysis keeps only for a path where it is still unbound (e.g. read after
    a with-block whose exit could swallow an exception) is left out: in the resume function it is
    then unbound too, exactly as in the original frame.
    """
    bound: list[str] = []
    values: list[Variable] = []
    for name in names:
        if name in root.cells:
            # the cell itself, bound or not: inner functions made before the break share it
            values.append(root.cells[name])
        elif name in root.locals:
            values.append(root.locals[name])
        elif name in root.lazy_locals:
            untouched = Variable()  # an argument the graph never read: passed through as it is
            untouched.source = LocalSource(root.lazy_sources.get(name, name))
            values.append(untouched)
        else:
            continue
        bound.append(name)
    return bound, values


def _native_callee(glue: GlueBuilder, var: "Variable", wrap_frame: Callable[[Any], Any],
                   grad_enabled: bool = True) -> tuple[str, list[str]]:
    """How the glue calls the break's callee natively, and the leading arguments it needs.

    A user function or method is wrapped by the entry (`wrap_frame`) so it is captured as its own
    frame; so is the forward of a custom autograd.Function (InferenceApply; with grad
    mode on, under the Function's own backward); anything else (print, a disabled function, a
    tensor method) is called as it is.
    """
    from kiln.capture.variables.functions import NestedFunctionVariable, UserFunctionVariable, UserMethodVariable
    from kiln.capture.distributed import DDPModuleCall, HookedModuleCall, is_ddp
    from kiln.capture.variables.module import NNModuleVariable, _has_hooks

    if isinstance(var, NestedFunctionVariable) and _compiled_by_code(var.code):
        # made by this frame, new on each call: compiled by its code (kiln.capture.code_callee)
        return glue.bind("callee", wrap_frame(var.code)), [glue.reconstruct(var)]
    if isinstance(var, UserFunctionVariable) and not is_disabled(var.fn):
        if var.pin is not None and var.source is not None and _compiled_by_code(var.fn.__code__):
            # guarded by its code, not its identity (a closure its maker makes anew): the glue
            # passes the function object it reads to the callable of that code
            return glue.bind("callee", wrap_frame(var.fn.__code__)), [var.source.name()]
        var.pin_identity()  # the callee is compiled from this very function object
        return glue.bind("callee", wrap_frame(var.fn)), []
    if isinstance(var, UserMethodVariable) and not is_disabled(var.fn):
        return glue.bind("callee", wrap_frame(var.fn)), [glue.reconstruct(var.obj)]
    from kiln.capture.variables.autograd_function import inference_apply
    from kiln.capture.variables.functions import is_autograd_function_apply
    value = getattr(var, "value", None)
    if is_autograd_function_apply(value):
        apply = inference_apply(value, wrap_frame)
        if apply is not None:
            return glue.bind("callee", apply), []
    if isinstance(var, NNModuleVariable) and is_ddp(var.module):
        inner = var.module.module
        assert isinstance(inner, torch.nn.Module)  # DDP's constructor stores the module it wraps
        inner_forward = type(inner).forward
        if isinstance(inner_forward, types.FunctionType) and "forward" not in inner.__dict__:
            return glue.bind("callee", DDPModuleCall(wrap_frame(inner_forward))), [glue.reconstruct(var)]
    if isinstance(var, NNModuleVariable):
        forward = type(var.module).forward
        if isinstance(forward, types.FunctionType) and "forward" not in var.module.__dict__ \
                and not is_disabled(forward):  # a disabled forward runs as it is, its callees uncompiled
            if isinstance(var.module, torch.nn.RNNBase) and not _has_hooks(var.module):
                # an RNN breaks at its call over a PackedSequence (module.py): its forward, compiled
                # alone, would break again on the batch sizes; it runs as it is
                return glue.reconstruct(var), []
            if not _has_hooks(var.module):
                return glue.bind("callee", wrap_frame(forward)), [glue.reconstruct(var)]
            if forward.__module__.startswith("torch.nn.") and not var.module._modules:
                # a hooked built-in layer (Linear, LayerNorm): its forward compiled alone would be a
                # graph of one op; it runs as it is, as torch.compile runs torch.nn's frames
                return glue.reconstruct(var), []
            # hooks capture cannot trace (FSDP2's): they run natively around the compiled forward
            return glue.bind("callee", HookedModuleCall(wrap_frame(forward))), [glue.reconstruct(var)]
    return glue.reconstruct(var), []


def _compiled_by_code(code: types.CodeType) -> bool:
    """A function of this code met at a break, made anew by each call of its maker, is compiled as
    its code (kiln.capture.code_callee) where torch.compile would compile its frame: user code, not
    torch's or the standard library's (dataclasses' inner functions run as they are), nor Kiln's."""
    from kiln.capture.trace_rules import is_library_code

    filename = code.co_filename
    return not (is_library_code(filename) or filename.startswith(_KILN_DIR) or filename.startswith("<kiln"))


# Kiln's own folder (as skip_frame's, which imports entry: not imported here, the glue is below both)
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class CaptureResult:
    """What one capture produced (docs/seams.md): the glue, its source, guards, graphs, breaks."""

    glue: Callable[[dict, dict, Any], Any]
    glue_source: str
    guards: list[Guard]
    graphs: list[torch.fx.GraphModule]
    breaks: list[BreakRecord]
    # tensor ops were traced though no graph was left (every one unused)
    traced_tensor_ops: bool = False


def _result(state: Any, glue: GlueBuilder, options: Any, records: list[Any]) -> CaptureResult:
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in state.fn.__code__.co_name).strip("_")
    name = f"{base or 'fn'}_{next(_graph_ids)}"
    # The backend compiles the graph under the process state it runs under: the mode on entry (a
    # break inside `with torch.no_grad()` stops the trace with grad off, and AOT autograd reads the
    # ambient mode to choose between an inference graph run with grad off and a training graph).
    torch._C._set_grad_enabled(state.initial_grad)
    state.modes.restore_process()
    glue_fn, source, compiled = glue.finish(options.compiler, f"graph_{name}")
    guards = list(state.output.guards) + state.output.absent_guards() + [Guard("", "check_grad_mode", state.initial_grad)]
    from kiln.capture.variables.alias_guards import container_alias_guards
    guards += container_alias_guards(state)  # a container changed in place is no other one read
    guards += [shape_guard(g) for g in state.shape_env.guards]
    from kiln.capture.variables.type_checks import settle_abc_token
    guards = settle_abc_token(guards)
    graphs = [] if compiled is None else [compiled.gm]
    if compiled is not None:
        log.artifact("graph_code", lambda: f"graph of {state.fn.__qualname__}:\n{compiled.gm.code}")
    log.artifact("bytecode", lambda: f"glue of {state.fn.__qualname__}:\n{source}")
    return CaptureResult(glue_fn, source, guards, graphs, records, state.output.traced_tensor_ops)


def finish_return(state: Any, root: Any, fn: types.FunctionType, options: Any, value: "Variable") -> Any:
    """The capture of a frame that ran to its return: graph, side effects, `return <value>`."""
    glue = GlueBuilder(state.output, fn.__globals__, fn.__code__.co_name)
    _restore_grad_node(state)
    glue.read_first([value])
    state.side_effects.emit(glue)
    expr = glue.reconstruct(value)
    _grad_line(glue, state)
    glue.line(f"return {expr}")
    return _result(state, glue, options, [])


def finish_break(state: Any, root: Any, fn: types.FunctionType, options: Any,
                 wrap_frame: Callable[[Any], Any], record: Any) -> Any:
    """The capture of a frame that breaks at `root.current`: graph, side effects, the native
    instruction, and the call of the resume function(s)."""
    from kiln.capture.breaks import log_break

    site = _BreakSite.open(state, root, fn, wrap_frame)
    ins = site.ins
    if site.in_try and ins.opname not in _CALLS \
            or site.call_in_try and ins.opname in NATIVE_INSTRUCTIONS and ins.opname not in _CALLS:
        # an instruction run natively inside a with-block (`out @ y` whose shapes fake tensors
        # refuse) may raise: its exception must reach the manager's __exit__, which may suppress it
        _break_under_handlers(site)
    elif ins.opname == "CALL":
        _break_at_call(site)
    elif ins.opname == "CALL_FUNCTION_EX":
        _break_at_call_ex(site)
    elif ins.opname == "BEFORE_WITH":
        _break_at_with(site)
    elif ins.opname in NATIVE_INSTRUCTIONS:
        _break_at_native_instruction(site)
    else:
        _break_at_branch(site)
    log_break(record)
    return _result(state, site.glue, options, [record])


@dataclass
class _BreakSite:
    """Where a frame breaks and the glue being written for it: the breaking instruction, the
    tracer's stack there, the offset the frame resumes at, and whether the instruction sits
    inside a try block (or, for a call, a with block) whose handlers must see its exception."""

    state: Any
    root: Any
    fn: types.FunctionType
    code: types.CodeType
    ins: dis.Instruction
    glue: GlueBuilder
    wrap_frame: Callable[[Any], Any]
    resumes: ResumeFunctions
    stack: list[Any]
    after: int
    in_try: bool
    call_in_try: bool

    @classmethod
    def open(cls, state: Any, root: Any, fn: types.FunctionType, wrap_frame: Callable[[Any], Any]) -> "_BreakSite":
        """Start the glue of a break: what the break passes on (its stack, the locals live on any
        path from it) is read before the side effects are replayed."""
        ins = root.current
        code = fn.__code__
        glue = GlueBuilder(state.output, fn.__globals__, code.co_name)
        _restore_grad_node(state)
        live_anywhere: set[str] = set()
        for offset in _break_offsets(code, ins):
            live_anywhere.update(code_mod.live_locals_at(code, offset))
        glue.read_first([v for v in root.stack if not isinstance(v, NullVariable)]
                        + _live_values(root, [n for n in code.co_varnames + code.co_cellvars if n in live_anywhere])[1])
        state.side_effects.emit(glue)
        # A raise may be the code's last instruction: nothing follows it, and nothing resumes after it.
        after = ins.offset if ins.opname == "RAISE_VARARGS" else code_mod.next_offset(code, ins.offset)
        in_try = in_try_block(code, ins.offset)
        # A call that raises inside a with-block must reach the block's exit (the glue entered the real
        # manager: a lock to release, a grad mode to restore), as a try block's handler would.
        call_in_try = in_try or in_try_block(code, ins.offset, with_blocks=True)
        return cls(state, root, fn, code, ins, glue, wrap_frame, ResumeFunctions(fn, wrap_frame), list(root.stack),
                   after, in_try, call_in_try)

    def live_at(self, offset: int) -> tuple[list[str], list[Any]]:
        """The locals live at `offset`, and their values."""
        return _live_values(self.root, code_mod.live_locals_at(self.code, offset))

    def build_below(self, below: list[Any]) -> None:
        """Reconstruct the stack under the breaking instruction's operands before it runs: contexts
        are entered, containers built, in the order the frame made them."""
        self.glue.to_resume = True  # the values under the operands go on to the resume function
        try:
            for v in below:
                if not isinstance(v, NullVariable):
                    self.glue.reconstruct(v)
        finally:
            self.glue.to_resume = False

    def resume(self, stack: list[Any], live: list[str], values: list[Any]) -> None:
        """End the glue with the call of the resume function at `after`."""
        self.glue.line(f"return {self.resumes.expression(self.glue, self.after, stack, live, values)}")


def _break_under_handlers(site: _BreakSite) -> None:
    """The breaking instruction must run under the frame's exception handlers: the rest of the
    frame, from that instruction on, runs natively in a resume function that keeps them."""
    native = ResumeFunctions(site.fn, lambda f: f, native=True)
    live, values = site.live_at(site.ins.offset)
    _grad_line(site.glue, site.state)
    site.glue.line(f"return {native.expression(site.glue, site.ins.offset, site.stack, live, values)}")


def _break_at_call(site: _BreakSite) -> None:
    """A CALL that cannot be traced: the glue makes the call natively (a user function through
    its own compiled frame) and resumes with its result on the stack."""
    from kiln.capture.opcodes.calls import split_call

    glue, stack = site.glue, site.stack
    assert site.ins.arg is not None  # CALL always has its argument count
    depth = site.ins.arg + 2
    below = stack[: len(stack) - depth]
    callee_var, args, kwargs = split_call(stack[len(stack) - depth:], site.root.kw_names or ())
    site.build_below(below)
    live, values = site.live_at(site.after)
    callee, leading = _native_callee(glue, callee_var, site.wrap_frame, site.state.grad_enabled)
    parts = leading + [glue.reconstruct(a) for a in args]
    parts += [f"{k}={glue.reconstruct(v)}" for k, v in kwargs.items()]
    _grad_line(glue, site.state)
    result = _native_call(glue, site.fn, site.root, stack, depth, f"{callee}({', '.join(parts)})", site.call_in_try)
    site.resume(below + [_Named(result)], live, values)


def _break_at_call_ex(site: _BreakSite) -> None:
    """A CALL_FUNCTION_EX (`f(*args, **kwargs)`) that cannot be traced, made natively as CALL is."""
    glue, stack, arg = site.glue, site.stack, site.ins.arg
    assert arg is not None  # CALL_FUNCTION_EX always has its flags
    depth = 3 if arg & 1 else 2
    below = stack[: len(stack) - depth]
    callee_var = stack[len(stack) - depth]
    star = glue.reconstruct(stack[len(stack) - depth + 1])
    starstar = glue.reconstruct(stack[-1]) if arg & 1 else None
    if below and isinstance(below[-1], NullVariable):
        below = below[:-1]
    live, values = site.live_at(site.after)
    callee, leading = _native_callee(glue, callee_var, site.wrap_frame, site.state.grad_enabled)
    parts = leading + [f"*{star}"] + ([f"**{starstar}"] if starstar else [])
    _grad_line(glue, site.state)
    result = _native_call(glue, site.fn, site.root, stack, depth, f"{callee}({', '.join(parts)})", site.call_in_try)
    site.resume(below + [_Named(result)], live, values)


def _break_at_with(site: _BreakSite) -> None:
    """A manager whose entry cannot be traced (it writes state Kiln cannot replay, such as
    torch.backends.cudnn.flags): the glue enters the real manager, and the resume function
    runs the block under it, with the bound __exit__ on its stack as BEFORE_WITH leaves it."""
    glue, stack = site.glue, site.stack
    below = stack[:-1]
    site.build_below(below)
    manager = glue.fresh("manager")
    glue.line(f"{manager} = {glue.reconstruct(stack[-1])}")  # one object, entered and exited
    live, values = site.live_at(site.after)
    _grad_line(glue, site.state)
    exit_name, entered = glue.fresh("exit"), glue.fresh("entered")
    glue.line(f"{exit_name} = {manager}.__exit__")
    glue.line(f"{entered} = {manager}.__enter__()")
    site.resume(below + [_Named(exit_name), _Named(entered)], live, values)


def _operand(text: str) -> str:
    """An operand's expression made an atom, so the instruction's text keeps the bytecode's
    grouping: a constant -2 under `**` is `(-2) ** d`, not `-(2 ** d)`; `(5).real` is no float literal."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return f"({text})"
    return text if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"({text})"


def _break_at_native_instruction(site: _BreakSite) -> None:
    """An instruction of NATIVE_INSTRUCTIONS, run by the glue on its reconstructed operands (a
    raise ends the glue there)."""
    glue, stack, ins = site.glue, site.stack, site.ins
    n_in, n_out, render = NATIVE_INSTRUCTIONS[ins.opname]
    count = n_in(ins)
    below = stack[: len(stack) - count]
    site.build_below(below)
    operands = [_operand(glue.reconstruct(v)) for v in stack[len(stack) - count:]]
    live, values = site.live_at(site.after)
    _grad_line(glue, site.state)
    pushed: list[Any] = []
    if n_out:
        result = glue.fresh("result")
        if ins.opname == "BINARY_OP" and ins.argrepr.endswith("="):
            glue.line(f"{result} = {operands[0]}")  # `a op= b` calls the in-place method of a
            glue.line(f"{result} {ins.argrepr} {operands[1]}")
        else:
            glue.line(f"{result} = {render(ins, operands)}")
        pushed.append(_Named(result))
    else:
        glue.line(render(ins, operands))
    if ins.opname != "RAISE_VARARGS":
        site.resume(below + pushed, live, values)


def _break_at_branch(site: _BreakSite) -> None:
    """A conditional jump on a value the trace cannot know: the glue tests it and calls the resume
    function of the side taken."""
    glue, stack, ins, after = site.glue, site.stack, site.ins, site.after
    cond = stack[-1]
    below = stack[:-1]
    target = ins.argval
    if ins.opname.endswith("IF_TRUE"):
        sides = ((target, below), (after, below))
    elif ins.opname.endswith("IF_FALSE"):
        sides = ((after, below), (target, below))
    elif ins.opname == "JUMP_IF_TRUE_OR_POP":
        sides = ((target, stack), (after, below))
    else:
        sides = ((after, below), (target, stack))
    cond_expr = glue.reconstruct(cond)
    calls = []
    for offset, side_stack in sides:
        live, values = site.live_at(offset)
        calls.append(site.resumes.expression(glue, offset, side_stack, live, values))
    _grad_line(glue, site.state)
    glue.line(f"if {cond_expr}:")
    glue.line(f"    return {calls[0]}")
    glue.line(f"return {calls[1]}")


def _break_offsets(code: types.CodeType, ins: dis.Instruction) -> list[int]:
    """The offsets a break at `ins` may continue from: the instruction itself (inside a try block),
    the next one, and a branch's target."""
    offsets = [ins.offset]
    if ins.opname != "RAISE_VARARGS":
        offsets.append(code_mod.next_offset(code, ins.offset))
    if ins.opname in _BRANCHES and isinstance(ins.argval, int):
        offsets.append(ins.argval)
    return offsets


def _native_call(glue: GlueBuilder, fn: types.FunctionType, root: Any, stack: list[Any], depth: int,
                 expression: str, in_try: bool) -> str:
    """Emit `result = expression` (the breaking call, run natively) and return the result's name;
    inside a try block, under the frame's own handlers (`_call_under_handlers`)."""
    result = glue.fresh("result")
    call = f"{result} = {expression}"
    if in_try:
        _call_under_handlers(glue, fn, root, stack, depth, call)
    else:
        glue.line(call)
    return result


def _call_under_handlers(glue: GlueBuilder, fn: types.FunctionType, root: Any, stack: list[Any],
                         depth: int, call: str) -> None:
    """Emit `call` so that an exception it raises reaches the frame's own handlers.

    If the call raises, the frame continues natively at the CALL itself, with the callable slot
    replaced by one that raises the caught exception: the try block's handler sees the very
    exception, and the call's side effects are not repeated.
    """
    callable_slot = len(stack) - depth + (1 if isinstance(stack[len(stack) - depth], NullVariable) else 0)
    exc = glue.fresh("exc")
    raising = list(stack)
    raising[callable_slot] = _Named(f"{glue.constant(reraise)}({exc})")
    native = ResumeFunctions(fn, lambda f: f, native=True)
    live, values = _live_values(root, code_mod.live_locals_at(fn.__code__, root.current.offset))
    # built before the try: reconstructing the live values may emit lines of its own (a list made in
    # the frame), which must not land between `except` and its body
    resume = native.expression(glue, root.current.offset, raising, live, values)
    glue.line("try:")
    glue.line(f"    {call}")
    glue.line(f"except BaseException as {exc}:")
    glue.line(f"    return {resume}")


class _Named:
    """A value the glue already holds in a local name (the result of the native call)."""

    source = None

    def __init__(self, name: str) -> None:
        self.name = name

    def reconstruct(self, glue: GlueBuilder) -> str:
        return self.name
