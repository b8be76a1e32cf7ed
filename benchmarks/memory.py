"""Peak memory of one step: the most tensor memory live at once while the step runs, above what was
live when it started.

What it measures: every allocation and free of PyTorch's CPU allocator (c10's DefaultCPUAllocator,
which every CPU tensor goes through: ATen ops, Kiln's `torch.empty_strided` buffers, Inductor's
`empty_strided_cpu`), as the profiler reports them with `profile_memory=True`; the running sum of
their sizes in time order, maximised. Tensors that existed before the step are not counted, and
neither are their frees: a free counts only when its address was allocated earlier in this same
profile. The allocator's own report is not enough for that. It remembers the size of each block
allocated while a profile runs and forgets it only when the block is freed while a profile runs,
so it reports the free of a block an earlier profile made (a step profiled twice frees the
gradients of the first), and a block made in an earlier profile and freed between profiles leaves
its address behind: when a later block at that reused address is freed inside a profile, the old
size is reported. Counting those frees made a step's peak depend on what was profiled before it
and on where malloc put things: tests/runtime/test_steal_args.py's step lost 0 to 4 of its six
256 KiB buffers from run to run, and resnet18_training (quick) got 43-44 MiB in the first step
profiled in a process, 10 to 70 MiB in later ones (its eager step now measures 43.4 MiB in each of
six profiles in a row, where it measured 0.5 MiB from the second on; the compiled steps were not
measured again since).
What it does not see: Python objects, the compilers' own bookkeeping, and memory a library takes
with its own malloc (BLAS packing buffers, OpenMP stacks). tracemalloc would see only Python's
allocations, and the process's RSS high-water mark is blurred by what glibc keeps after a free.

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


def _allocations(prof: profile) -> list[tuple[int, int, int]]:
    """(time in ns, signed bytes, address) of each CPU allocator event the profiler recorded, in
    time order (a free before an allocation of the same nanosecond, as an address is reused)."""
    from torch._C._profiler import _EventType

    found: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if fields.device.type == "cpu":
                found.append((event.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
        stack.extend(event.children)
    found.sort()
    return found


def _peak(events: list[tuple[int, int, int]]) -> int:
    """The most bytes live at once, counting each allocation until its free; a free whose address
    no allocation of these events holds (a block from before the profile) is left out."""
    held: dict[int, int] = {}
    live = peak = 0
    for _, nbytes, ptr in events:
        if nbytes > 0:
            live += nbytes - held.pop(ptr, 0)  # an address can only be reused after its free
            held[ptr] = nbytes
            peak = max(peak, live)
        elif ptr in held:
            live -= held.pop(ptr)
    return peak


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
    return _peak(events)


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
