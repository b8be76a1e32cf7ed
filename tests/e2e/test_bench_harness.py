"""The benchmark harness itself: its arithmetic (speedups, geomeans, bandwidth), its refusal to time
a Kiln run that compiled nothing or computed something else, and (slow) one real quick run of
`python -m benchmarks.run` end to end with its JSON output and its tier-up process
(tests/e2e/test_bench_tierup.py has the rest of the tier-up measurement and the newer workloads).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import report
from benchmarks.run import ALL_NAMES, parse_args
from benchmarks.timing import geomean, measure
from benchmarks.workload import Case, make_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(name: str, eager: float, kiln_ms: float | None, torch_ms: float | None, **extra) -> dict:
    row = {"name": name, "eager_ms": eager, "bytes_moved": extra.pop("bytes_moved", None)}
    for key, ms in (("kiln", kiln_ms), ("torch", torch_ms)):
        row[key] = {"status": "ok", "ms": ms, "speedup": eager / ms} if ms else {"status": "not available: x"}
        row[key].update(extra.get(key, {}))
    return row


def test_summary_geomeans_only_over_workloads_that_ran() -> None:
    rows = [
        _row("a", 4.0, 1.0, 2.0, kiln={"cold_s": 1.0, "warm_s": 0.1}, torch={"cold_s": 4.0, "warm_s": 1.0}),
        _row("b", 9.0, 9.0, 1.0, kiln={"cold_s": 2.0, "warm_s": 0.2}, torch={"cold_s": 2.0, "warm_s": 2.0}),
        _row("c", 1.0, None, 0.5),
    ]
    totals = report.summary(rows)
    assert totals["kiln_speedup_geomean"] == pytest.approx(math.sqrt(4.0 * 1.0))
    assert totals["torch_speedup_geomean"] == pytest.approx((2.0 * 9.0 * 2.0) ** (1 / 3))
    assert totals["kiln_over_torch_geomean"] == pytest.approx(math.sqrt((4.0 / 2.0) * (1.0 / 9.0)))
    assert totals["kiln_over_torch_cold_geomean"] == pytest.approx(math.sqrt(0.25 * 1.0))
    assert totals["kiln_over_torch_warm_geomean"] == pytest.approx(math.sqrt(0.1 * 0.1))
    assert totals["workloads_with_kiln"] == 2
    assert geomean([]) is None


def test_bandwidth_is_bytes_over_time(capsys: pytest.CaptureFixture) -> None:
    rows = [_row("pw", 2.0, 1.0, None, bytes_moved=10_000_000)]
    report.print_bandwidth_table(rows, copy_gbs=20.0, copy_mib=64)
    assert rows[0]["bandwidth_gbs"]["eager"] == pytest.approx(5.0)  # 1e7 B / 2 ms
    assert rows[0]["bandwidth_gbs"]["kiln"] == pytest.approx(10.0)
    assert rows[0]["bandwidth_gbs"]["torch"] is None
    assert "50%" in capsys.readouterr().out  # best (10 GB/s) against the 20 GB/s copy


def test_measure_reports_per_call_time() -> None:
    calls = []
    timing = measure(lambda: calls.append(1), warmup=2, samples=3, min_sample_s=0.001)
    # a sub-microsecond call is batched until one sample lasts at least min_sample_s
    assert timing.calls_per_sample > 100 and timing.samples == 3
    assert len(calls) > 2 + 3 * timing.calls_per_sample
    assert 0 < timing.median_s < 1e-4


def test_training_step_returns_loss_and_every_gradient() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    case = Case(make_fn=lambda: model, inputs=[(x,)], training=True)
    wrapped = lambda inp: model(inp).square().mean()  # noqa: E731  (a stand-in for a compiled module)
    (loss, *grads), = make_step(case, wrapped, model)()
    assert loss.requires_grad is False and len(grads) == 2
    assert grads[0].shape == model.weight.shape


def test_cli_rejects_unknown_workloads() -> None:
    assert parse_args(["--only", "softmax,guard_overhead"]).only == ["softmax", "guard_overhead"]
    with pytest.raises(SystemExit):
        parse_args(["--only", "no_such_workload"])
    assert {"guard_overhead", "overhead", "ddp"} <= set(ALL_NAMES) and len(set(ALL_NAMES)) == len(ALL_NAMES)


@pytest.mark.slow
def test_quick_bench_run_writes_json(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--no-startup", "--only", "softmax", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())
    (row,) = results["workloads"]
    assert row["name"] == "softmax" and row["eager_ms"] > 0
    assert row["torch"]["status"] == "ok" and row["torch"]["speedup"] > 0
    assert row["kiln"]["status"] == "ok" or row["kiln"]["status"].startswith(("not available", "not compiled", "failed"))
    assert "geomean" in proc.stdout and "copy bandwidth" in proc.stdout
    if row["kiln"]["status"] == "ok":  # the tier-up process ran, torch.compile measured in it (no cold start)
        tierup = results["tierup"]["softmax"]  # measured in the first pass (1 thread), not the last
        assert tierup["status"] == "ok" and tierup["python_calls"] > 0 and tierup["full_speed_s"] > 0
        assert tierup["torch_from"] == "the tier-up process, after Kiln" and tierup["torch_first_call_s"] > 0
        assert results["tierup_summary"]["workloads_with_tierup"] == 1
        assert "before tier-up and time to full speed" in proc.stdout


def test_models_summary_reports_before_tier_up_both_ways(capsys):
    from benchmarks.models import print_table

    def row(model, kiln, torch_, kiln_early, torch_early):
        return {"model": model, "mode": "infer", "errors": {}, "kiln_speedup": kiln, "torch_speedup": torch_,
                "kiln_early_speedup": kiln_early, "torch_early_speedup": torch_early,
                "kiln_first_s": 1.0, "torch_first_s": 10.0}

    summary = print_table([row("a", 4.0, 2.0, 2.0, 1.0), row("b", 2.0, 2.0, 1.0, 2.0)])["infer"]
    assert math.isclose(summary["kiln_over_torch_geomean"], math.sqrt(2.0 * 1.0))
    assert math.isclose(summary["kiln_early_over_torch_geomean"], math.sqrt(1.0 * 0.5))
    assert math.isclose(summary["kiln_early_over_torch_early_geomean"], math.sqrt(2.0 * 0.5))
    assert "over torch.compile's own early calls 1.00" in capsys.readouterr().out


def test_models_table_reports_the_python_tier_apart_and_only_when_it_was_one(capsys):
    from benchmarks.models import print_table

    def row(model, python_tier):
        return {"model": model, "mode": "infer", "errors": {}, "kiln_speedup": 4.0, "torch_speedup": 2.0,
                "kiln_early_speedup": 3.0, "kiln_first_s": 1.0, "torch_first_s": 10.0, "python_tier": python_tier}

    rows = [row("a", {"boundary_loaded": False, "kiln_speedup": 3.0, "torch_speedup": 2.0}),
            row("b", {"boundary_loaded": False, "kiln_speedup": 1.0, "torch_speedup": 2.0}),
            row("c", {"boundary_loaded": True, "kiln_speedup": 9.0, "torch_speedup": 1.0}),  # not the Python tier
            row("d", {"error": "boom"})]
    summary = print_table(rows)["infer"]
    assert math.isclose(summary["kiln_python_tier_over_torch_geomean"], math.sqrt(1.5 * 0.5))
    out = capsys.readouterr().out
    assert "k py/t" in out and "empty Kiln cache and no tier-up" in out
    assert "the boundary extension loaded (not the Python tier)" in out and "python tier: boom" in out
