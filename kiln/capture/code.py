"""Code objects for graph breaks: resume functions, liveness, and a readable disassembly.

`make_resume_code` turns a code object and a byte offset into a code object that takes the live stack
and locals as arguments and continues there (torch/_dynamo/resume_execution.py), `resume_callable`
makes what the glue calls from a `ResumeRequest` (also from one read back from disk, after
`stack_shape_at` checked it against the bytecode), `make_handler_code`
continues in the user's except/finally/with exit when the native instruction raised; `live_locals_at`
says which locals to pass (bytecode_analysis.py); `render_code` is what KILN_LOGS=bytecode prints.
Generators, coroutines and except-handler bodies raise Unsupported. The only importer of `bytecode`.
"""
from __future__ import annotations

import dis
import functools
import inspect
import linecache
import re
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label

from kiln import log
from kiln.errors import Unsupported

_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_PREFIX_OPS = frozenset({"MAKE_CELL", "COPY_FREE_VARS", "RESUME"})
# An instruction whose only successor is its jump target (or none at all).
_NO_FALLTHROUGH = frozenset(
    {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "RETURN_VALUE", "RAISE_VARARGS",
     "RERAISE"}
)
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_CLASSDEREF",
                    "DELETE_FAST", "DELETE_DEREF"})
_WRITES = frozenset({"STORE_FAST", "STORE_DEREF"})


def oparg(instr: dis.Instruction) -> int:
    """The operand of an opcode that always has one (every opcode from dis.HAVE_ARGUMENT on)."""
    assert instr.arg is not None, f"{instr.opname} without an operand"
    return instr.arg


def exception_entries(code: types.CodeType) -> tuple[Any, ...]:
    """The exception table of `code` (dis's entries: start, end, target, depth, lasti)."""
    # public since 3.11 but missing from typeshed's dis stub
    return tuple(dis.Bytecode(code).exception_entries)  # type: ignore[attr-defined]


_resume_cache: dict[tuple[Any, ...], types.CodeType] = {}
# resume code -> (the user's code object, bytes its body was moved by): a resume function that breaks
# again gets the resume code of the *user's* code at the same point, so the chain does not grow and a
# break inside a loop meets the same code object (and its compiled cache entry) every iteration.
_origins: dict[types.CodeType, tuple[types.CodeType, int]] = {}


def reset() -> None:
    """Forget every resume code object made so far, and every routed code (kiln.reset calls this)."""
    _resume_cache.clear()
    _origins.clear()
    route_calls.cache_clear()


def is_resume_code(code: types.CodeType) -> bool:
    """True for a code object made by make_resume_code or make_handler_code."""
    return code in _origins


def origin_of(code: types.CodeType) -> types.CodeType | None:
    """The user's code object a resume (or handler) code continues; None for any other code."""
    found = _origins.get(code)
    return None if found is None else found[0]


# --------------------------------------------------------------------------------------- reading code

@dataclass(frozen=True)
class _Listing:
    """The instructions of one code object as dis sees them, minus EXTENDED_ARG."""

    instrs: tuple[dis.Instruction, ...]
    index: Mapping[int, int]  # byte offset -> position in instrs; an EXTENDED_ARG maps to what it extends
    handlers: tuple[Any, ...]  # dis's exception-table entries


@functools.lru_cache(maxsize=256)
def _listing(code: types.CodeType) -> _Listing:
    # EXTENDED_ARG is folded into the next instruction by the bytecode library, so leave it out here
    # too: the two lists must line up one to one. Jumps may still target an EXTENDED_ARG.
    instrs: list[dis.Instruction] = []
    index: dict[int, int] = {}
    pending: list[int] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":
            pending.append(ins.offset)
            continue
        for off in (*pending, ins.offset):
            index[off] = len(instrs)
        pending.clear()
        instrs.append(ins)
    return _Listing(tuple(instrs), index, exception_entries(code))


def instructions(code: types.CodeType) -> tuple[tuple[dis.Instruction, ...], Mapping[int, int]]:
    """The instructions of `code` without EXTENDED_ARG, and byte offset -> position. A jump to an
    instruction with an EXTENDED_ARG prefix targets the prefix, which maps to the instruction."""
    listing = _listing(code)
    return listing.instrs, listing.index


def _position(code: types.CodeType, offset: int) -> int:
    listing = _listing(code)
    if offset not in listing.index:
        raise ValueError(f"no instruction starts at offset {offset} of {code.co_name} ({code.co_filename})")
    return listing.index[offset]


def instruction_at(code: types.CodeType, offset: int) -> dis.Instruction:
    """The instruction that starts at byte `offset` of `code` (ValueError if none starts there)."""
    return _listing(code).instrs[_position(code, offset)]


def next_offset(code: types.CodeType, offset: int) -> int:
    """The offset of the instruction after the one at `offset` (inline CACHE entries skipped)."""
    n = _position(code, offset) + 1
    instrs = _listing(code).instrs
    if n >= len(instrs):
        raise ValueError(f"no instruction follows offset {offset} of {code.co_name}")
    return instrs[n].offset


def line_of(code: types.CodeType, offset: int) -> int | None:
    """The source line of the instruction at `offset` (the last line started at or before it)."""
    line = None
    for start, lineno in dis.findlinestarts(code):
        if start > offset:
            break
        line = lineno
    return line


def _successors(instr: dis.Instruction, following: int | None,
                handlers: Sequence[Any]) -> list[int]:
    out: list[int] = []
    if instr.opname not in _NO_FALLTHROUGH and following is not None:
        out.append(following)
    if instr.opcode in _JUMPS:
        out.append(instr.argval)
    for entry in handlers:
        if entry.start <= instr.offset < entry.end:
            out.append(entry.target)
            break  # CPython uses the innermost (first matching) entry only
    return out


def live_locals_at(code: types.CodeType, offset: int) -> tuple[str, ...]:
    """Locals that some path from `offset` reads before writing, and every cell variable, in co order.

    These are the locals a resume function at `offset` needs; everything else is dead there. Exception
    edges count (a handler that reads `x` keeps `x` live across the whole `try` body). A name may be
    live yet unbound at `offset` (assigned later on the normal path): pass only the bound ones; the
    others stay unbound locals of the resume code, exactly as in the original frame. Cell variables
    are passed as their cells, bound or not (see make_resume_code): an inner function made before
    the break shares the cell, and a write after the break must reach it.
    """
    live = _live_in(code)[_position(code, offset)] | set(code.co_cellvars)
    implicit_self = _implicit_self(code)
    if implicit_self is not None:
        live = live | {implicit_self}  # zero-argument super() reads it without a LOAD_FAST
    order = list(code.co_varnames) + [c for c in code.co_cellvars if c not in code.co_varnames]
    return tuple(name for name in order if name in live)


@functools.lru_cache(maxsize=256)
def _live_in(code: types.CodeType) -> tuple[frozenset[str], ...]:
    listing = _listing(code)
    instrs, index, handlers = listing.instrs, listing.index, listing.handlers
    local_names = set(code.co_varnames) | set(code.co_cellvars)
    succ = [_successors(ins, instrs[n + 1].offset if n + 1 < len(instrs) else None, handlers)
            for n, ins in enumerate(instrs)]
    live_in: list[frozenset[str]] = [frozenset()] * len(instrs)
    changed = True
    while changed:  # backward dataflow to a fixed point; code objects are small
        changed = False
        for n in range(len(instrs) - 1, -1, -1):
            ins = instrs[n]
            out: set[str] = set()
            for target in succ[n]:
                out |= live_in[index[target]]
            name = ins.argval if isinstance(ins.argval, str) else None
            if ins.opname in _WRITES and name in local_names:
                out.discard(name)
            if ins.opname in _READS and name in local_names:
                out.add(name)
            new = frozenset(out)
            if new != live_in[n]:
                live_in[n] = new
                changed = True
    return tuple(live_in)


@dataclass(frozen=True)
class StackShape:
    """The value stack before an instruction, as the bytecode alone says: its depth, and which slots
    may hold the NULL that 3.11 pushes below a callable (PUSH_NULL, LOAD_GLOBAL's low bit,
    LOAD_METHOD's first result), consumed only by the CALL or CALL_FUNCTION_EX above it."""

    depth: int
    maybe_null: frozenset[int]


# Instructions that push nothing: what is below the slots they pop is left as it was.
_PUSHES_NOTHING = frozenset({"POP_TOP", "STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF", "STORE_ATTR",
                             "STORE_SUBSCR", "DELETE_SUBSCR", "DELETE_ATTR", "RETURN_VALUE", "RAISE_VARARGS",
                             "RERAISE", "POP_EXCEPT", "PRINT_EXPR", "IMPORT_STAR", "POP_JUMP_FORWARD_IF_TRUE",
                             "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
                             "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE",
                             "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE",
                             "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", "LIST_APPEND", "SET_ADD", "MAP_ADD",
                             "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE", "DICT_MERGE", "PRECALL"})


def _shape_after(ins: dis.Instruction, shape: tuple[bool, ...], jump: bool) -> tuple[bool, ...] | None:
    """The stack (a may-be-NULL flag per slot) after `ins`; None where the bytecode is not understood.
    When unsure a flag is cleared: a slot wrongly not admitted as NULL costs a stored entry, never
    a NULL where CPython expects an object."""
    name, arg = ins.opname, ins.arg
    if name == "PUSH_NULL":
        return (*shape, True)
    if name == "RETURN_GENERATOR":  # the frame resumed gets the value sent, which POP_TOP drops
        return (*shape, False)
    if name == "LOAD_GLOBAL" and arg is not None and arg & 1:
        return (*shape, True, False)
    if name == "LOAD_METHOD":
        return (*shape[:-1], True, False) if shape else None
    if name == "SWAP" and arg is not None and 2 <= arg <= len(shape):
        swapped = list(shape)
        swapped[-1], swapped[-arg] = swapped[-arg], swapped[-1]
        return tuple(swapped)
    if name == "COPY" and arg is not None and 1 <= arg <= len(shape):
        return (*shape, False)  # a NULL is never copied by code CPython compiles
    try:
        effect = dis.stack_effect(ins.opcode, arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=jump)
    except ValueError:
        return None
    if effect < 0:
        if -effect > len(shape):
            return None
        kept = shape[:len(shape) + effect]
        if name in _PUSHES_NOTHING or not kept:
            return kept
        return (*kept[:-1], False)  # the slot below what was popped took the result (CALL: the NULL's)
    # What an instruction pops and pushes back in one slot is never a NULL in code CPython compiles
    # (only a CALL takes one): the flags below stay, the new slots hold objects.
    return shape + (False,) * effect


@functools.lru_cache(maxsize=64)
def _stack_shapes(code: types.CodeType) -> dict[int, tuple[bool, ...]]:
    """The stack before each reachable instruction (by offset), from a forward walk of `code`'s
    flow graph, exception edges included. Paths that disagree on a depth make the code unknown
    (an empty map); on a flag they are merged by `or` (either path may bring the NULL)."""
    listing = _listing(code)
    instrs, index, handlers = listing.instrs, listing.index, listing.handlers
    shapes: dict[int, tuple[bool, ...]] = {0: ()}
    work = [0]
    while work:
        n = work.pop()
        ins = instrs[n]
        shape = shapes[n]
        following = n + 1 if n + 1 < len(instrs) else None
        edges: list[tuple[int, tuple[bool, ...] | None]] = []
        if ins.opname not in _NO_FALLTHROUGH and following is not None:
            edges.append((following, _shape_after(ins, shape, jump=False)))
        if ins.opcode in _JUMPS:
            edges.append((index[ins.argval], _shape_after(ins, shape, jump=True)))
        for entry in handlers:
            if entry.start <= ins.offset < entry.end:
                if entry.depth > len(shape):
                    return {}
                # CPython keeps `depth` slots, pushes the raising instruction's index if lasti, then the exception
                edges.append((index[entry.target], shape[:entry.depth] + (False,) * (1 + bool(entry.lasti))))
                break
        for target, after in edges:
            if after is None:
                return {}
            seen = shapes.get(target)
            if seen is None:
                shapes[target] = after
                work.append(target)
            elif len(seen) != len(after):
                return {}
            elif any(a and not s for s, a in zip(seen, after)):
                shapes[target] = tuple(s or a for s, a in zip(seen, after))
                work.append(target)
    return {instrs[n].offset: shape for n, shape in shapes.items()}


def stack_shape_at(code: types.CodeType, offset: int) -> StackShape | None:
    """The stack before the instruction at `offset` of `code` as its bytecode says (None when the
    analysis does not know it: an unreachable offset, an instruction it does not model). Used to
    check a stored resume request before its code is made again (kiln.capture.persist).
    At a CALL it is the stack its PRECALL sees: dis counts the arguments as popped by the PRECALL,
    but they stay on the stack until the CALL takes them (a handler's resume continues at the CALL
    itself with them, kiln.capture.glue's _call_under_handlers)."""
    ins = instruction_at(code, offset)
    if ins.opname == "CALL":
        listing = _listing(code)
        n = listing.index[ins.offset]
        if n > 0 and listing.instrs[n - 1].opname == "PRECALL":
            ins = listing.instrs[n - 1]
    shape = _stack_shapes(code).get(ins.offset)
    if shape is None:
        return None
    return StackShape(len(shape), frozenset(i for i, flag in enumerate(shape) if flag))


def _inside_except_handler(code: types.CodeType, offset: int) -> bool:
    return _handler_nesting(code).get(_position(code, offset), 0) > 0


@functools.lru_cache(maxsize=256)
def _handler_nesting(code: types.CodeType) -> dict[int, int]:
    # Between PUSH_EXC_INFO and its POP_EXCEPT the frame is handling an exception: sys.exc_info(), a
    # bare `raise` and implicit chaining all depend on it, and a fresh frame cannot be given it.
    # Forward walk of that nesting; where paths disagree (an exception edge from an instruction that
    # cannot raise, such as the COPY of a cleanup block) the smallest nesting is the real one.
    listing = _listing(code)
    instrs, index, handlers = listing.instrs, listing.index, listing.handlers
    nesting: dict[int, int] = {0: 0}
    work = [0]
    while work:
        n = work.pop()
        ins = instrs[n]
        after = nesting[n] + (ins.opname == "PUSH_EXC_INFO") - (ins.opname == "POP_EXCEPT")
        following = instrs[n + 1].offset if n + 1 < len(instrs) else None
        jump = ins.argval if ins.opcode in _JUMPS else None
        for target in _successors(ins, following, handlers):
            if target not in (following, jump) and ins.opname in ("PUSH_EXC_INFO", "POP_EXCEPT"):
                continue  # neither can raise: the table only covers them because ranges are merged
            m = index[target]
            if m not in nesting or after < nesting[m]:
                nesting[m] = after
                work.append(m)
    return nesting


# -------------------------------------------------------------------------------------- resume code

def resume_name(code: types.CodeType, offset: int) -> str:
    """`__resume_<fn>_at_<line>`: the name a resume function gets (not unique across offsets)."""
    # A resume function that breaks again is named after the user's function, not after itself.
    original = re.sub(r"^__resume_(.*)_at_\d+$", r"\1", code.co_name)
    base = re.sub(r"\W", "", original) or "fn"
    return f"__resume_{base}_at_{line_of(code, offset)}"


@functools.lru_cache(maxsize=64)
def _parsed(code: types.CodeType) -> Bytecode:
    return Bytecode.from_code(code, conserve_exception_block_stackdepth=True)


def make_resume_code(code: types.CodeType, offset: int, nstack: int, live_locals: Sequence[str], *,
                     null_slots: Sequence[int] = ()) -> types.CodeType:
    """A code object taking `___stack<i>..., *live_locals` that continues `code` at byte `offset`.

    `nstack` is the stack depth at `offset` (bottom slot is `___stack0`); slots listed in `null_slots`
    are NULL markers, rebuilt with PUSH_NULL and not taken as arguments. Memoized: the same request
    gives the same code object, so caches keyed by code object hit on the next capture.

    Supported break points (tests/capture/test_code.py runs each one natively):
    - straight-line code, and any instruction inside `for` loops (the iterator is a stack slot) and
      `while` loops;
    - inside `with` blocks: the bound `__exit__` of an *entered* context manager is a stack slot, so the
      glue must enter a real manager (e.g. `torch.no_grad()`) and pass its `__exit__`; the resume code
      calls it on normal exit and on an exception, exactly as the original frame would have; for a
      manager capture cannot model, the glue runs BEFORE_WITH natively and resumes at the next offset
      with `[bound __exit__, __enter__'s result]` on the stack;
    - inside `try` bodies with `except` / `finally` (the exception table is kept, with its original depths,
      because the stack layout at the target is the original's);
    - closures: free variables come from the function's closure (`make_function(..., closure=...)`);
      cell variables among `live_locals` are passed as the cells themselves (their `MAKE_CELL` is left
      out of the prologue), so an inner function made before the break and the resumed frame share one
      cell: a write on either side is seen by the other, as in the original frame (`passed_cells`);
    - calls with keyword arguments and method calls; a NULL stack slot (3.11 pushes one below a callable)
      is rebuilt with `PUSH_NULL` when its index is given in `null_slots` (it is not an argument);
    - methods using zero-argument `super()`: CPython reads `self` from local slot 0, so
      live_locals_at reports it live and the prologue moves it into slot 0 (the calling convention
      stays `___stack..., *live_locals`);
    - resume functions that break again (their prologue is dead code by then).
    Raises `kiln.errors.Unsupported(kind="unsupported_bytecode")` for generators, coroutines and async
    generators (their frames cannot be re-entered from a plain function), and for an offset inside an
    `except` handler (the exception being handled cannot be handed over). Not handled: resuming between a
    `KW_NAMES` and its `CALL` (capture never breaks there).
    """
    code, offset = _canonical(code, instruction_at(code, offset).offset)
    key = ("resume", code, code.co_filename, offset, nstack, tuple(live_locals), tuple(sorted(null_slots)))
    cached = _resume_cache.get(key)
    if cached is not None:
        return cached
    _check_resumable(code, offset)
    slots = _stack_slots(nstack, null_slots)
    result = _build(code, offset, slots, live_locals, resume_name(code, offset))
    _resume_cache[key] = result
    return result


@dataclass(frozen=True)
class ExceptionHandler:
    """Where CPython sends an exception raised at some offset (one exception-table entry)."""

    target: int  # offset of the handler's first instruction
    depth: int  # stack slots kept below what the unwinding pushes
    lasti: bool  # whether the raising instruction's index is pushed under the exception


def handler_at(code: types.CodeType, offset: int) -> ExceptionHandler | None:
    """The handler that catches an exception raised by the instruction at `offset`, if any."""
    offset = instruction_at(code, offset).offset
    for entry in _listing(code).handlers:
        if entry.start <= offset < entry.end:
            return ExceptionHandler(entry.target, entry.depth, entry.lasti)
    return None


def make_handler_code(code: types.CodeType, offset: int, live_locals: Sequence[str], *,
                      null_slots: Sequence[int] = ()) -> types.CodeType:
    """A code object that continues `code` as if the instruction at `offset` had raised.

    It takes `___stack0..<depth-1>` (the bottom `handler_at(code, offset).depth` slots of the stack
    at `offset`), then `___exc` (the exception), then `live_locals` at the handler's target, and jumps
    into the handler with CPython's unwinding layout (the raising instruction's index pushed under the
    exception when the entry asks for it, so a re-raise points at the right line). The glue runs a
    breaking instruction natively inside `try`; on an exception it calls this instead of the resume
    function, so the user's `except`, `finally` and `with` exits see it exactly as eager would.
    `___exc` must be an exception that was raised (it has a __traceback__): CPython hands a `with`
    exit the traceback without checking it, and a never-raised exception has none (a segfault).
    The glue should call this outside its own `except` block, so that the handler's saved
    "previous exception" is the frame's, not the glue's.
    """
    code, offset = _canonical(code, instruction_at(code, offset).offset)
    key = ("handler", code, code.co_filename, offset, tuple(live_locals), tuple(sorted(null_slots)))
    cached = _resume_cache.get(key)
    if cached is not None:
        return cached
    handler = handler_at(code, offset)
    if handler is None:
        raise ValueError(f"offset {offset} of {code.co_name} is not inside a try or with block")
    _check_resumable(code, offset)
    slots: list[Any] = _stack_slots(handler.depth, null_slots)
    if handler.lasti:
        slots.append(_LastI(offset))
    slots.append("___exc")
    name = resume_name(code, offset).replace("__resume_", "__except_", 1)
    result = _build(code, handler.target, slots, live_locals, name)
    _resume_cache[key] = result
    return result


class _LastI:
    """Prologue slot: the index of the raising instruction, counted in the new code object."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


def _check_resumable(code: types.CodeType, offset: int) -> None:
    if code.co_flags & _GENERATOR_FLAGS:
        raise Unsupported(f"cannot resume {code.co_name}: generators and coroutines are not supported",
                          kind="unsupported_bytecode")
    if _inside_except_handler(code, offset):
        raise Unsupported(f"cannot resume {code.co_name} inside an except handler "
                          f"(line {line_of(code, offset)})", kind="unsupported_bytecode")


def _canonical(code: types.CodeType, offset: int) -> tuple[types.CodeType, int]:
    """The user's code and offset behind a point of a resume code (an offset of the prologue, or a
    code object this module did not make, is its own)."""
    origin = _origins.get(code)
    if origin is None or offset - origin[1] not in _listing(origin[0]).index:
        return code, offset
    return origin[0], offset - origin[1]


def _stack_slots(nstack: int, null_slots: Sequence[int]) -> list[Any]:
    if any(not 0 <= s < nstack for s in null_slots):
        raise ValueError(f"null_slots {tuple(null_slots)} outside a stack of depth {nstack}")
    return [None if i in null_slots else f"___stack{i}" for i in range(nstack)]


def _build(code: types.CodeType, target: int, slots: Sequence[Any], live_locals: Sequence[str],
           name: str) -> types.CodeType:
    """`code` with a prologue that pushes `slots` (an argument name, None for NULL, or _LastI) and
    jumps to `target`; arguments are the named slots, then `live_locals`."""
    arg_slots = [s for s in slots if isinstance(s, str)]
    if set(arg_slots) & set(live_locals) or len(set(live_locals)) != len(live_locals):
        raise ValueError(f"bad live_locals {tuple(live_locals)} for {code.co_name}")
    lineno = line_of(code, target) or code.co_firstlineno
    argnames, moves = _place_implicit_self(code, [*arg_slots, *live_locals])
    shift = 0
    for _ in range(3):  # a _LastI constant depends on the prologue's length; it settles at once
        result, new_shift = _assemble(code, target, slots, argnames, moves, name, lineno, shift)
        if new_shift == shift or not any(isinstance(s, _LastI) for s in slots):
            break
        if new_shift is None:
            raise AssertionError(f"{code.co_name}: the prologue re-encoded the body")
        shift = new_shift
    else:
        raise AssertionError(f"{code.co_name}: prologue length did not settle")
    if new_shift is not None:
        _origins[result] = (code, new_shift)
    log.artifact("bytecode", lambda: f"{name}: {code.co_name} continued at offset {target} "
                 f"({code.co_filename}:{lineno}):\n{render_code(result)}")
    return result


def _implicit_self(code: types.CodeType) -> str | None:
    """The first parameter, if zero-argument super() reads it: CPython takes a method's `self` from
    the frame's first local slot, whatever its name, so a resume code must keep it there."""
    if "__class__" in code.co_freevars and "super" in code.co_names and code.co_argcount > 0:
        return code.co_varnames[0]
    return None


def _place_implicit_self(code: types.CodeType,
                         positional: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Argument names keeping the calling convention (stack slots, then live locals) while `self`
    owns local slot 0: slot 0 takes self's name and receives the first argument's value, self comes
    in as `___self`, and the prologue moves both values where they belong."""
    self_name = _implicit_self(code)
    if self_name is None or self_name not in positional or positional[0] == self_name:
        return positional, []
    first = positional[0]
    k = positional.index(self_name)
    names = [self_name, *positional[1:k], "___self", *positional[k + 1:]]
    return names, [(self_name, first), ("___self", self_name)]


def _assemble(code: types.CodeType, target: int, slots: Sequence[Any], argnames: list[str],
              moves: list[tuple[str, str]], name: str, lineno: int,
              shift: int) -> tuple[types.CodeType, int | None]:
    """One assembly; returns the code and how many bytes the prologue moved the original code by."""
    parsed = _parsed(code)
    bc = Bytecode(list(parsed))  # a new list of the same (never mutated) instructions
    bc._copy_attr_from(parsed)
    real = [n for n, item in enumerate(bc) if isinstance(item, Instr)]
    positions = _listing(code).instrs
    if len(real) != len(positions):
        raise AssertionError(f"{code.co_name}: bytecode and dis disagree ({len(real)} != {len(positions)})")
    label = Label()
    bc.insert(next(n for n, ins in zip(real, positions) if ins.offset == target), label)

    prologue: list[Any] = []
    passed = set(argnames) | {dst for _, dst in moves}
    for item in bc:
        if isinstance(item, Instr) and item.name in _PREFIX_OPS:
            if item.name == "MAKE_CELL" and _cell_name(item.arg) in passed:
                continue  # the argument is the cell itself
            prologue.append(item)
        elif isinstance(item, Instr):
            break
    for src, dst in moves:
        # the slots hold what was passed: values, and cells for cell variables (no MAKE_CELL ran)
        prologue += [Instr("LOAD_FAST", src, lineno=lineno), Instr("STORE_FAST", dst, lineno=lineno)]
    for slot in slots:
        if slot is None:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        elif isinstance(slot, _LastI):
            # CPython pushes the raising instruction's index in code units; RERAISE restores it.
            prologue.append(Instr("LOAD_CONST", (slot.offset + shift) // 2, lineno=lineno))
        else:
            prologue.append(Instr("LOAD_FAST", slot, lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))

    new = Bytecode(prologue + list(bc))
    new._copy_attr_from(bc)
    new.argnames = argnames
    new.argcount = len(argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.flags = new.flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    new.name = name
    new.qualname = name
    new.docstring = parsed.docstring
    # The try regions were skipped by the prologue's jump, so the library would see them as dead and
    # write nonsense depths (a segfault in the handler). The stack at the target is the original's,
    # so the original depths and stack size stay correct.
    result = new.to_code(stacksize=code.co_stacksize + len(slots), compute_exception_stack_depths=False)
    # Everything after the prologue normally keeps its encoding (3.11 jumps are relative), so the
    # body is the original moved by a constant; None when an argument index grew an EXTENDED_ARG.
    body = _listing(result).instrs[len(prologue):]
    moved = {b.offset - o.offset for b, o in zip(body, positions)}
    same = len(body) == len(positions) and all(b.opname == o.opname for b, o in zip(body, positions))
    return result, (moved.pop() if same and len(moved) == 1 else None)


def _cell_name(arg: Any) -> str:
    return arg.name if isinstance(arg, (CellVar, FreeVar)) else str(arg)


def passed_cells(code: types.CodeType) -> tuple[str, ...]:
    """The cell variables a resume code takes as cells (arguments with no MAKE_CELL of their own);
    empty for code CPython compiled, where every cell variable has its MAKE_CELL."""
    made = set()
    for ins in _listing(code).instrs:  # the prefix CPython runs first (a resume code's original one is dead code)
        if ins.opname not in _PREFIX_OPS:
            break
        if ins.opname == "MAKE_CELL":
            made.add(ins.argval)
    arguments = set(code.co_varnames[:code.co_argcount])
    return tuple(name for name in code.co_cellvars if name in arguments and name not in made)


def make_function(code: types.CodeType, globals: dict[str, Any],
                  closure: tuple[types.CellType, ...] | None = None, name: str | None = None,
                  defaults: tuple[Any, ...] | None = None) -> types.FunctionType:
    """A Python function running `code` in `globals` with `closure` (one cell per co_freevars)."""
    want = len(code.co_freevars)
    have = 0 if closure is None else len(closure)
    if want != have:
        raise ValueError(f"{code.co_name} needs {want} closure cells ({code.co_freevars}), got {have}")
    return types.FunctionType(code, globals, name or code.co_name, defaults, closure if want else None)


# ------------------------------------------------------------------- a frame run with its calls routed

_COMPREHENSIONS = frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"})


@functools.lru_cache(maxsize=256)
def route_calls(code: types.CodeType, route: Callable[[Any], Any]) -> types.CodeType | None:
    """`code` with each call the user wrote handing its callable to `route` first and calling what
    `route` returns instead (kiln.capture.skip_frame: a frame that runs eagerly while its callees are
    compiled); its comprehensions' bodies too. A user's call has a NULL below its callable (PUSH_NULL,
    LOAD_GLOBAL's, LOAD_METHOD's: that one becomes PUSH_NULL under an attribute load, so the callable
    is the bound method in one slot); the calls CPython makes of a decorator, a `with` exit, an
    assertion's message or a comprehension have none and are left as they are. The stack at every
    original instruction is the original's, so the exception table keeps its depths. None where the
    stack analysis does not know the code."""
    shapes, parsed = _stack_shapes(code), _parsed(code)
    real = [item for item in parsed if isinstance(item, Instr)]
    listing = _listing(code).instrs
    if not shapes or len(real) != len(listing):
        return None
    depth_of = {id(item): (ins, shapes.get(ins.offset)) for item, ins in zip(real, listing)}
    out: list[Any] = []
    for item in parsed:
        if not isinstance(item, Instr):
            out.append(item)
            continue
        ins, shape = depth_of[id(item)]

        def op(name: str, *arg: Any) -> Instr:
            return Instr(name, *arg, location=item.location)  # noqa: B023 - used at once
        depth = None  # of the callable below the top, for a call of the user's
        if item.name in ("PRECALL", "CALL_FUNCTION_EX") and shape is not None:
            depth = oparg(ins) + 1 if item.name == "PRECALL" else 2 + (oparg(ins) & 1)
            if len(shape) <= depth or not shape[len(shape) - depth - 1]:
                depth = None
        if depth is not None:
            swap = [op("SWAP", depth)] if depth > 1 else []
            wrap = swap + [op("LOAD_CONST", route), op("PUSH_NULL"), op("SWAP", 3), op("PRECALL", 1), op("CALL", 1)] + swap
            kw_names = out.pop() if out and isinstance(out[-1], Instr) and out[-1].name == "KW_NAMES" else None
            out += wrap + ([kw_names] if kw_names is not None else [])
        if item.name == "LOAD_METHOD":
            out += [op("PUSH_NULL"), op("SWAP", 2), op("LOAD_ATTR", item.arg)]
        elif item.name == "LOAD_CONST" and isinstance(item.arg, types.CodeType) and item.arg.co_name in _COMPREHENSIONS:
            inner = route_calls(item.arg, route)
            out.append(item if inner is None else op("LOAD_CONST", inner))
        else:
            out.append(item)
    new = Bytecode(out)
    new._copy_attr_from(parsed)
    new.docstring = parsed.docstring
    return new.to_code(stacksize=code.co_stacksize + 3, compute_exception_stack_depths=False)


# ------------------------------------------------------------------------- resume callables

@dataclass(frozen=True)
class ResumeRequest:
    """What a resume function is made from: the offset of the frame's code it continues at, the
    stack depth there (NULL slots among it) and the live locals it takes. Data enough to make the
    same code object again (kiln.capture.persist stores it instead of code)."""

    offset: int
    nstack: int
    live: tuple[str, ...]
    null_slots: tuple[int, ...]
    native: bool = False


def resume_callable(fn: types.FunctionType, request: ResumeRequest, wrap_frame: Callable[[Any], Any]) -> Any:
    """What the glue binds as `__resumeN`: the compiled resume function (`_ResumeCall`), or for a
    frame with a closure the maker of one per closure (`_PerClosure`); its `request` attribute
    keeps what it was made from."""
    code = make_resume_code(fn.__code__, request.offset, request.nstack, list(request.live),
                                     null_slots=request.null_slots)
    wrap = (lambda f: f) if request.native else wrap_frame
    made: _ResumeCall | _PerClosure
    if fn.__closure__ is None:
        resume = make_function(code, fn.__globals__, None, code.co_name)
        made = _ResumeCall(wrap(resume), resume)
    else:
        made = _PerClosure(code, fn.__globals__, None if request.native else wrap_frame)
    made.request = request
    return made


class _ResumeCall:
    """Calls a compiled resume function, or the plain one when resumes are nested too deep.

    A loop whose body breaks resumes inside a resume inside a resume...; past `MAX_NESTING` levels
    the rest runs natively, so a long loop cannot exhaust Python's recursion limit.
    """

    MAX_NESTING = 48
    nesting = 0
    request: "ResumeRequest | None" = None

    def __init__(self, compiled: Callable[..., Any], plain: Callable[..., Any]) -> None:
        self.compiled = compiled
        self.plain = plain

    def __call__(self, *args: Any) -> Any:
        if _ResumeCall.nesting >= _ResumeCall.MAX_NESTING:
            return self.plain(*args)
        _ResumeCall.nesting += 1
        try:
            return self.compiled(*args)
        finally:
            _ResumeCall.nesting -= 1


class _PerClosure:
    """Resume functions of one code object, one per closure they are called with: each a plain
    function of that closure, compiled through the one callable of the resume code
    (kiln.capture.code_callee, its entries shared by every closure: an inner function's frame
    gets a new closure each call of its maker). The last few closures' functions are kept."""

    request: "ResumeRequest | None" = None
    KEPT = 8

    def __init__(self, code: types.CodeType, f_globals: dict[str, Any],
                 wrap_frame: Callable[[Any], Any] | None) -> None:
        self.code = code
        self.f_globals = f_globals
        self.compiled = None if wrap_frame is None else wrap_frame(code)  # None: run natively
        self._made: dict[tuple[int, ...], tuple[Any, Any]] = {}

    def __call__(self, F: types.FunctionType) -> Any:
        key = tuple(id(c) for c in F.__closure__ or ())
        made = self._made.get(key)
        if made is None:
            fn = make_function(self.code, self.f_globals, F.__closure__, self.code.co_name)
            call = fn if self.compiled is None else functools.partial(self.compiled, fn)
            made = (F.__closure__, _ResumeCall(call, fn))  # the closure kept: its cells' ids stay unique
            if len(self._made) >= self.KEPT:
                del self._made[next(iter(self._made))]
            self._made[key] = made
        return made[1]


# -------------------------------------------------------------------------------------------- render

def render_code(code: types.CodeType) -> str:
    """A readable disassembly: header, each source line once as a comment, jump targets marked `>>`."""
    args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    head = [f"code {code.co_qualname}  ({code.co_filename}:{code.co_firstlineno})",
            f"  args: {', '.join(args) or '-'}   stacksize: {code.co_stacksize}"]
    if code.co_cellvars:
        head.append(f"  cells: {', '.join(code.co_cellvars)}")
    if code.co_freevars:
        head.append(f"  free: {', '.join(code.co_freevars)}")
    lines = list(head)
    listing = _listing(code)
    handlers = listing.handlers
    targets = {listing.instrs[listing.index[i.argval]].offset for i in listing.instrs if i.opcode in _JUMPS}
    targets |= {listing.instrs[listing.index[e.target]].offset for e in handlers}
    last_line = None
    for ins in listing.instrs:
        if ins.starts_line is not None and ins.starts_line != last_line:
            last_line = ins.starts_line
            source = linecache.getline(code.co_filename, last_line).strip()
            lines.append(f"  # line {last_line}: {source}" if source else f"  # line {last_line}")
        mark = ">>" if ins.offset in targets else "  "
        arg = ins.argrepr or ("" if ins.arg is None else str(ins.arg))
        lines.append(f"  {mark} {ins.offset:4d} {ins.opname:<28} {arg}".rstrip())
    if handlers:
        lines.append("  exception table:")
        for e in handlers:
            lasti = " lasti" if e.lasti else ""
            lines.append(f"    {e.start} to {e.end - 2} -> {e.target} [depth {e.depth}]{lasti}")
    return "\n".join(lines)
