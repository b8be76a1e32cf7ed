"""Several threads calling one compiled function.

Eight threads start together (a barrier) on a cold function, then on a warm in-memory cache, then
on a fresh process whose only entry is on disk (the case that raised `list.remove(x): x not in
list` when two threads passed the guards of the same stored entry). Every result must equal eager's
and no thread may raise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import kiln

REPO = Path(__file__).resolve().parents[2]
THREADS = 8


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def run_together(fn, inputs) -> tuple[list, list]:
    """fn(input) in one thread per input, all released at once; (results, exceptions)."""
    barrier = threading.Barrier(len(inputs))
    results: list = [None] * len(inputs)
    errors: list = []

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(inputs[i])
        except BaseException as exc:  # every exception is a failure of the test, reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results, errors


def body(x):
    return torch.sin(x) * 2 + x.sum()


def test_cold_then_warm_from_eight_threads():
    f = kiln.compile(body, backend="eager")
    inputs = [torch.randn(4, 8) for _ in range(THREADS)]
    results, errors = run_together(f, inputs)  # cold: every thread misses at once
    assert not errors, errors
    for x, out in zip(inputs, results):
        torch.testing.assert_close(out, body(x))
    assert kiln.stats()["compiles"] == 1  # one capture; the others waited and took its entry
    results, errors = run_together(f, inputs)  # warm: guard hits only
    assert not errors, errors
    for x, out in zip(inputs, results):
        torch.testing.assert_close(out, body(x))
    assert kiln.stats()["compiles"] == 1


def test_threads_with_different_shapes_each_get_their_own_answer():
    f = kiln.compile(body, backend="eager", dynamic=False)
    inputs = [torch.randn(2 + i % 4, 3) for i in range(THREADS)]
    results, errors = run_together(f, inputs)
    assert not errors, errors
    for x, out in zip(inputs, results):
        torch.testing.assert_close(out, body(x))
    assert kiln.stats()["compiles"] == 4


_WARM_START = textwrap.dedent("""
    import json, threading, torch, kiln

    def f(x):
        return torch.relu(x) * 3 + 1

    compiled = kiln.compile(f, options={"opt_level": "-O1"})
    inputs = [torch.randn(16, 8) for _ in range(8)]
    barrier = threading.Barrier(len(inputs))
    errors, worst = [], [0.0]

    def work(x):
        barrier.wait()
        try:
            worst[0] = max(worst[0], (compiled(x) - f(x)).abs().max().item())
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"errors": errors, "worst": worst[0], "stats": kiln.stats()}))
""")


@pytest.mark.cpp
def test_eight_threads_on_a_warm_disk_cache(tmp_path: Path):
    script = tmp_path / "warm.py"
    script.write_text(_WARM_START)
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "KILN_PERSISTENT_CACHE": "1"}
    env.pop("KILN_LOGS", None)
    reports = []
    for _ in range(2):  # the first run stores the entry, the second finds it on disk in every thread
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for report in reports:
        assert report["errors"] == [] and report["worst"] < 1e-5, report
    assert reports[0]["stats"]["frames"] == 1
    warm = reports[1]["stats"]
    assert warm["disk_hits"] == 1 and warm["frames"] == 0, warm  # one thread loaded it, the rest hit it
