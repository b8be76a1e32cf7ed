"""Graph-break records: what broke, where in the user's code, and the compile-friendly rewrite.

Capture raises `kiln.errors.Unsupported(reason, kind=..., hint=...)` wherever it cannot go on; the
tracer turns each into a `BreakRecord` with `make_break_record`, logs it once under
KILN_LOGS=graph_breaks with `log_break`, and hands the records to kiln.explain, which prints them with
`summarize_breaks`. The hint table below is the one place a break kind gets its advice (the role of
torch/_dynamo/exc.py and the graph-break hints of torch/_dynamo/graph_break_hints.py).
"""
from __future__ import annotations

import linecache
import types
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from kiln import log
from kiln.errors import Unsupported


@dataclass(frozen=True)
class BreakRecord:
    """One graph break: the reason in plain words, the user's file:line and source, and a hint."""

    reason: str
    kind: str
    filename: str
    lineno: int
    source_line: str
    suggestion: str | None

    @property
    def location(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def __str__(self) -> str:
        lines = [f"Graph break at {self.location}"]
        if self.source_line:
            lines.append(f"    {self.source_line}")
        lines.append(f"  reason: {self.reason}")
        if self.suggestion:
            lines.append(f"  hint: {self.suggestion}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------- hint table
# One entry per break kind. The entry's docstring says when the tracer uses that kind; the function
# returns the rewrite for this break (it may look at the exception, e.g. which op was data dependent).

HintFn = Callable[[Unsupported], "str | None"]
HINTS: dict[str, HintFn] = {}


def hint_for_kind(kind: str) -> Callable[[HintFn], HintFn]:
    """Register the hint of one break kind; a kind has exactly one entry."""

    def register(fn: HintFn) -> HintFn:
        if kind in HINTS:
            raise ValueError(f"break kind {kind!r} already has a hint ({HINTS[kind].__name__})")
        if not (fn.__doc__ or "").strip():
            raise ValueError(f"hint for {kind!r} needs a docstring saying when it applies")
        HINTS[kind] = fn
        return fn

    return register


_SCALAR_OPS = ("item", "_local_scalar_dense", "tolist", "numpy", "__array__", "bool", "int", "float")
_SHAPE_OPS = ("nonzero", "unique", "masked_select", "repeat_interleave", "argwhere", "mask")


@hint_for_kind("data_dependent_branch")
def _data_dependent_branch(exc: Unsupported) -> str:
    """`if` / `while` / `and` / `or` whose condition is a tensor: the branch taken depends on data."""
    return ("compute both sides and select with torch.where(cond, a, b) instead of `if` on a tensor; "
            "for a loop, bound it with a Python int or keep the test outside the compiled function")


@hint_for_kind("compiling_path")
def _compiling_path(exc: Unsupported) -> str:
    """An error on the path that torch.compiler.is_compiling() (True under capture) chose: the frame
    runs eagerly, where it is False."""
    return ("make the path taken under compilation valid too (build the value whether or not "
            "is_compiling()), so that the frame can be compiled")


@hint_for_kind("overlapping_write")
def _overlapping_write(exc: Unsupported) -> str:
    """An in-place op or out= writes into a tensor whose elements share memory (an expand, or a view
    of an expanded input): it runs eagerly, as eager would write (or refuse) it."""
    return ("write into a tensor of its own instead, e.g. `x = x.clone()` (or `.contiguous()`) before the "
            "in-place op: an expanded tensor's elements are one memory location")


@hint_for_kind("partial_overlap")
def _partial_overlap(exc: Unsupported) -> str:
    """An in-place op or out= reads, shifted or reordered, memory it writes (`x[:-1].add_(x[1:])`):
    it runs eagerly, where ATen refuses it."""
    return "read from a copy, e.g. `x[:-1] += x[1:].clone()`: eager refuses to read what it is overwriting"


@hint_for_kind("item")
def _item(exc: Unsupported) -> str:
    """`.item()`, `.tolist()`, `.numpy()`, `int(t)`, `float(t)`: a tensor becomes a Python value."""
    return ("keep the value as a tensor (e.g. `x * scale_t` rather than `x * scale_t.item()`), "
            "or set kiln.config.capture_scalar_outputs = True to trace .item() as a symbolic scalar")


@hint_for_kind("data_dependent_shape")
def _data_dependent_shape(exc: Unsupported) -> str:
    """nonzero, unique, boolean-mask indexing: the output's shape depends on the input's values."""
    return ("move nonzero/unique/boolean masks out of the hot region, or keep a fixed shape: "
            "torch.where(mask, x, 0) instead of x[mask], a sum of the mask instead of its indices")


@hint_for_kind("data_dependent")
def _data_dependent(exc: Unsupported) -> str | None:
    """An op with a data-dependent result (kiln.errors.DataDependentOutputError); advice by op."""
    op = getattr(exc, "op", "") or ""
    if any(name in op for name in _SHAPE_OPS):
        return _data_dependent_shape(exc)
    if any(name in op for name in _SCALAR_OPS):
        return _item(exc)
    return "keep the computation on tensors so that no Python value depends on tensor data"


@hint_for_kind("inplace")
def _inplace(exc: Unsupported) -> str:
    """An in-place op capture cannot keep in the graph (on a leaf that requires grad, on a view)."""
    return "write `x = x + y` instead of `x += y` / `x.add_(y)` where autograd dislikes the mutation"


@hint_for_kind("missing_fake_impl")
def _missing_fake_impl(exc: Unsupported) -> str:
    """A custom op (or an op without a meta kernel) has no fake implementation to run on shapes."""
    return ("register the op with torch.library.custom_op and give it a fake impl with "
            "@op.register_fake (it returns empty tensors of the right shape and dtype)")


@hint_for_kind("dynamic_shape")
def _dynamic_shape(exc: Unsupported) -> str:
    """A size that changes between calls was specialized, or a dynamic size was forced to a constant."""
    return ("mark the varying dimension with kiln.mark_dynamic(x, dim) (or compile with dynamic=True) "
            "and avoid Python branches on that size")


@hint_for_kind("graph_break")
def _forced(exc: Unsupported) -> str:
    """The program asked for a break (kiln.graph_break() or torch._dynamo.graph_break())."""
    return "remove the kiln.graph_break() / torch._dynamo.graph_break() call to keep one graph"


@hint_for_kind("print")
def _print(exc: Unsupported) -> str:
    """A call to print (or another write to stdout/stderr)."""
    return ("move the print out of the compiled region (print after the call returns), or keep it: "
            "one break at a loop boundary costs little, a break inside a hot loop splits every iteration")


@hint_for_kind("logging")
def _logging(exc: Unsupported) -> str:
    """A call into the logging module or a logger method."""
    return ("log outside the compiled function, or guard the call with `if logger.isEnabledFor(...)` "
            "outside it; a log call at a loop boundary is a cheap break and may be kept")


@hint_for_kind("numpy")
def _numpy(exc: Unsupported) -> str:
    """A numpy function or a numpy array reached from traced code."""
    return "use the torch op of the same name (torch.exp for np.exp, torch.clip for np.clip, ...)"


@hint_for_kind("random")
def _random(exc: Unsupported) -> str:
    """Python's `random` module: its state lives outside any tensor."""
    return "use torch.rand / torch.randint (with a torch.Generator if a separate stream is needed)"


@hint_for_kind("disabled")
def _disabled(exc: Unsupported) -> str:
    """A call to a function marked with kiln.disable: it always runs eagerly, outside any graph."""
    return ("the callee is marked kiln.disable and always runs eagerly; remove the mark to compile it, "
            "or move the call to the start or end of the function so the graph is not split")


@hint_for_kind("unsupported_call")
def _unsupported_call(exc: Unsupported) -> str:
    """A call capture cannot trace into: a C extension, a builtin it does not model, an opaque object."""
    return ("if the callee only does tensor ops, mark it kiln.allow_in_graph; otherwise wrap it in a "
            "torch.library.custom_op with a fake impl so it enters the graph as one op")


@hint_for_kind("frame_introspection")
def _frame_introspection(exc: Unsupported) -> str:
    """sys._getframe, inspect.currentframe/stack, traceback's stack readers: they read the Python
    frames that call them, which a traced (inlined, or split at a break) frame does not have; the
    whole frame runs eagerly."""
    return "read the caller's module or name outside the compiled function and pass it in"


@hint_for_kind("frame_eager")
def _frame_eager(exc: Unsupported) -> str:
    """A torch mode manager made in the frame and entered or exited through its protocol methods
    (contextlib.ExitStack.enter_context): the whole frame runs eagerly, as under torch.compile."""
    return "use a `with` statement per manager (with torch.autocast(...), torch.no_grad(): ...)"


@hint_for_kind("collective")
def _collective(exc: Unsupported) -> str:
    """A call into torch.distributed (a collective, a process-group query, DDP/FSDP's own Python):
    it runs natively between graphs, in program order, so every rank still calls it once."""
    return ("collectives are not traced into the graph; keep them at the start or end of the compiled "
            "function, or compile the model inside DDP/FSDP (kiln.compile(DDP(model)) or "
            "DDP(kiln.compile(model))), which handles its all-reduces outside the graph")


@hint_for_kind("autograd_function")
def _autograd_function(exc: Unsupported) -> str:
    """A custom torch.autograd.Function whose forward, setup_context or backward cannot be traced
    (print, .item(), global writes, mark_dirty): apply then runs eagerly between graphs."""
    return ("keep the Function's forward and backward to tensor ops (move prints, .item() and "
            "writes to outside state out of them) so the whole .apply goes into the graph")


@hint_for_kind("checkpoint")
def _checkpoint(exc: Unsupported) -> str:
    """A torch.utils.checkpoint call whose body (or arguments) capture cannot trace: the whole
    checkpoint call runs eagerly between graphs, as torch.compile runs it."""
    return ("keep the checkpointed function to tensor ops (move prints, .item() and data-dependent "
            "branches out of it) so the region goes into the graph and the compiled backward recomputes it")


@hint_for_kind("pytree")
def _pytree(exc: Unsupported) -> str:
    """A torch.utils._pytree call capture cannot answer at trace time (a tree it cannot take apart,
    a predicate on tensor data, structures that do not match): it runs natively."""
    return ("keep pytree predicates and is_leaf functions to Python checks on types and sizes, and give "
            "tree_map trees of the same structure")


@hint_for_kind("higher_order")
def _higher_order(exc: Unsupported) -> str:
    """torch.cond / while_loop / map / scan / associative_scan that capture cannot trace inline (a
    predicate that depends on tensor data, a body that breaks or that eager rejects): it runs eagerly."""
    return ("for a data-dependent choice between two tensors, compute both and select with "
            "torch.where; bound a while_loop with a Python int or a counter made in the function")


@hint_for_kind("unsupported_bytecode")
def _unsupported_bytecode(exc: Unsupported) -> str:
    """An opcode capture does not implement, or a frame it cannot resume (e.g. an except handler)."""
    return ("move this statement into a helper marked kiln.disable, or rewrite it with plainer "
            "constructs; please report the opcode so that capture can support it")


@hint_for_kind("generator")
def _generator(exc: Unsupported) -> str:
    """A generator, coroutine or async generator function: its frame cannot be captured or resumed."""
    return ("build a list (or a tensor) instead of yielding, or compile the function that consumes "
            "the generator rather than the generator itself")


@hint_for_kind("format_tensor")
def _format_tensor(exc: Unsupported) -> str:
    """str.format / an f-string with a tensor or a traced value inside."""
    return ("format the message outside the compiled function (return the tensor and print it "
            "there), or drop the message from the hot path")


@hint_for_kind("input_metadata_mutation")
def _input_metadata_mutation(exc: Unsupported) -> str:
    """An in-place op (t_, unsqueeze_, resize_, as_strided_) changed the shape or strides of an input."""
    return "use the out-of-place op and rebind the name: `x = x.t()` instead of `x.t_()`"


@hint_for_kind("unsupported_attribute")
def _unsupported_attribute(exc: Unsupported) -> str:
    """An attribute capture cannot read at trace time (missing, or on an object it does not model)."""
    return ("read the attribute before calling the compiled function and pass the value in, "
            "or store it as a plain Python constant / tensor attribute")


@hint_for_kind("unsupported_builtin")
def _unsupported_builtin(exc: Unsupported) -> str:
    """A builtin (type, len, int, ...) applied to a value whose answer is not known at trace time."""
    return "compute the value from tensor shapes or Python constants, which are known at trace time"


@hint_for_kind("unsupported_iter")
def _unsupported_iter(exc: Unsupported) -> str:
    """Iterating over an object capture cannot unroll (an opaque iterator, a tensor of unknown length)."""
    return ("iterate over a list, tuple, dict, range or nn.ModuleList, or over a tensor's first "
            "dimension with a fixed size; turn other iterables into a list before the call")


@hint_for_kind("reconstruct")
def _reconstruct(exc: Unsupported) -> str:
    """A value that lives across a graph break cannot be rebuilt as a real Python object for the resume."""
    return ("avoid keeping that object alive across the break: remove the break (see the other "
            "hints) or create the object after it")


@hint_for_kind("lock_release")
def _lock_release(exc: Unsupported) -> str:
    """The end of a `with lock:` block whose real lock the glue took for a graph break inside it."""
    return "move what breaks the graph out of the `with lock:` block"


@hint_for_kind("unbacked_view_output")
def _unbacked_view_output(exc: Unsupported) -> str:
    """A graph output is a view, of another output, whose size is data-dependent and cannot be read
    back from that base at run time (kiln.runtime.aot); the backend refuses the graph."""
    return "return a .clone() of the view, or the base tensor itself"


@hint_for_kind("tensor_subclass")
def _tensor_subclass(exc: Unsupported) -> str:
    """A tensor of a subclass (__torch_function__ or __torch_dispatch__), a quantized or a nested
    tensor: capture traces plain tensors and Parameters only; the code using it runs natively."""
    return ("pass a plain tensor into the compiled function (`t.as_subclass(torch.Tensor)`, or the "
            "inner tensors of a wrapper subclass), or compile the functions that work on plain tensors")


@hint_for_kind("torch_mode")
def _torch_mode(exc: Unsupported) -> str:
    """A `with` on a user's TorchFunctionMode or TorchDispatchMode in a compiled frame: the block
    runs eagerly under the mode (so does a whole compiled call made under one)."""
    return ("move the ops you want compiled out of the mode's block, into a function compiled and "
            "called outside the mode")


@hint_for_kind("unsupported")
def _unsupported(exc: Unsupported) -> str | None:
    """Anything else (the default kind of Unsupported): no general rewrite exists."""
    return None


# --------------------------------------------------------------------------------- making records

def suggestion_for(exc: Unsupported) -> str | None:
    """The hint for this break: the exception's own `hint` if it has one, else the table's."""
    if exc.hint:
        return exc.hint
    entry = HINTS.get(exc.kind)
    return entry(exc) if entry is not None else None


def make_break_record(exc: Unsupported, code: types.CodeType, lineno: int | None) -> BreakRecord:
    """The record of `exc` raised while tracing `code` at `lineno` (the frame's first line if None)."""
    line = lineno if lineno is not None else code.co_firstlineno
    source = linecache.getline(code.co_filename, line).strip()
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return BreakRecord(reason=reason, kind=exc.kind, filename=code.co_filename, lineno=line,
                       source_line=source, suggestion=suggestion_for(exc))


# ------------------------------------------------------------------------------ logging, summary

_logged: set[tuple[str, int, str]] = set()


def log_break(record: BreakRecord) -> bool:
    """Print the record under KILN_LOGS=graph_breaks the first time it happens; True if it was new."""
    key = (record.filename, record.lineno, record.reason)
    if key in _logged:
        return False
    _logged.add(key)
    log.artifact("graph_breaks", str(record))
    return True


def reset() -> None:
    """Forget which breaks were logged (kiln.reset calls this, so they print again)."""
    _logged.clear()


def summarize_breaks(records: Iterable[BreakRecord]) -> str:
    """Breaks grouped by reason, most frequent first, each with its count, locations and hint."""
    records = list(records)
    if not records:
        return "No graph breaks."
    counts = Counter(r.reason for r in records)
    first: dict[str, BreakRecord] = {}
    places: dict[str, list[str]] = {}
    for r in records:
        first.setdefault(r.reason, r)
        where = places.setdefault(r.reason, [])
        if r.location not in where:
            where.append(r.location)
    noun = "break" if len(records) == 1 else "breaks"
    kinds = "reason" if len(counts) == 1 else "reasons"
    lines = [f"{len(records)} graph {noun}, {len(counts)} distinct {kinds}:"]
    # Counter.most_common keeps first-seen order among equal counts, so the output is stable.
    for n, (reason, count) in enumerate(counts.most_common(), start=1):
        r = first[reason]
        lines.append(f"  {n}. [{count}x] {reason}")
        for loc in places[reason]:
            source = next((x.source_line for x in records if x.location == loc and x.source_line), "")
            lines.append(f"       at {loc}" + (f": {source}" if source else ""))
        if r.suggestion:
            lines.append(f"       hint: {r.suggestion}")
    return "\n".join(lines)
