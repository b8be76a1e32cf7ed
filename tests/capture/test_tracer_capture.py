"""capture_frame on its own (no entry): the CaptureResult it returns, its guards and glue, symbolic
inputs, restarts at breaks, and what makes a whole frame run eagerly."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.capture.options import CompileOptions
from kiln.capture.frame_capture import CaptureResult, capture_frame
from kiln.errors import GraphBreakError, Unsupported
from kiln.symbolic import DynamicPolicy

SCALE = 2.0


def capture(fn, L, **options):
    opts = CompileOptions(backend="eager", compiler=lambda gm, inputs: gm, **options)
    return capture_frame(fn, L, opts, lambda f: f, policy=DynamicPolicy())


def test_result_fields_and_guards():
    def f(x, n):
        return x * SCALE + n

    x = torch.randn(3)
    result = capture(f, {"x": x, "n": 4})
    assert isinstance(result, CaptureResult)
    assert len(result.graphs) == 1 and result.breaks == []
    kinds = {(g.source, g.kind) for g in result.guards}
    assert ("L['x']", "check_tensor") in kinds
    assert ("L['n']", "check_value") in kinds
    assert ("G['SCALE']", "check_value") in kinds
    assert ("", "check_grad_mode") in kinds
    torch.testing.assert_close(result.glue({"x": x, "n": 4}, f.__globals__, f), x * SCALE + 4)
    placeholders = [n for n in result.graphs[0].graph.nodes if n.op == "placeholder"]
    assert all("example_value" in n.meta for n in result.graphs[0].graph.nodes if n.op != "output")
    assert [p.meta["source"] for p in placeholders] == ["L['x']"]


def test_dynamic_inputs_are_symbols():
    def f(x):
        return x.view(-1)[: x.shape[0]] * x.size(1)

    x = torch.randn(6, 4)
    result = capture(f, {"x": x}, dynamic=True)
    gm = result.graphs[0]
    examples = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    assert any(isinstance(e, torch.SymInt) for e in examples)
    assert any(g.kind == "check_shape" for g in result.guards)
    y = torch.randn(9, 5)
    torch.testing.assert_close(result.glue({"x": y}, f.__globals__, f), f(y))


def test_break_restarts_and_builds_resume():
    def f(x):
        y = x.cos()
        print("side")
        return y + 1

    x = torch.randn(3)
    result = capture(f, {"x": x})
    assert len(result.breaks) == 1 and result.breaks[0].kind == "print"
    assert "__resume" in result.glue_source and "print" in result.glue_source
    torch.testing.assert_close(result.glue({"x": x}, f.__globals__, f), f(x))


def test_fullgraph_raises_at_first_break():
    def f(x):
        return x.sum().item()

    with pytest.raises(GraphBreakError, match="item"):
        capture(f, {"x": torch.randn(3)}, fullgraph=True)


def test_raise_runs_natively():
    def f(x):
        y = x + 1
        raise ValueError(f"bad {y.shape[0]}")

    x = torch.randn(2)
    result = capture(f, {"x": x})
    with pytest.raises(ValueError, match="bad 2"):
        result.glue({"x": x}, f.__globals__, f)


def test_break_inside_loop_passes_the_iterator():
    def f(x):
        for i in range(3):
            x = x + i
            print(i)
        return x * 2

    x = torch.randn(2)
    result = capture(f, {"x": x})
    assert "iter((1, 2, ))" in result.glue_source  # the rest of the loop, on the resume's stack
    torch.testing.assert_close(result.glue({"x": x}, f.__globals__, f), f(x))


def test_call_in_try_raises_into_the_frames_handler():
    def boom(t):
        raise KeyError("k")

    def f(x, log):
        y = x.sin()
        try:
            boom(y)
        except KeyError:
            log.append("caught")
            y = y + 1
        finally:
            log.append("finally")
        return y

    x, log = torch.randn(2), []
    result = capture(f, {"x": x, "log": log})
    torch.testing.assert_close(result.glue({"x": x, "log": log}, f.__globals__, f), x.sin() + 1)
    assert log == ["caught", "finally"]


def test_unsupported_instruction_runs_the_frame_eagerly():
    def f(x):
        global _NEVER_BOUND
        del _NEVER_BOUND  # DELETE_GLOBAL has no handler (a class statement is a break at its call now)
        return x * 2

    with pytest.raises(Unsupported):
        capture(f, {"x": torch.randn(2)})


def test_grad_mode_restored_after_capture():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    capture(f, {"x": torch.randn(2)})
    assert torch.is_grad_enabled()


def test_glue_source_executes_side_effects_in_order():
    log: list = []

    def f(x, out):
        out.append(1)
        out.append(x * 2)
        return x

    x = torch.randn(2)
    result = capture(f, {"x": x, "out": log})
    assert log == []  # nothing happened while tracing
    result.glue({"x": x, "out": log}, f.__globals__, f)
    assert log[0] == 1 and torch.equal(log[1], x * 2)
    kiln.reset()


def test_kiln_logs_bytecode_shows_code_and_glue():
    import logging

    from kiln import log

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    def f(x):
        y = x.cos()
        print("side")
        return y + 1

    handler = Keep()
    logging.getLogger("kiln.bytecode").addHandler(handler)
    log.configure("bytecode,graph_code")
    try:
        capture(f, {"x": torch.randn(2)})
    finally:
        log.configure("")
        logging.getLogger("kiln.bytecode").removeHandler(handler)
    text = "\n".join(records)
    assert "original bytecode" in text and "LOAD_GLOBAL" in text
    assert "def __glue_f(L, G, F):" in text


def test_star_call_in_try_that_breaks_still_compiles_the_callee():
    # f(*args, **kwargs) inside a try block (transformers' config-defaults decorator): the break
    # lands on CALL_FUNCTION_EX; the callee must still go through Kiln, and an exception it raises
    # must reach the frame's handler.
    def inner(x, scale=1.0, fail=False):
        y = x.cos() * scale
        print("inner")  # a break inside the callee
        if fail:
            raise ValueError("no")
        return y + 1

    def f(x, args, kwargs, log):
        try:
            out = inner(x, *args, **kwargs)
        except ValueError:
            log.append("caught")
            out = x
        return out * 2

    kiln.reset()
    try:
        compiled = kiln.compile(f, backend="eager")
        x, log = torch.randn(3), []
        torch.testing.assert_close(compiled(x, (), {"scale": 3.0}, log), (x.cos() * 3 + 1) * 2)
        assert kiln.stats()["graphs"] >= 3  # f before the call, inner's two parts (callee compiled)
        torch.testing.assert_close(compiled(x, (), {"fail": True}, log), x * 2)
        assert log == ["caught"]
    finally:
        kiln.reset()
