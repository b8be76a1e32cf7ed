"""How the benchmarks measure time and bandwidth: warmup, then the median of repeated samples,
taken in turn across the compilers being compared.

A sample runs the step `number` times back to back, with `number` chosen so that one sample takes at
least `min_sample_s`; this keeps timer resolution and Python-loop noise out of microsecond-scale
calls (the guard-overhead benchmark) while a millisecond-scale step runs once per sample.
torch.set_num_threads is left at PyTorch's default, as a user would run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float  # seconds per call, median over samples
    samples: int
    calls_per_sample: int

    @property
    def ms(self) -> float:
        return self.median_s * 1e3

    @property
    def us(self) -> float:
        return self.median_s * 1e6


def _calls_per_sample(step: Callable[[], object], min_sample_s: float) -> int:
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            step()
        elapsed = time.perf_counter() - start
        if elapsed >= min_sample_s or number >= 1 << 20:
            return number
        number *= 2 if elapsed * 4 > min_sample_s else 8


def _sample(step: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        step()
    return (time.perf_counter() - start) / number


def measure(step: Callable[[], object], *, warmup: int = 3, samples: int = 15, min_sample_s: float = 0.005) -> Timing:
    """Median seconds per call of `step()` after `warmup` calls."""
    return measure_interleaved({"step": step}, warmup=warmup, samples=samples, min_sample_s=min_sample_s)["step"]


def measure_interleaved(
    steps: dict[str, Callable[[], object]], *, warmup: int = 3, samples: int = 15, min_sample_s: float = 0.005
) -> dict[str, Timing]:
    """`measure` for several steps at once, their samples taken in turn (eager, kiln, torch, eager,
    ...): on a shared machine a burst of load then hits all of them alike instead of whichever ran
    during it, so the ratios between them stay meaningful."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    numbers = {name: _calls_per_sample(step, min_sample_s) for name, step in steps.items()}
    per_call: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(samples):
        for name, step in steps.items():
            per_call[name].append(_sample(step, numbers[name]))
    return {name: Timing(statistics.median(per_call[name]), samples, numbers[name]) for name in steps}


def copy_bandwidth_gbs(nbytes: int = 256 << 20, samples: int = 7) -> float:
    """The machine's memory bandwidth as seen by PyTorch: copying a large float32 tensor into another
    one allocated beforehand (so page faults of fresh memory are not counted), bytes read plus bytes
    written, in GB/s (1e9 bytes). It is the practical ceiling of any memory-bound (pointwise) kernel."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), warmup=2, samples=samples, min_sample_s=0.0)
    return 2 * nbytes / timing.median_s / 1e9


def geomean(values: list[float]) -> float | None:
    if not values:
        return None
    return statistics.geometric_mean(values)
