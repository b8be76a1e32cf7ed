"""Compile time per stage per frame: where the seconds of a compile go.

The entry opens a frame around each capture (`with frame(name):`); stages inside it time themselves
(`with stage("aot"):`) or report measured seconds (`add("lower.build", s)`). Time is exclusive:
a stage's seconds exclude the stages nested in it, and whatever a frame spent outside every stage
is "capture" (the bytecode tracer, fake tensors, guards). `frames()` lists each frame's record,
`totals()` sums them for kiln.stats(), and KILN_LOGS=compile_time prints each frame as it ends.
Imported by stages like kiln.log (nothing else); counterpart: torch._dynamo.utils.compile_times.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator

from kiln import log

# stages every frame reports (0 when absent), in pipeline order; lowering passes come as "lower.<pass>"
BASE_STAGES = ("capture", "aot", "build", "cache_load")


@dataclass
class FrameTimes:
    """The seconds one capture of one frame spent in each stage."""

    name: str
    seconds: dict[str, float] = field(default_factory=dict)
    total: float = 0.0

    def line(self) -> str:
        parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items() if v > 0)
        return f"{self.name}: {self.total * 1e3:.1f} ms ({parts})"


@dataclass
class _Open:
    name: str
    start: float
    children: float = 0.0  # seconds of the stages nested inside, not this one's own


_FRAMES: list[FrameTimes] = []
_open_frames: list[FrameTimes] = []
_open_stages: list[_Open] = []


def _target() -> FrameTimes:
    """The frame being compiled; a compile outside any frame (a backward graph compiled on the first
    backward call) gets a record of its own."""
    if _open_frames:
        return _open_frames[-1]
    if not _FRAMES or _FRAMES[-1].name != "(outside capture)":
        _FRAMES.append(FrameTimes("(outside capture)"))
    return _FRAMES[-1]


def add(name: str, seconds: float) -> None:
    """Count `seconds` for stage `name` in the current frame (and not in the stage around it)."""
    record = _target()
    record.seconds[name] = record.seconds.get(name, 0.0) + seconds
    if not _open_frames:
        record.total += seconds
    if _open_stages:
        _open_stages[-1].children += seconds


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as stage `name`, less what the stages inside it report."""
    opened = _Open(name, time.perf_counter())
    _open_stages.append(opened)
    try:
        yield
    finally:
        _open_stages.pop()
        add(name, time.perf_counter() - opened.start - opened.children)


@contextlib.contextmanager
def frame(name: str) -> Iterator[FrameTimes]:
    """One capture of a frame: the time no stage claims is the capture's own."""
    record = FrameTimes(name)
    saved_stages = list(_open_stages)
    _open_stages.clear()  # a frame compiled inside another's stage (a callee at a break) is its own
    _open_frames.append(record)
    start = time.perf_counter()
    try:
        yield record
    finally:
        _open_frames.pop()
        _open_stages[:] = saved_stages
        record.total = time.perf_counter() - start
        claimed = sum(record.seconds.values())
        record.seconds = {"capture": max(record.total - claimed, 0.0), **record.seconds}
        _FRAMES.append(record)
        if saved_stages:
            saved_stages[-1].children += record.total  # the enclosing stage did not spend this time
        log.artifact("compile_time", record.line)


def frames() -> list[FrameTimes]:
    return list(_FRAMES)


def totals() -> dict[str, float]:
    """Seconds per stage summed over every frame since the last reset (base stages always present)."""
    out = {name: 0.0 for name in BASE_STAGES}
    for record in _FRAMES:
        for name, seconds in record.seconds.items():
            out[name] = out.get(name, 0.0) + seconds
    return out


def reset() -> None:
    _FRAMES.clear()
