"""How the benchmarks measure time and bandwidth: warmup, then the median of repeated samples.

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


def measure(step: Callable[[], object], *, warmup: int = 3, samples: int = 15, min_sample_s: float = 0.005) -> Timing:
    """Median seconds per call of `step()` after `warmup` calls."""
    for _ in range(warmup):
        step()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            step()
        elapsed = time.perf_counter() - start
        if elapsed >= min_sample_s or number >= 1 << 20:
            break
        number *= 2 if elapsed * 4 > min_sample_s else 8
    per_call = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(number):
            step()
        per_call.append((time.perf_counter() - start) / number)
    return Timing(statistics.median(per_call), samples, number)


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
