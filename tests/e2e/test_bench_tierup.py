"""The tier-up measurement (benchmarks.tierup) and the workloads added with it: the probe that tells
when every hot graph settled on its native wrapper (from the wrappers' state, not from times), the
ratios and the table printed from it, one real cold-to-native timeline of a tiny graph, and the
compiled-optimizer, checkpointed and train-mode CNN workloads run at their --quick sizes.
"""
from __future__ import annotations

import importlib
import math

import pytest
import torch

from benchmarks import report
from benchmarks.compilers import KILN
from benchmarks.measure import final_counts
from benchmarks.run import QUICK_TIERUP, parse_args, selected_workloads, tierup_workloads
from benchmarks.tierup import PYTHON_TIER_CALLS, TierProbe, kiln_timeline, with_ratios
from benchmarks.workload import Case, make_step

NEW_WORKLOADS = ("adamw_step", "adam_step", "sgd_step", "checkpoint_training", "efficientnet_training")


class _Wrapper:
    """Stands in for kiln.runtime.native.TieredWrapper: the attributes the probe reads."""

    def __init__(self) -> None:
        self.python = object()
        self.current = self.python
        self.after: int | None = 3
        self.calls = 0
        self.future: object | None = None


def test_probe_follows_wrapper_state_and_ignores_graphs_no_longer_called() -> None:
    probe = TierProbe(_Wrapper)
    a, b = _Wrapper(), _Wrapper()
    assert probe.check({"graphs": 1, "cache_hits": 0}) == (True, True)  # first look: both new
    a.calls = b.calls = 1
    assert probe.check({"graphs": 1, "cache_hits": 7}) == (False, True)  # a cache hit is no change
    a.after, a.current = None, object()  # a settles on its native wrapper; b is not called any more
    assert probe.check({"graphs": 1, "cache_hits": 9}) == (True, False)
    assert probe.check({"graphs": 1, "cache_hits": 9}) == (False, False)
    assert probe.counts() == {"tiered": 2, "native": 1, "python": 0, "unsettled": 1}
    c = _Wrapper()  # a recompile makes a new graph: the counters change and the probe looks again
    assert probe.check({"graphs": 2, "cache_hits": 9})[0] and probe.counts()["tiered"] == 3
    b.after = None  # settled on its Python wrapper (a build that failed or was refused)
    assert probe.check({"graphs": 2, "cache_hits": 9}) == (True, False)
    assert probe.counts() == {"tiered": 3, "native": 1, "python": 1, "unsettled": 1}
    assert probe.scans == 2 and probe.hot == 2
    c.future = object()  # c asked for its build: hot, not settled
    assert probe.check({"graphs": 2, "cache_hits": 9}) == (False, False) and probe.hot == 3


def test_ratios_use_the_child_torch_numbers_else_the_runners() -> None:
    child = {"python_speedup": 0.8, "eager_ms": 2.0, "kiln_ms": 1.0, "full_speed_s": 3.0}
    out = with_ratios(child, torch_speedup=1.6, torch_first_call_s=30.0)
    assert out["kiln_speedup"] == pytest.approx(2.0)
    assert out["python_over_torch"] == pytest.approx(0.5)
    assert out["full_speed_over_torch_first"] == pytest.approx(0.1)
    mine = with_ratios(dict(child, torch_ms=0.5, torch_first_call_s=6.0), torch_speedup=1.6, torch_first_call_s=30.0)
    assert mine["torch_speedup"] == pytest.approx(4.0) and mine["full_speed_over_torch_first"] == pytest.approx(0.5)
    none = with_ratios({"status": "exit 1: boom"})
    assert none["python_over_torch"] is None and none["full_speed_over_torch_first"] is None


def test_tierup_table_geomeans_and_statuses(capsys: pytest.CaptureFixture) -> None:
    def row(name: str, **tierup) -> dict:
        return {"name": name, "eager_ms": 1.0, "tierup": tierup}

    rows = [
        row("a", python_speedup=0.5, python_over_torch=0.25, full_speed_over_torch_first=0.1, full_speed_s=1.0,
            wrappers={"tiered": 2, "native": 2, "python": 0, "unsettled": 0}, header_seeded=True),
        row("b", python_speedup=2.0, python_over_torch=1.0, full_speed_over_torch_first=0.4,
            wrappers={"tiered": 3, "native": 0, "python": 3, "unsettled": 0}),
        row("c", status="not at full speed after 300 s (1 graph(s) not settled)", python_speedup=1.0),
        {"name": "d", "eager_ms": 1.0},  # --no-tierup, or Kiln did not compile it
    ]
    totals = report.tierup_summary(rows)
    assert totals["kiln_python_speedup_geomean"] == pytest.approx(1.0)
    assert totals["kiln_python_over_torch_geomean"] == pytest.approx(0.5)
    assert totals["full_speed_over_torch_first_geomean"] == pytest.approx(math.sqrt(0.04))
    assert totals["workloads_with_tierup"] == 3
    report.print_tierup_table(rows, totals)
    out = capsys.readouterr().out
    assert " 2/2" in out and " 0/3" in out and "c: not at full speed" in out and "--quick" in out
    assert "\nd " not in out


def test_compile_table_prints_recompiles_breaks_and_fallbacks(capsys: pytest.CaptureFixture) -> None:
    counts = {"graphs": 9, "recompiles": 22, "graph_breaks": 46, "fallbacks": 12}
    rows = [{"name": "opt", "eager_ms": 1.0, "kiln": {"status": "ok", "speedup": 0.5, "compiles": 9, "counts": counts},
             "torch": {"status": "ok", "speedup": 2.0, "compiles": 1, "counts": {"graphs": 1, "graph_breaks": 0}}}]
    report.print_compile_table(rows, report.summary(rows))
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert "kiln recomp" in header and "kiln breaks" in header and "torch breaks" in header
    assert line.split()[-7:] == ["9", "1", "-", "22", "46", "12", "0"]


def test_quick_leaves_adam_and_sgd_out_and_times_tier_up_for_a_few_unless_named() -> None:
    quick = selected_workloads(parse_args(["--quick"]))
    assert "adamw_step" in quick and "adam_step" not in quick and "sgd_step" not in quick
    assert set(NEW_WORKLOADS) <= set(selected_workloads(parse_args([])))
    assert selected_workloads(parse_args(["--quick", "--only", "sgd_step"])) == ["sgd_step"]
    assert tierup_workloads(parse_args(["--quick"])) == list(QUICK_TIERUP)
    assert set(QUICK_TIERUP) <= set(selected_workloads(parse_args(["--quick"])))
    assert tierup_workloads(parse_args(["--quick", "--only", "softmax"])) == ["softmax"]
    assert tierup_workloads(parse_args([])) == selected_workloads(parse_args([]))
    assert tierup_workloads(parse_args(["--no-tierup", "--only", "softmax"])) == []


@pytest.fixture
def one_thread():
    """One thread, as the bench's first pass runs (two OpenMP threads on two busy cores take seconds
    per convolution step), and the same reductions in the same order from step to step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", NEW_WORKLOADS)
def test_new_workloads_repeat_exactly_from_fresh_copies(name: str, one_thread: None) -> None:
    """The runner compares each compiler's first step with eager's, each on its own `make_fn()`:
    two fresh copies must compute the same, and a step must change what it trains."""
    case = importlib.import_module(f"benchmarks.{name}").build(True)
    first, second = case.make_fn(), case.make_fn()
    a, b = make_step(case, first, first)(), make_step(case, second, second)()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    if case.custom_step is not None:  # an optimizer step: parameters and state move on each step
        before = [t.clone() for t in a]
        again = make_step(case, first, first)()
        assert any(not torch.equal(x, y) for x, y in zip(before, again))


def test_optimizer_workload_under_kiln_matches_eager_and_is_counted(one_thread: None) -> None:
    """Kiln's capture of AdamW.step (backend="eager": no C++) over several steps: the same
    parameters and state as eager's, however many graphs, breaks and fallbacks it takes."""
    import kiln

    kiln.reset()
    case = importlib.import_module("benchmarks.adamw_step").build(True)
    eager_fn, fn = case.make_fn(), case.make_fn()
    eager, compiled = make_step(case, eager_fn, eager_fn), make_step(case, kiln.compile(fn, backend="eager"), fn)
    for _ in range(3):
        want, got = eager(), compiled()
    torch.testing.assert_close(got, want, rtol=case.rtol, atol=case.atol)
    counts = final_counts(KILN)
    assert set(counts) == {"graphs", "recompiles", "graph_breaks", "fallbacks"} and counts["graphs"] >= 1
    kiln.reset()


def _two_kernels(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w) + 1.0
    return torch.softmax(h @ w.t(), -1) * 2


@pytest.mark.cpp
def test_timeline_of_a_tiny_graph_reaches_its_native_wrapper() -> None:
    import kiln
    from kiln.runtime import native

    kiln.reset()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 5, generator=g), torch.randn(5, 5, generator=g)
    case = Case(make_fn=lambda: _two_kernels, inputs=[(x, w)])
    eager = make_step(case, _two_kernels, _two_kernels)
    with kiln.config.patch(cpu_wrapper="auto", native_wrapper_after=1000):
        # an earlier workload's wrapper, alive and never to settle here: not this timeline's
        leftover = kiln.compile(lambda a: torch.softmax(torch.relu(a @ a.t()) + 1.0, -1) * 2)
        leftover(x)
        assert TierProbe.existing(native.TieredWrapper), "the leftover graph has no tiered wrapper"
    with kiln.config.patch(cpu_wrapper="auto", native_wrapper_after=4, native_plan=False):  # a compiled wrapper
        result, step = kiln_timeline(case, eager, steady=3, timeout_s=600)
    del leftover
    kiln.reset()
    assert result["status"] == "ok", result
    # calls 2, 3, 4: the fourth asked for the build and ran on Python
    assert result["python_calls"] == 3 and result["python_ms"] > 0 and result["python_speedup"] > 0
    assert result["wrappers"]["native"] >= 1 and result["wrappers"]["unsettled"] == 0
    assert result["first_native_call"] > 4  # the fourth call asked for the build; a later one picked it up
    assert result["full_speed_call"] > result["first_native_call"]
    assert result["full_speed_s"] >= result["first_call_s"] > 0
    torch.testing.assert_close(step(), eager())


@pytest.mark.cpp
def test_timeline_of_a_graph_on_its_plan_from_the_first_call() -> None:
    """With the boundary extension built, a graph runs its plan from the first call: nothing builds,
    so the window before tier-up times the plan over all its calls, and full speed comes at once."""
    import kiln
    from kiln.runtime import boundary

    boundary.load()
    kiln.reset()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 5, generator=g), torch.randn(5, 5, generator=g)
    case = Case(make_fn=lambda: _two_kernels, inputs=[(x, w)])
    eager = make_step(case, _two_kernels, _two_kernels)
    with kiln.config.patch(cpu_wrapper="auto", native_plan=True):
        result, step = kiln_timeline(case, eager, steady=3, timeout_s=600)
    kiln.reset()
    assert result["status"] == "ok", result
    assert result["python_calls"] == PYTHON_TIER_CALLS and result["python_ms"] > 0
    assert result["wrappers"]["native"] >= 1 and result["wrappers"]["unsettled"] == 0
    assert result["first_native_call"] == 2  # the first check after the first call finds it native
    assert result["full_speed_call"] == 2
    torch.testing.assert_close(step(), eager())


def test_the_bench_finds_kiln() -> None:
    """The bench asks kiln's public surface whether each backend exists: a module moved inside
    kiln (capture_frame left tracer.py) once made it report Kiln "not available" and time nothing."""
    from benchmarks.compilers import kiln_capture_status, kiln_status

    assert kiln_capture_status() is None
    assert kiln_status() is None
