"""kiln.explain: graph and break counts like torch._dynamo.explain, break reasons at the right
file:line with a hint, op counts, guards, a readable text, and no lasting caches."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch._dynamo

import kiln
from kiln.errors import Unsupported


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


def line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def no_break(x, y):
    a = torch.sin(x)
    return a * y + x.cos()


def prints_in_middle(x):
    y = x.sin()
    print("halfway")
    return y.cos()


def item_branch(x):
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


def two_prints(x):
    x = x + 1
    print("one")
    x = x * 2
    print("two")
    return x - 3


def test_no_break():
    out = kiln.explain(no_break)(torch.randn(3), torch.randn(3))
    assert (out.graph_count, out.graph_break_count, out.break_reasons) == (1, 0, [])
    assert out.op_count == 4  # sin, mul, add, cos
    assert any(g.kind == "check_tensor" and g.source == "L['x']" for g in out.guards)
    text = str(out)
    assert "Graph Count: 1" in text and "Graph Break Count: 0" in text and "Op Count: 4" in text


@pytest.mark.parametrize("fn", [prints_in_middle, two_prints, item_branch])
def test_counts_match_torch_dynamo_explain(fn, capsys):
    x = torch.randn(4)
    ours = kiln.explain(fn)(x)
    theirs = torch._dynamo.explain(fn)(x)
    assert ours.graph_count <= theirs.graph_count
    assert ours.graph_break_count <= theirs.graph_break_count
    assert len(ours.break_reasons) >= 1


def test_break_reason_names_file_line_and_hint(capsys):
    out = kiln.explain(prints_in_middle)(torch.randn(3))
    assert capsys.readouterr().out == "halfway\n"  # the side effect happens once, as in eager
    record = out.break_reasons[0]
    assert record.filename == __file__
    assert record.lineno == line_of(prints_in_middle, "print(")
    assert "print" in record.reason
    assert record.suggestion
    assert f"{__file__}:{record.lineno}" in str(out)


def test_explain_leaves_no_cache_behind():
    out = kiln.explain(no_break)(torch.randn(3), torch.randn(3))
    assert out.graph_count == 1
    seen = []
    f = kiln.compile(no_break, backend=lambda gm, ex: seen.append(gm) or gm.forward)
    f(torch.randn(3), torch.randn(3))
    assert len(seen) == 1


def test_explain_a_module():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    out = kiln.explain(net)(torch.randn(2, 3))
    assert out.graph_count == 1 and out.graph_break_count == 0
    assert out.op_count >= 2


def test_frame_that_runs_eagerly_is_reported():
    def refuse(fn, L, options, wrap_frame, *, policy=None):
        raise Unsupported("this frame is not supported", kind="unsupported")

    out = kiln.explain(no_break, capture=refuse)(torch.randn(3), torch.randn(3))
    assert out.graph_count == 0 and len(out.fallbacks) == 1
    assert "this frame is not supported" in str(out)


def test_explain_a_compiled_module_or_function():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    out = kiln.explain(kiln.compile(net, backend="eager"))(torch.randn(2, 3))
    assert out.graph_count == 1 and out.graph_break_count == 0
    out = kiln.explain(kiln.compile(no_break, backend="eager"))(torch.randn(3), torch.randn(3))
    assert out.graph_count == 1 and out.op_count == 4


def prints_three_times(x):
    x = x * 2
    print("a")
    x = x + 1
    print("b")
    x = x * 3
    print("c")
    return x


def test_repeated_break_reasons_are_grouped_in_text(capsys):
    out = kiln.explain(prints_three_times)(torch.randn(3))
    assert len(out.break_reasons) == 3  # the list stays complete, one record per break
    text = str(out)
    assert text.count("call to print()") == 1, text
    assert "[3x] call to print()" in text
    for marker in ('print("a")', 'print("b")', 'print("c")'):
        assert f"{__file__}:{line_of(prints_three_times, marker)}" in text
