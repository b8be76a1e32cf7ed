"""Tensor subclasses, __torch_function__, torch function and dispatch modes under kiln.compile.

Every program of subclass_programs.py runs eagerly and compiled on fresh arguments: the same value,
the same Python type (a subclass stays that subclass, a plain result stays plain), the same
attributes on it, the same exception, the same log of what overrides and modes saw (a mode Kiln
does not trace runs its frame eagerly, never skipped) and, for `grad` programs, the same gradients.
Then the guards across calls (a mode on for one call and off for the next, a subclass after a plain
tensor), the reasons explain gives, and graph counts against the real torch.compile.
"""
from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

import kiln
import subclass_programs as P
from eager_compare import under_grad_mode
from subclass_programs import PROGRAMS, AddIsSub, AtenLog, LogMode, Logged, MulForAdd, NegateAdds, Program


def _difference(got: Any, want: Any, where: str = "result") -> str | None:
    """Why `got` is not `want` (value, exact type, attributes, requires_grad), or None."""
    if isinstance(want, torch.Tensor):
        if type(got) is not type(want):
            return f"{where}: type {type(got).__name__}, eager {type(want).__name__}"
        inner_got, inner_want = vars(got).get("inner", got), vars(want).get("inner", want)
        with torch._C.DisableTorchFunctionSubclass():
            if inner_got.shape != inner_want.shape or not torch.allclose(inner_got.detach(), inner_want.detach()):
                return f"{where}: {got!r}, eager {want!r}"
            if got.requires_grad != want.requires_grad:
                return f"{where}: requires_grad {got.requires_grad}, eager {want.requires_grad}"
        if sorted(vars(got)) != sorted(vars(want)):
            return f"{where}: attributes {sorted(vars(got))}, eager {sorted(vars(want))}"
        return None
    if isinstance(want, (tuple, list)):
        if type(got) is not type(want) or len(got) != len(want):
            return f"{where}: {got!r}, eager {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = _difference(g, w, f"{where}[{i}]")
            if why:
                return why
        return None
    return None if type(got) is type(want) and got == want else f"{where}: {got!r}, eager {want!r}"


def _run(fn: Any, program: Program) -> tuple:
    """(outcome, LOG, grads) of one call of `fn` on fresh arguments, under the program's mode."""
    args = program.make()
    P.LOG.clear()
    try:
        with program.around() if program.around else contextlib.nullcontext():
            out = fn(*args)
            if program.grad:
                (out[0] if isinstance(out, tuple) else out).sum().backward()
        result: tuple = ("ok", out)
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        result = ("raised", type(exc), str(exc))
    with torch._C.DisableTorchFunctionSubclass():  # NotImpl answers every query with NotImplemented
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        grads += [p.grad for a in args if isinstance(a, torch.nn.Module) for p in a.parameters()]
    return result, list(P.LOG), grads


def _same_as_eager(program: Program, backend: str, dynamic: bool | None = None, grad_mode: str | None = None) -> None:
    def run(fn: Any) -> tuple:
        return _run(fn, program) if grad_mode is None else under_grad_mode(grad_mode, lambda: _run(fn, program))

    kiln.reset()
    want = run(program.fn)
    compiled = kiln.compile(program.fn, backend=backend, dynamic=dynamic)
    for call in range(2):  # the capture, then the cached entry
        got = run(compiled)
        assert got[0][0] == want[0][0], f"call {call}: {got[0]!r}, eager {want[0]!r}"
        why = _difference(got[0][1], want[0][1]) if want[0][0] == "ok" else \
            (None if got[0][1:] == want[0][1:] else f"{got[0]!r}, eager {want[0]!r}")
        assert why is None, f"call {call}: {why}"
        assert got[1] == want[1], f"call {call}: compiled logged {got[1]}, eager {want[1]}"
        assert len(got[2]) == len(want[2])
        for g, w in zip(got[2], want[2]):
            assert (g is None) == (w is None) and (g is None or _difference(g, w, "grad") is None), (g, w)


_BY_NAME = {p.name: p for p in PROGRAMS}

# The programs that capture graphs (the others run eagerly whatever the settings): under
# aot_eager, dynamic=True and the outer grad modes in CI, the rest of those sweeps `slow`.
_CAPTURING = {"buffer_module", "parameter_subclass_module", "module_subclass_then_ops", "plain_tensor_attribute",
              "parameter_made_in_frame", "buffer_made_in_frame", "plain_tensor_flagged_as_parameter",
              "parameter_subclass_input", "disable_subclass_plain", "handle_torch_function_duck",
              "override_queries", "override_queries_under_device", "handle_torch_function_under_device",
              "mode_raises_inside", "duck_tensor_operator", "parameter_subclass_methods", "parameter_subclass_grad",
              "override_queries_of_classes", "dispatch_mode_entered_by_hand", "module_returns_subclass",
              "mode_stack_queries_plain", "buffer_assigned_in_forward"}
_SWEEP = [name if name in _CAPTURING else pytest.param(name, marks=pytest.mark.slow) for name in _BY_NAME]


@pytest.mark.parametrize("name", list(_BY_NAME))
def test_program_as_eager(name: str) -> None:
    _same_as_eager(_BY_NAME[name], "eager")


@pytest.mark.parametrize("name", _SWEEP)
def test_program_under_aot_eager(name: str) -> None:
    _same_as_eager(_BY_NAME[name], "aot_eager")




@pytest.mark.parametrize("name", _SWEEP)
def test_program_dynamic(name: str) -> None:
    _same_as_eager(_BY_NAME[name], "eager", dynamic=True)


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode", "enable_grad_in_no_grad"])
@pytest.mark.parametrize("name", _SWEEP)
def test_program_under_grad_mode(name: str, grad_mode: str) -> None:
    _same_as_eager(_BY_NAME[name], "aot_eager", grad_mode=grad_mode)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_BY_NAME))
def test_program_under_inductor(name: str) -> None:
    _same_as_eager(_BY_NAME[name], "inductor")


# Programs that capture graphs (plain inputs) or where a mode or subclass once gave a wrong
# answer: under the default backend too, in CI.
@pytest.mark.parametrize("name", ["buffer_module", "parameter_subclass_module", "dispatch_mode_rewrites_inside_frame",
                                  "dispatch_mode_around_call", "plain_tensor_flagged_as_parameter",
                                  "grad_as_subclass_in_frame", "disable_torch_function_plain"])
def test_inductor_slice(name: str) -> None:
    _same_as_eager(_BY_NAME[name], "inductor")


# ---- guards across calls: a mode on for one call and off for the next ----------------------------

def _add_sin(x: torch.Tensor) -> torch.Tensor:
    return (x + 1).sin()


def _calls(fn: Any, backend: str, modes: list[Any], repeat: int = 1) -> list[tuple]:
    """(value, LOG) of fn over one call per mode (None: no mode), each repeated `repeat` times."""
    seen = []
    for make_mode in modes:
        for _ in range(repeat):
            P.LOG.clear()
            with make_mode() if make_mode else contextlib.nullcontext():
                out = fn(torch.arange(3.0))
            seen.append((out, list(P.LOG)))
    return seen


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("modes", [
    [None, AtenLog, None, NegateAdds, None],
    [NegateAdds, None, AtenLog],
    [None, lambda: LogMode("m"), None, MulForAdd],
    [None, lambda: LogMode("f"), AtenLog, None],
], ids=["dispatch_after_graph", "dispatch_first", "function_modes", "both_kinds"])
def test_mode_on_and_off_across_calls(backend: str, modes: list[Any]) -> None:
    """A call under a mode runs eagerly whether or not the frame has a cached graph (the entry's
    mode check, Python and native), and the next call without one uses or makes the graph."""
    kiln.reset()
    want = _calls(_add_sin, backend, modes)
    got = _calls(kiln.compile(_add_sin, backend=backend), backend, modes)
    for (g, g_log), (w, w_log) in zip(got, want):
        assert g_log == w_log
        torch.testing.assert_close(g, w)
    assert kiln.stats()["graphs"] == 1


def test_dispatch_mode_after_native_entry() -> None:
    """After enough calls that the entry checks its guards in the boundary extension, a call under
    a dispatch mode that changes results still runs eagerly."""
    kiln.reset()
    compiled = kiln.compile(_add_sin)
    _calls(compiled, "inductor", [None], repeat=200)
    (got, _), = _calls(compiled, "inductor", [NegateAdds])
    (want, _), = _calls(_add_sin, "eager", [NegateAdds])
    torch.testing.assert_close(got, want)
    assert got[0] != (torch.tensor(1.0)).sin()


def test_callee_under_dispatch_mode() -> None:
    """An outer compiled frame under a mode runs eagerly with its compiled callee: the mode sees
    both frames' ops."""
    inner = kiln.compile(_add_sin, backend="eager")

    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x) * 2

    kiln.reset()
    compiled = kiln.compile(outer, backend="eager")
    compiled(torch.ones(2))
    P.LOG.clear()
    with AtenLog():
        compiled(torch.ones(2))
    seen = list(P.LOG)
    P.LOG.clear()
    with AtenLog():
        outer(torch.ones(2))
    assert seen == P.LOG and "aten:aten.mul.Tensor" in seen


@pytest.mark.parametrize("order", [("plain", "logged", "plain", "addsub"), ("logged", "plain", "logged"),
                                   ("parameter", "myparam", "plain")])
def test_subclass_and_plain_across_calls(order: tuple[str, ...]) -> None:
    """The graph made for a plain tensor is not used for a subclass (nor the reverse): each call
    gives eager's value and type."""
    makers = {"plain": lambda: torch.arange(3.0), "logged": lambda: torch.arange(3.0).as_subclass(Logged),
              "addsub": lambda: torch.arange(3.0).as_subclass(AddIsSub),
              "parameter": lambda: torch.nn.Parameter(torch.arange(3.0)),
              "myparam": lambda: P.MyParam(torch.arange(3.0))}

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + x

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for kind in order:
        P.LOG.clear()
        want, want_log = fn(makers[kind]()), list(P.LOG)
        P.LOG.clear()
        got = compiled(makers[kind]())
        assert _difference(got, want) is None and P.LOG == want_log, kind


def test_buffer_flag_guarded() -> None:
    """isinstance(t, nn.Buffer) reads the tensor's flag: a tensor marked later is another answer."""
    def fn(x: torch.Tensor) -> Any:
        return x * 2, isinstance(x, torch.nn.Buffer)

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    x = torch.ones(2)
    assert compiled(x)[1] is False
    x._is_buffer = True  # type: ignore[attr-defined]
    assert compiled(x)[1] is True
    x._is_buffer = False  # type: ignore[attr-defined]
    assert compiled(x)[1] is False


# ---- what explain says ------------------------------------------------------------------------------

def _explain(name: str) -> Any:
    program = _BY_NAME[name]
    kiln.reset()
    with program.around() if program.around else contextlib.nullcontext():
        return kiln.explain(program.fn)(*program.make())


@pytest.mark.parametrize("name,fallback", [
    ("logged_input_ops", "a tensor of the subclass Logged at x"),
    ("wrapper_input", "a tensor of the subclass Wrapper at x"),
    ("mode_around_call", "a torch function mode other than the default device's is active"),
    ("dispatch_mode_around_call", "a torch dispatch mode is active"),
])
def test_explain_fallback_reasons(name: str, fallback: str) -> None:
    out = _explain(name)
    assert out.graph_count == 0 and any(fallback in f.reason for f in out.fallbacks), out.fallbacks


@pytest.mark.parametrize("name,reason", [
    ("mode_inside_frame", "`with LogMode(...)`: a torch function mode"),
    ("dispatch_mode_inside_frame", "`with AtenLog(...)`: a torch dispatch mode"),
    ("as_subclass_in_frame", "Tensor.as_subclass("),
])
def test_explain_break_reasons(name: str, reason: str) -> None:
    out = _explain(name)
    assert any(reason in r.reason and r.suggestion for r in out.break_reasons), out.break_reasons


# ---- graph counts against the real torch.compile ------------------------------------------------

@pytest.mark.parametrize("name", ["buffer_module", "parameter_subclass_module", "plain_tensor_flagged_as_parameter",
                                  "parameter_input_checks", "plain_tensor_attribute"])
def test_graph_count_as_dynamo(name: str) -> None:
    """Programs over plain tensors, Parameters and Buffers: one graph, as torch.compile makes."""
    from torch_oracle import torch_graph_count

    program = _BY_NAME[name]
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    kiln.compile(program.fn, backend=backend)(*program.make())
    assert backend.frame_count == torch_graph_count(program.fn, [program.make()]) == 1


def test_dispatch_mode_graph_count_as_dynamo() -> None:
    """torch.compile skips a frame called under a dispatch mode, as Kiln runs it eagerly: the
    calls without one make the only graph. (A first call under a mode makes torch.compile skip
    the code for good; Kiln compiles it at the next call without one.)"""
    from torch_oracle import torch_graph_count

    modes = [None, AtenLog, None, AtenLog]
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    _calls(kiln.compile(_add_sin, backend=backend), "eager", modes)
    stack = contextlib.ExitStack()

    def between(i: int) -> None:
        stack.close()
        if modes[i] is not None:
            stack.enter_context(modes[i]())

    try:
        dynamo = torch_graph_count(_add_sin, [(torch.ones(3),)] * len(modes), between=between)
    finally:
        stack.close()
    assert backend.frame_count == dynamo == 1


def test_override_query_follows_the_argument_type() -> None:
    """has_torch_function/is_tensor_like answered at trace time from an argument's type: another
    type in the next call is another answer (the type is guarded)."""
    def fn(x: torch.Tensor, d: Any) -> Any:
        return torch.overrides.has_torch_function_unary(d), torch.overrides.is_tensor_like(d), x + 1

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for d in (P.Duck(torch.ones(2)), torch.ones(2), 3, P.Duck(torch.zeros(2)), torch.nn.Parameter(torch.ones(2))):
        got, want = compiled(torch.ones(2), d), fn(torch.ones(2), d)
        assert got[:2] == want[:2], (d, got, want)
        torch.testing.assert_close(got[2], want[2])


def test_override_query_under_disabled_torch_function() -> None:
    """An object's __torch_function__ counts only while torch function handling is on: the answer
    made with it on is not reused inside DisableTorchFunctionSubclass (nor the reverse)."""
    def fn(x: torch.Tensor, d: Any) -> Any:
        return torch.overrides.has_torch_function((x, d)), x + 1

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for disabled in (False, True, False, True):
        with torch._C.DisableTorchFunctionSubclass() if disabled else contextlib.nullcontext():
            got, want = compiled(torch.ones(2), P.Duck(torch.ones(2))), fn(torch.ones(2), P.Duck(torch.ones(2)))
        assert got[0] == want[0] and want[0] is not disabled


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_module_under_modes(backend: str) -> None:
    """kiln.compile(module) called without a mode (past the entry's tier-up), then under a dispatch
    mode that changes results and a function mode that logs: eager's values and logs each time."""
    model = P.Small()
    compiled = kiln.compile(P.Small(), backend=backend)
    x = torch.randn(2, 3)
    kiln.reset()
    for _ in range(120):
        compiled(x)
    for make_mode in (NegateAdds, lambda: LogMode("m"), None, AtenLog):
        P.LOG.clear()
        with make_mode() if make_mode else contextlib.nullcontext():
            want = model(x)
        want_log = list(P.LOG)
        P.LOG.clear()
        with make_mode() if make_mode else contextlib.nullcontext():
            got = compiled(x)
        torch.testing.assert_close(got, want)
        assert P.LOG == want_log
