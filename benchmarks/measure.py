"""One workload, measured: eager, Kiln and torch.compile compiled and checked against eager, then
timed in this process with their samples interleaved, then their peak memory per step measured in
turn (benchmarks.memory); cold and warm compile times are taken from fresh subprocesses
(benchmarks.startup), and so is Kiln's speed before tier-up with its seconds to full speed
(benchmarks.tierup).

Input: a workload module and the run's options. Output: a plain dict (one row of the report and of
bench_results.json). A compiler that is missing, raises, or computes a different result gets a
`status` saying so and no speed: a wrong or missing result is never timed as if it were fine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Callable

import torch

from benchmarks.compilers import (KILN, TORCH, Compiler, call_recording_warnings, kiln_counters, seed_boundary,
                                  seed_precompiled_header, settle_kiln)
from benchmarks.memory import peak_of_steps
from benchmarks.tierup import tierup_seconds, with_ratios
from benchmarks.timing import measure_interleaved
from benchmarks.workload import Case, make_step

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def startup_seconds(workload: str, compiler: Compiler, cache_dir: str, quick: bool) -> dict:
    """First-step time of `compiler` on `workload` in a fresh Python process using `cache_dir`."""
    env = dict(os.environ, **{compiler.cache_env: cache_dir})
    cmd = [sys.executable, "-m", "benchmarks.startup", workload, compiler.name] + (["--quick"] if quick else [])
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}


def _torch_graph_count() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def final_counts(compiler: Compiler) -> dict:
    """Graphs, recompiles, graph breaks and eager fallbacks over every call this process made (the
    first, the tier-up calls, the timed ones): a step that keeps recompiling shows it here, not in
    its first call's counts. torch.compile has no recompile counter: its graphs and breaks only."""
    if compiler is KILN:
        stats = kiln_counters()
        return {key: stats.get(key) for key in ("graphs", "recompiles", "graph_breaks", "fallbacks")}
    return {"graphs": _torch_graph_count(),
            "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values())}


def prepare_compiled(
    case: Case, name: str, compiler: Compiler, expected: list, cache_dir: str, opts: dict
) -> tuple[dict, Callable[[], list] | None]:
    """Compile times (subprocesses), then compile in this process and check the result against
    eager. Returns the row (status, times, counts, notes) and the step to time, or None when there is
    nothing honest to time (the compile failed, nothing compiled, or the result is wrong)."""
    row: dict = {"status": "ok", "notes": []}
    if opts["startup"]:
        cold = startup_seconds(name, compiler, cache_dir, opts["quick"])
        warm = startup_seconds(name, compiler, cache_dir, opts["quick"])
        row["cold_s"], row["warm_s"] = cold.get("first_call_s"), warm.get("first_call_s")
        for label, result in (("cold", cold), ("warm", warm)):
            if "error" in result:
                row["notes"].append(f"{label} start failed: {result['error']}")
    os.environ[compiler.cache_env] = cache_dir
    if compiler is KILN:
        import kiln

        seed_precompiled_header(cache_dir, os.path.join(os.path.dirname(cache_dir), "kiln-toolchain"))
        kiln.config.cache_dir = cache_dir
    compiler.reset()
    if compiler is TORCH:
        torch._dynamo.utils.counters.clear()
    fn = case.make_fn()
    try:
        compiled = compiler.wrap(fn)
        step = make_step(case, compiled, fn)
        start = time.perf_counter()
        got, warned = call_recording_warnings(step)
        row["first_call_s"] = time.perf_counter() - start
    except Exception as exc:
        row["status"] = f"failed: {_first_line(exc)}"
        return row, None
    if compiler is KILN:
        stats = kiln_counters()
        row["stats"] = stats
        row["compiles"] = stats.get("graphs")
        warned = list(dict.fromkeys(warned))
        if stats.get("graphs") == 0 and not stats.get("disk_hits"):
            # nothing was compiled: timing eager code under Kiln's name would be a false result
            row["status"] = "not compiled: every frame ran eagerly" + (f" ({warned[0]})" if warned else "")
            return row, None
        if stats.get("disk_hits"):
            row["notes"].append(f"{stats['disk_hits']} frame(s) loaded from Kiln's persistent frame cache")
        if stats.get("fallbacks"):
            row["notes"].append(f"{stats['fallbacks']} call(s) of a frame ran eagerly (fallback)")
        row["notes"].extend(f"warning: {w}" for w in warned)
    else:
        row["compiles"] = _torch_graph_count()
    try:
        torch.testing.assert_close(got, expected, rtol=case.rtol, atol=case.atol)
    except AssertionError as exc:
        row["status"] = f"wrong result: {str(exc).strip().splitlines()[0]}"
        return row, None
    if compiler is KILN:  # time the steady state: hot graphs on their native wrappers
        row["tier_up_s"] = settle_kiln(step)
    return row, step


def bench_workload(module: ModuleType, opts: dict, kiln_unavailable: str | None, scratch: str) -> dict:
    case = module.build(opts["quick"])
    fn = case.make_fn()
    steps = {"eager": make_step(case, fn, fn)}
    expected = steps["eager"]()
    row: dict = {
        "name": module.NAME,
        "description": module.DESCRIPTION,
        "calls_per_step": len(case.inputs),
        "bytes_moved": case.bytes_moved,
    }
    prepared: list[Compiler] = []
    try:
        for compiler in (KILN, TORCH):
            if compiler is KILN and kiln_unavailable is not None:
                row["kiln"] = {"status": f"not available: {kiln_unavailable}", "notes": []}
                continue
            prepared.append(compiler)
            cache_dir = tempfile.mkdtemp(prefix=f"{module.NAME}-{compiler.name}-", dir=scratch)
            row[compiler.name], step = prepare_compiled(case, module.NAME, compiler, expected, cache_dir, opts)
            if step is not None:
                steps[compiler.name] = step
        timings = measure_interleaved(steps, warmup=opts["warmup"], samples=opts["samples"])
        peaks = peak_of_steps(steps) if opts.get("memory", True) else {}
        for compiler in prepared:
            if compiler.name in steps:
                row[compiler.name]["counts"] = final_counts(compiler)
                row[compiler.name]["compiles"] = row[compiler.name]["counts"]["graphs"]
    finally:
        for compiler in prepared:
            compiler.reset()
    row["eager_ms"] = timings["eager"].ms / len(case.inputs)
    row["eager_peak_bytes"] = peaks.get("eager")
    for name in steps.keys() - {"eager"}:
        row[name]["ms"] = timings[name].ms / len(case.inputs)
        row[name]["speedup"] = row["eager_ms"] / row[name]["ms"]
        row[name]["peak_bytes"] = peaks.get(name)
    if opts.get("tierup") and "kiln" in steps:
        row["tierup"] = measure_tierup(module.NAME, row, opts["quick"], opts.get("threads", 1), scratch)
    return row


def measure_tierup(name: str, row: dict, quick: bool, threads: int, scratch: str) -> dict:
    """Kiln's speed before tier-up and its seconds to full speed (benchmarks.tierup, a fresh process
    with empty caches), beside torch.compile's first call and speed. A full run measures
    torch.compile in that process too, the way it measures Kiln. --quick, to stay short, takes
    torch.compile's speedup from this run's timing and its first call from its cold start (when
    measured), and gives the child's cache the run's precompiled header instead of building its
    own (the same header for every workload; a cold build takes tens of seconds). Every run gives it
    the boundary extension, which `make venv` builds into a new user's cache once."""
    torch_row = row.get("torch", {})
    torch_ok = torch_row.get("status") == "ok"
    reuse = quick and torch_ok and torch_row.get("cold_s") is not None
    toolchain = os.path.join(scratch, "kiln-toolchain")

    def seed(cache_dir: str) -> None:
        seed_boundary(cache_dir, toolchain)  # as `make venv` leaves it in a new user's cache
        if quick:
            seed_precompiled_header(cache_dir, toolchain)
    result = tierup_seconds(name, quick, threads, scratch, with_torch=torch_ok and not reuse, seed_header=seed)
    result["header_seeded"] = quick
    result["boundary_seeded"] = True
    if reuse:
        result["torch_from"] = "this run's timing and cold start"
        return with_ratios(result, torch_row["speedup"], torch_row["cold_s"])
    result["torch_from"] = "the tier-up process, after Kiln"
    return with_ratios(result)
