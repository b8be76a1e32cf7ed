"""Deferred checks: a branch on a tensor's value whose other side only raises, kept in one graph.

`if not torch._is_all_true(valid): raise ValueError(...)` (torch.distributions' argument and
sample validation), `assert (x > 0).all(), msg` and a user's own `if not ok.all(): raise ...` branch
on a value the graph computes. A data-dependent branch is otherwise a graph break; here the side
that raises is taken to be the exceptional one: the trace follows the other side, and the branch's
condition (a bool tensor, true where the program goes on) becomes an extra output of the graph.
The glue checks it right after the graph call, before any side effect is replayed
(`check_passed`). When it is false, nothing the program can see has happened yet (see below), so
the frame runs again eagerly from its start (kiln.capture.entry, `_Frame.after_mismatch`): the
user gets exactly eager's exception, its message built by the program's own code (the tensor
reprs in it included), after exactly eager's side effects, or eager's result where the program
catches it. A later call runs the compiled code again.

Safe only where the graph itself does nothing observable before the glue's check:
- it writes no input's storage (an in-place op on an argument, a buffer): such a graph is captured
  again without deferral (`UnsafeDeferral`), and the branch is a graph break as before;
- it may draw random numbers: the CPU generator's state (and CUDA's, where initialized) is taken
  before the graph and put back before the eager run, so eager draws the same numbers once.
Side effects of the frame (list appends, attribute writes, prints at a break) are replayed by the
glue after the check, so a failing check has done none of them. Compiled frames that called this
one had done their work already: the eager run is of this frame alone, as after a guard miss.

A branch whose raising side is no straight run ending in `raise` (an `else` with work in it, a
loop) stays a break: deferring it would run the frame twice each time the unlikely side is taken;
so does one inside a try block of the traced frames (the program catches it: control flow). A with
block (`torch.no_grad()`) does not count.
No PyTorch counterpart: torch.compile turns distribution validation off for the whole process.

The same rerun answers an op that raises only at run time (fake tensors cannot tell an index out
of range) inside a try or with block of the traced frames (`_under_handler_call`): the program's
handler sees eager's exception, where torch.compile's graph raises past it. Only ops that may raise
for some tensor values count (`may_raise_at_run_time`): a graph called under a handler keeps no
native fast entry.
"""
from __future__ import annotations

import dis
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

from kiln.capture import code as code_mod
from kiln.errors import DeferredCheckFailed, ExternMismatchError

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.output_graph import OutputGraph
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable

_MAX_RAISE_BLOCK = 400  # instructions scanned for the `raise` of a branch's raising side
# instructions after which a straight run is no longer one that only raises
_LEAVES = frozenset({"RETURN_VALUE", "RERAISE", "FOR_ITER", "SEND", "YIELD_VALUE", "RETURN_GENERATOR"})


def raises_from(code: types.CodeType, offset: int) -> bool:
    """Whether the instructions from `offset` run straight (no jump, return or loop) into a
    `raise <exception>`: the side of a branch that only builds an exception and raises it."""
    listing, index_of = code_mod.instructions(code)
    i = index_of.get(offset)
    if i is None:
        return False
    for ins in listing[i:i + _MAX_RAISE_BLOCK]:
        if ins.opname == "RAISE_VARARGS":
            return bool(ins.arg)
        if "JUMP" in ins.opname or ins.opname in _LEAVES:
            return False
    return False


def deferred_branch(tx: "Tracer", value: "Variable", instr: dis.Instruction, when: bool) -> bool | None:
    """For POP_JUMP_*_IF_<when> on a tensor computed in the graph: whether the jump is taken, with
    the condition of the side that does not raise recorded as a deferred check; None where the
    branch is not of that shape (the caller then asks the value's truth, a break as before)."""
    from kiln.capture.variables.tensor import TensorVariable

    if type(value) is not TensorVariable or value.constant is not None or not tx.state.defer_checks:
        return None
    example = value.example
    numel = example.numel()
    if type(numel) is not int or numel != 1 or example.layout != torch.strided or example.is_complex():
        return None  # bool() of it raises (several values), or is not a plain number's truth
    following = tx.instructions[tx.index_of[instr.offset] + 1].offset
    if raises_from(tx.code, following):
        taken = True  # the fall-through raises: the program goes on where the jump goes
    elif raises_from(tx.code, instr.argval):
        taken = False
    else:
        return None
    if _caught_in_trace(tx):
        return None  # a raise the program's own try catches is control flow, not an error
    truth = taken == when  # the value's truth on the side that goes on
    if truth:
        # a bool the graph computes is the condition itself; an input is given an op (a graph of
        # no ops is not called, and its check would be lost)
        plain = example.dtype == torch.bool and value.node.op != "placeholder"
        test = value if plain else tx.call_op("call_method", "bool", [value], {})
    else:
        test = tx.call_op("call_function", torch.logical_not, [value], {})
    if example.dim():
        test = tx.call_op("call_method", "squeeze", [test], {})
    tx.output.deferred_checks.append(test.node)  # type: ignore[attr-defined]
    return taken


def _caught_in_trace(tx: "Tracer") -> bool:
    """Whether a try block (a with block does not count) of a frame being traced covers its
    current instruction."""
    frame: Any = tx
    while frame is not None:
        if frame.current is not None and _in_try_block(frame.code, frame.current.offset):
            return True
        frame = frame.parent
    return False


# Draws whose arguments' values may be refused at run time (a probability that is not one), beside
# the ops kiln.fake.value_checks names (an index out of range, an integer divisor of zero, an assert)
_RAISING_DRAWS = frozenset({"multinomial", "bernoulli", "poisson", "binomial"})


def may_raise_at_run_time(node: torch.fx.Node) -> bool:
    """Whether a captured op may raise at run time for some values of its tensors, which fake tensors
    cannot judge. Anything else fails at capture already (shapes, dtypes) or not at all, and needs no
    handler around its graph: a graph called under one keeps no native fast entry (a frame's body
    inside `with torch.no_grad():` is common)."""
    from kiln.fake.value_checks import raises_on_values

    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return raises_on_values(node) or str(name).rstrip("_") in _RAISING_DRAWS


def under_handler(tx: "Tracer") -> bool:
    """Whether a try or with block of a frame being traced covers its current instruction: an op
    recorded there may raise at run time (an index out of range, a probability that is not one)
    where the program catches it, or where a manager's __exit__ sees it."""
    frame: Any = tx
    while frame is not None:
        if frame.current is not None and _in_try_block(frame.code, frame.current.offset, with_blocks=True):
            return True
        frame = frame.parent
    return False


def _in_try_block(code: types.CodeType, offset: int, with_blocks: bool = False) -> bool:
    # as glue.in_try_block (which this module, imported by the glue, does not import back)
    listing, index_of = code_mod.instructions(code)
    for entry in code_mod.exception_entries(code):
        if entry.start <= offset < entry.end:
            n = index_of.get(entry.target)
            if with_blocks or n is None or n + 1 >= len(listing) or listing[n + 1].opname != "WITH_EXCEPT_START":
                return True
    return False


# -------------------------------------------------------------------------------- the glue's side

# capture-level targets known to draw no random numbers (anything else is assumed to: the state is
# saved, a microsecond or two)
def _draws(node: torch.fx.Node) -> bool:
    if node.op in ("placeholder", "output"):
        return False
    if node.op not in ("call_function", "call_method"):
        return True  # a submodule or a subgraph: unknown
    target = node.target
    if node.op == "call_function" and getattr(target, "__module__", None) in ("_operator", "operator"):
        return False
    name = target if isinstance(target, str) else getattr(target, "__name__", None)
    if not isinstance(name, str) or "dropout" in name or "rand" in name:
        return True
    if name in _KNOWN_PLAIN:
        return False
    packet = getattr(torch.ops.aten, name.strip("_") if name.startswith("__") else name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return True
    return any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads())


_KNOWN_PLAIN = frozenset({"getattr", "getitem", "size", "stride", "dim", "numel", "contiguous", "type_as", "float",
                          "double", "half", "bool", "long", "int", "reshape", "view", "expand", "broadcast_to",
                          "_is_all_true", "logical_not", "_set_grad_enabled", "sym_floordiv"})


def emit_checks(glue: "GlueBuilder", output: "OutputGraph", call: str) -> list[str]:
    """The glue's lines for the graph call `call` (`__out = __graph(...)`): with deferred checks,
    the RNG state taken before it where the graph may draw, the call under a handler (an op after
    the check may raise where eager raised at the check: a gather's index out of range, the one
    the check was there to refuse), and one check of all deferred conditions right after it.
    Called before the graph is closed (the combined condition becomes an output)."""
    first = divisor_checks(glue, output)
    checks: Sequence[torch.fx.Node] = output.deferred_checks
    if not checks:
        return first + _under_handler_call(glue, output, call)
    if output.writes_inputs:
        from kiln.errors import UnsafeDeferral
        raise UnsafeDeferral("a graph with deferred checks writes into an input")
    node = checks[0]
    if len(checks) > 1:
        stacked = output.graph.call_function(torch.stack, (list(checks),))  # the graph is not closed yet:
        node = output.graph.call_function(torch.all, (stacked,))  # appended at its end
        stacked.meta["example_value"] = _fake(output, lambda: torch.stack([c.meta["example_value"] for c in checks]))
        node.meta["example_value"] = _fake(output, lambda: torch.all(stacked.meta["example_value"]))
    slot = glue.graph_value(_Holder(node))
    check = glue.constant(check_passed)
    state, before = "None", []
    if any(_draws(n) for n in output.graph.nodes):
        state = glue.fresh("rng")
        before = [f"{state} = {glue.constant(rng_state)}()"]
    grad = _grad_before(glue, output, before)
    error = glue.fresh("exc")
    return first + before + ["try:", f"    {call}", f"except Exception as {error}:",
                     f"    {glue.constant(graph_raised)}({error}, {state}{grad})", f"{check}({slot}, {state})"]


def _under_handler_call(glue: "GlueBuilder", output: "OutputGraph", call: str) -> list[str]:
    """The graph call of a graph with no deferred check, under a handler where it needs one.

    A graph with ops traced inside a try or with block: an error it raises at run time (an op
    whose arguments fake tensors cannot judge: an index out of range, a multinomial's bad
    probabilities) runs the frame again eagerly, so that the program's own handler (or a
    manager's __exit__) sees eager's exception where eager raised it, and a `with
    torch.no_grad()` that the graph entered is left as eager leaves it. Safe as a deferred
    check's failure is (see above): nothing visible was done yet, the RNG and the grad mode are
    put back as they were before the call. A graph that writes an input is called as it is (its
    writes may have happened before the error: the frame cannot run again)."""
    if not output.ops_under_handler or output.writes_inputs:
        return [call]
    before, state = [], "None"
    if any(_draws(n) for n in output.graph.nodes):
        state = glue.fresh("rng")
        before.append(f"{state} = {glue.constant(rng_state)}()")
    grad = _grad_before(glue, output, before)
    error = glue.fresh("exc")
    return before + ["try:", f"    {call}", f"except Exception as {error}:",
                     f"    {glue.constant(graph_raised)}({error}, {state}{grad})"]


def _grad_before(glue: "GlueBuilder", output: "OutputGraph", before: list[str]) -> str:
    """Where the graph switches grad mode: a line keeping the mode before the call (appended to
    `before`), and graph_raised's third argument, the name it is kept under; else ""."""
    if not any(n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in output.graph.nodes):
        return ""
    grad = glue.fresh("grad")
    before.append(f"{grad} = {glue.constant(torch.is_grad_enabled)}()")
    return f", {grad}"


def divisor_checks(glue: "GlueBuilder", output: "OutputGraph") -> list[str]:
    """The glue's lines before the graph call that test the graph's symbolic divisors of Python
    numbers (`a // b` with b an int or float argument, OutputGraph.divisors). Inside the graph a zero
    divisor would raise before the graph's input writes and the frame's side effects were applied
    (a lowered wrapper tests it before its first kernel), where eager had done the ones before the
    division: so a zero divisor makes the frame run eagerly for this call instead, nothing done yet."""
    env = output.shape_env
    if env is None or not output.divisors:
        return []
    from kiln.symbolic.expr import relation  # here for start-up time: sympy, loaded once a divisor is symbolic

    known = set(env.symbol_sources())
    tests: dict[str, None] = {}
    for divisor in output.divisors:
        divisor = env.replace(divisor)
        if divisor.is_number or not {str(s) for s in divisor.free_symbols} <= known:
            continue  # a constant (never 0 here), or a symbol no input gives
        if env._static_value(relation("ne", divisor, 0)):
            continue  # a size, >= 2
        tests[f"({env.render(divisor)}) == 0"] = None
    if not tests:
        return []
    return [f"if {' or '.join(tests)}: {glue.constant(divides_by_zero)}()"]


def divides_by_zero() -> None:
    """The glue's answer to a zero divisor (divisor_checks): the entry runs the frame eagerly."""
    raise DeferredCheckFailed("a divisor of the graph is 0: the frame runs eagerly, where eager raises", clean=True)


class _Holder:
    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node


def _fake(output: "OutputGraph", make: Any) -> Any:
    with output.fake_mode:
        return make()


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The default generators' states (CPU, and each CUDA device's where CUDA is initialized)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _restore(state: tuple[torch.Tensor, list[torch.Tensor] | None] | None) -> None:
    if state is not None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])


def graph_raised(error: Exception, state: tuple[torch.Tensor, list[torch.Tensor] | None] | None,
                 grad: bool | None = None) -> None:
    """The graph raised: eager may have raised at a deferred check before the op that raised, with
    its own exception, or in a try block that catches it, so the frame runs eagerly (where the
    error is eager's too, eager raises it), from the grad mode it was called under (`grad`, where
    the graph switches it). Kiln's own ExternMismatchError goes on as it is."""
    if grad is not None:
        torch._C._set_grad_enabled(grad)
    if isinstance(error, ExternMismatchError):
        raise error
    _restore(state)
    raise DeferredCheckFailed("the graph raised before its deferred checks were read: the frame runs eagerly",
                              clean=True) from error


def check_passed(ok: Any, state: tuple[torch.Tensor, list[torch.Tensor] | None] | None) -> None:
    """The glue's check of the deferred conditions: on failure the RNG is put back as it was
    before the graph and DeferredCheckFailed asks the entry to run the frame eagerly."""
    if bool(ok):
        return
    _restore(state)
    raise DeferredCheckFailed("a deferred check of the graph failed: the frame runs eagerly", clean=True)
