"""Peak memory of one step: the most tensor memory live at once while the step runs, above what was
live when it started.

What it measures: every allocation and free of PyTorch's CPU allocator (c10's DefaultCPUAllocator,
which every CPU tensor goes through: ATen ops, Kiln's `torch.empty_strided` buffers, Inductor's
`empty_strided_cpu`), as the profiler reports them with `profile_memory=True`; the running sum of
their sizes in time order, maximised. Tensors that existed before the step are not counted, and
neither are their frees (the allocator reports a free only for a block allocated while profiling).
What it does not see: Python objects, the compilers' own bookkeeping, and memory a library takes
with its own malloc (BLAS packing buffers, OpenMP stacks). tracemalloc would see only Python's
allocations, and the process's RSS high-water mark is blurred by what glibc keeps after a free.
Known limit: a step profiled a second time in one process is charged less (frees of blocks its
first profile allocated, its gradients, are now reported), so each step is measured once; and on
convolution workloads (oneDNN) the numbers are not to be trusted yet: on resnet18_training (quick)
the first step profiled in a process got 43-44 MiB whichever compiler it was, later ones anywhere
from 10 to 70 MiB. The MLP and GPT workloads gave the same numbers alone and in the bench's order.

Input: a zero-argument step. Output: peak bytes (int), or None when the profiler gives no
allocation events (a torch build without them).
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto prints a line per profiler start and stop, and c10 one about blocks allocated before
    it, on file descriptor 2: kept out of the bench's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocations(prof: profile) -> list[tuple[int, int]]:
    """(time in ns, signed bytes) of each CPU allocator event the profiler recorded."""
    from torch._C._profiler import _EventType

    found: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if fields.device.type == "cpu":
                found.append((event.start_time_ns, int(fields.alloc_size)))
        stack.extend(event.children)
    found.sort()
    return found


def peak_step_bytes(step: Callable[[], object]) -> int | None:
    """Peak bytes live at once during one call of `step`, above the bytes live before it. The step
    should have run before (compiled, warm), so that one-time allocations are not counted."""
    gc.collect()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
        del result
    events = _allocations(prof)
    if not events:
        return None
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def peak_of_steps(steps: dict[str, Callable[[], object]]) -> dict[str, int | None]:
    """`peak_step_bytes` of each step, in turn. What a previous step left behind (gradients in
    `.grad`, say) is freed inside the next one without being counted: it was allocated before
    that step's profile began, so every step is charged only for what it allocates itself."""
    return {name: peak_step_bytes(step) for name, step in steps.items()}


def profiler_works() -> bool:
    """Whether the profiler reports CPU allocations at all (a 4 KiB tensor must show up)."""
    try:
        return (peak_step_bytes(lambda: torch.empty(1024)) or 0) >= 4096
    except Exception:
        return False
