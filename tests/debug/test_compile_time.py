"""Compile time per stage per frame (kiln/compile_time.py): exclusive accounting, kiln.stats() keys
and the KILN_LOGS=compile_time line of each frame."""
from __future__ import annotations

import logging
import time

import pytest
import torch

import kiln
from kiln import compile_time, log


def test_nested_stages_are_exclusive():
    compile_time.reset()
    with compile_time.frame("f") as record:
        time.sleep(0.02)  # the capture's own work
        with compile_time.stage("aot"):
            time.sleep(0.02)
            with compile_time.stage("lower.schedule"):
                time.sleep(0.03)
    s = record.seconds
    assert s["lower.schedule"] >= 0.03 and 0.02 <= s["aot"] < 0.03 + 0.02 and s["capture"] >= 0.02
    assert abs(sum(s.values()) - record.total) < 1e-6
    assert compile_time.frames() == [record]
    assert compile_time.totals()["aot"] == s["aot"]
    compile_time.reset()
    assert compile_time.frames() == [] and set(compile_time.totals().values()) == {0.0}


@pytest.mark.cpp
def test_stats_and_log_per_frame(fresh_cache):
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("kiln.compile_time").addHandler(handler)
    log.configure("compile_time")
    try:
        kiln.reset()
        w = torch.randn(4, 4, requires_grad=True)

        def f(x):
            return torch.relu(x @ w).sum()

        kiln.compile(f)(torch.randn(4, 4)).backward()
    finally:
        log.configure("")
        logging.getLogger("kiln.compile_time").removeHandler(handler)
    stats = kiln.stats()
    for stage in ("capture", "aot", "lower.decompose", "lower.schedule", "lower.codegen_cpp"):
        assert stats[f"compile_time.{stage}"] > 0, stage
    assert stats["compile_time.build"] + stats["compile_time.cache_load"] > 0
    (frame,) = [r for r in compile_time.frames() if r.name.endswith("f")]
    assert frame.total >= sum(v for k, v in frame.seconds.items() if k != "capture")
    assert len(lines) == 1 and lines[0].startswith(frame.name) and "aot" in lines[0] and "capture" in lines[0]
    kiln.reset()
    assert all(v == 0 for v in kiln.stats().values())
