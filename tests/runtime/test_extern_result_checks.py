"""An extern's result is checked against its fake tensor where the wrapper receives it (kiln.errors.
ExternMismatchError): a dtype or sizes other than the fake's would have the kernels after it read its
memory as something else (wrong values, or reads past its end). On each wrapper tier (Python, the
compiled native wrapper, the plan) a mismatch makes the frame run eagerly, with one warning, where
nothing outside the graph was written yet; else, and under fullgraph=True, it is raised naming the
frame. Custom ops with a wrong register_fake are the way a user meets it (torch.compile gives wrong
values there: Inductor trusts the fake)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import config
from kiln.errors import ExternMismatchError
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp

WRAPPERS = {
    "python": {"cpu_wrapper": "python"},
    "compiled": {"cpu_wrapper": "native", "native_plan": False},
    "plan": {"cpu_wrapper": "native", "native_plan": True},
}


# --- custom ops whose fake implementation disagrees with the real kernel -----------------------------

@torch.library.custom_op("kiln_checks::to_double", mutates_args=())
def to_double(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).double()


@to_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # says x's dtype


@torch.library.custom_op("kiln_checks::to_long", mutates_args=())
def to_long(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) * 3


@to_long.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.int32)


@torch.library.custom_op("kiln_checks::first_rows", mutates_args=())
def first_rows(x: torch.Tensor) -> torch.Tensor:
    return (x * 2)[:2].clone()


@first_rows.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # says every row


@torch.library.custom_op("kiln_checks::scalar_as_vector", mutates_args=())
def scalar_as_vector(x: torch.Tensor) -> torch.Tensor:
    return x.sum().reshape(1)


@scalar_as_vector.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(())


@torch.library.custom_op("kiln_checks::pair", mutates_args=())
def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, (x - 1).double()


@pair.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)  # the second one's dtype is wrong


@torch.library.custom_op("kiln_checks::honest", mutates_args=())
def honest(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).double()


@honest.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.float64)


def read_by_kernel(x):
    return torch.ops.kiln_checks.to_double(x) + 1


def long_read_by_kernel(x):
    return torch.ops.kiln_checks.to_long(x) * 2 + 1


def fewer_rows(x):
    return torch.ops.kiln_checks.first_rows(x).relu() + x[:2]


def scalar_shape(x):
    return torch.ops.kiln_checks.scalar_as_vector(x) * x


def second_result(x):
    a, b = torch.ops.kiln_checks.pair(x)
    return a * b


def called_through_custom_op_def(x):
    return to_double(x.sin()) - 1  # the CustomOpDef itself, as users call it


PROGRAMS = [read_by_kernel, long_read_by_kernel, fewer_rows, scalar_shape, second_result,
            called_through_custom_op_def]


def _compiled_calls(fn: Callable[..., Any], calls: list[tuple], wrapper: str, **options: Any
                    ) -> tuple[list[Any], list[str], dict[str, Any]]:
    """Outputs of each call (an exception as itself), the Kiln warnings, kiln.stats()."""
    kiln.reset()
    with config.patch(**WRAPPERS[wrapper]), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled = kiln.compile(fn, **options)
        outs = []
        for args in calls:
            try:
                outs.append(compiled(*args))
            except ExternMismatchError as exc:
                outs.append(exc)
        stats = kiln.stats()
    kiln.reset()
    return outs, [str(w.message) for w in seen if issubclass(w.category, KilnWarning)], stats


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_a_wrong_fake_runs_the_frame_eagerly_with_one_warning(fn, wrapper):
    calls = [(torch.randn(4, 3),), (torch.randn(4, 3),)]
    outs, warned, stats = _compiled_calls(fn, calls, wrapper)
    for out, args in zip(outs, calls):
        expected = fn(*args)
        assert not isinstance(out, Exception), out
        assert out.dtype == expected.dtype and out.shape == expected.shape
        torch.testing.assert_close(out, expected)
    assert len(warned) == 1 and "internal error while running" in warned[0] and "fake tensor" in warned[0]
    assert stats["fallbacks"] == 2 and stats["compiles"] == 1  # the second call runs eagerly at once


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_a_dynamic_size_is_compared_through_its_symbol(wrapper):
    calls = [(torch.randn(4, 3),), (torch.randn(6, 5),)]
    outs, warned, _ = _compiled_calls(fewer_rows, calls, wrapper, dynamic=True)
    for out, args in zip(outs, calls):
        torch.testing.assert_close(out, fewer_rows(*args))
    assert len(warned) == 1


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_an_honest_fake_keeps_the_graph(wrapper):
    def fn(x):
        return torch.ops.kiln_checks.honest(x) + torch.mm(x, x.t()).sum()

    calls = [(torch.randn(4, 3),), (torch.randn(4, 3),)]
    outs, warned, stats = _compiled_calls(fn, calls, wrapper)
    assert warned == [] and stats["fallbacks"] == 0
    for out, args in zip(outs, calls):  # a float32 sum added to float64: summed in another order
        torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)


LOG: list[Any] = []


def break_then_mismatch(x):
    LOG.append("before")  # an effect the glue replays after the first graph
    y = x.cos()
    print("a graph break")
    LOG.append("after")
    return torch.ops.kiln_checks.to_double(y) + 1


@pytest.mark.parametrize("wrapper", ["python", "plan"])
def test_only_the_resumed_frame_runs_eagerly_and_effects_happen_once(wrapper, capsys):
    x = torch.randn(4, 3)
    expected = break_then_mismatch(x)
    LOG.clear()
    capsys.readouterr()
    outs, warned, stats = _compiled_calls(break_then_mismatch, [(x,)], wrapper)
    torch.testing.assert_close(outs[0], expected)
    assert LOG == ["before", "after"] and capsys.readouterr().out == "a graph break\n"
    assert len(warned) == 1 and "__resume" in warned[0]
    LOG.clear()


def mutate_then_mismatch(p, g):
    p.add_(g)  # computed in p's storage, before the extern
    return torch.ops.kiln_checks.to_double(g * 3) + 1


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_after_an_input_was_written_the_error_is_raised_not_replayed(wrapper):
    p, g = torch.randn(4, 3), torch.randn(4, 3)
    before = p.clone()
    outs, warned, _ = _compiled_calls(mutate_then_mismatch, [(p, g)], wrapper)
    assert isinstance(outs[0], ExternMismatchError) and not outs[0].clean
    assert "to_double" in str(outs[0]) and any("mutate_then_mismatch" in n for n in outs[0].__notes__)
    torch.testing.assert_close(p, before + g)  # written once, as eager does before the op runs


@pytest.mark.parametrize("wrapper", ["python", "plan"])
def test_fullgraph_raises_naming_the_frame(wrapper):
    outs, warned, _ = _compiled_calls(read_by_kernel, [(torch.randn(4, 3),)], wrapper, fullgraph=True)
    exc = outs[0]
    assert isinstance(exc, ExternMismatchError) and warned == []
    assert any(f"{__file__}:" in note and "read_by_kernel" in note for note in exc.__notes__)


def test_a_custom_op_def_called_directly_is_one_graph_as_in_torch_compile():
    def fn(x):
        return honest(x.sin()) * 2

    x = torch.randn(3)
    torch._dynamo.reset()
    real = torch._dynamo.explain(fn)(x)
    ours = kiln.explain(fn)(x)
    assert (ours.graph_count, ours.graph_break_count) == (real.graph_count, real.graph_break_count) == (1, 0)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
