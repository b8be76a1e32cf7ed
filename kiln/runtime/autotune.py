"""Autotuning of generated Triton kernels (mode="max-autotune" on CUDA): block sizes, warps, stages.

`candidates(shape)` lists the launch configurations a kernel may take without changing what it
computes (a persistent reduction keeps its RBLOCK, which must cover a row; the rest is free).
`AutotunedKernel` stands where the wrapper calls a kernel: on its first call for a range size it
times every candidate on the real arguments (CUDA events, median of a few runs), keeps the fastest,
and records it in `<cache_dir>/autotune/<kernel key>.json`, so a later process reads the choice
instead of timing again. KILN_LOGS=autotune prints the candidates and their times. Kernels that
write into a tensor they also read (scatters, atomic adds) are never re-run to time them: they keep
the generator's choice. Corresponds to torch/_inductor/runtime/triton_heuristics.py (autotuning).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable

from kiln import log
from kiln.runtime import store


@dataclass(frozen=True)
class KernelShape:
    """What constrains a kernel's launch: its kind ("flat", "persistent", "looped", "scan", "serial")
    and the block sizes the generator chose."""

    kind: str
    xblock: int
    rblock: int | None


@dataclass(frozen=True)
class LaunchConfig:
    xblock: int
    rblock: int | None
    num_warps: int
    num_stages: int

    def kwargs(self) -> dict[str, int]:
        out = {"XBLOCK": self.xblock, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.rblock is not None:
            out["RBLOCK"] = self.rblock
        return out


TILE_LIMIT = 8192  # XBLOCK * RBLOCK of a candidate: past this a tile spills registers


def candidates(shape: KernelShape) -> list[LaunchConfig]:
    """Every configuration worth timing for a kernel of this shape; the generator's own comes first."""
    default = LaunchConfig(shape.xblock, shape.rblock, 4, 2)
    out = [default]
    xblocks: list[int]
    rblocks: list[int | None]  # None: the kernel has no reduction block
    if shape.kind == "serial":
        xblocks, rblocks = [256, 1024], [None]
    elif shape.kind == "flat":
        xblocks, rblocks = [128, 256, 512, 1024, 2048], [None]
    elif shape.kind == "persistent":  # RBLOCK covers the row: only the rows per program may change
        xblocks, rblocks = [1, 2, 4, 8, 16, 32], [shape.rblock]
    else:  # looped reductions and scans: both dims are free
        xblocks, rblocks = [1, 4, 16], [64, 256, 1024]
    for xb in xblocks:
        for rb in rblocks:
            if rb is not None and xb * rb > TILE_LIMIT:
                continue
            for warps in (2, 4, 8):
                for stages in (1, 2, 3):
                    c = LaunchConfig(xb, rb, warps, stages)
                    if c not in out:
                        out.append(c)
    return out


def _path(key: str, create: bool = False) -> str | None:
    """The record's path in the cache (None when the cache directory is refused or cannot be made)."""
    folder = store.folder("autotune", key[:2], create=create)
    return os.path.join(folder, f"{key}.json") if folder is not None else None


def stored_choice(key: str) -> LaunchConfig | None:
    path = _path(key)
    body = store.read_sealed(path) if path is not None else None  # a damaged record is deleted
    if body is None:
        return None
    try:
        choice = LaunchConfig(**json.loads(body)["choice"])
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(v, int) or v is None for v in asdict(choice).values()):
        return None
    return choice


def store_choice(key: str, choice: LaunchConfig, timings: dict[str, float]) -> None:
    path = _path(key, create=True)
    if path is not None:  # atomic and sealed: another process reads the old record or the new one
        store.write_sealed(path, json.dumps({"choice": asdict(choice), "seconds": timings}, indent=1).encode())


def tuning_key(kernel_source: str, name: str, xnumel: int) -> str:
    """The record of one kernel (by its source) at one range size."""
    return hashlib.sha256(f"{name}\n{xnumel}\n{kernel_source}".encode()).hexdigest()[:32]


def _time_on_cuda(run: Callable[[], None], repeat: int = 5) -> float:
    import torch

    run()  # compile this configuration before timing it
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


class AutotunedKernel:
    """A Triton kernel launched with the fastest configuration for each range size it meets."""

    def __init__(self, kernel: Any, name: str, source: str, shape: KernelShape, *, rerunnable: bool,
                 timer: Callable[[Callable[[], None]], float] = _time_on_cuda) -> None:
        self.kernel = kernel
        self.name = name
        self.source = source
        self.shape = shape
        self.rerunnable = rerunnable
        self.timer = timer
        self.chosen: dict[int, LaunchConfig] = {}
        self._lock = threading.Lock()

    def launch(self, xnumel: int, *args: Any) -> None:
        choice = self.chosen.get(xnumel)
        if choice is None:
            with self._lock:
                choice = self.chosen.get(xnumel) or self._choose(xnumel, args)
                self.chosen[xnumel] = choice
        self._run(choice, xnumel, args)

    def _run(self, c: LaunchConfig, xnumel: int, args: tuple) -> None:
        grid = 1 if self.shape.kind == "serial" else -(-xnumel // c.xblock)
        self.kernel[(grid,)](*args, **c.kwargs())

    def _choose(self, xnumel: int, args: tuple) -> LaunchConfig:
        key = tuning_key(self.source, self.name, xnumel)
        stored = stored_choice(key)
        if stored is not None:
            log.artifact("autotune", f"{self.name} (xnumel {xnumel}): {stored} from the cache")
            return stored
        options = candidates(self.shape)
        if not self.rerunnable:
            log.artifact("autotune", f"{self.name}: writes what it reads; keeps {options[0]}")
            return options[0]
        timings: dict[str, float] = {}
        best, best_time = options[0], float("inf")
        for c in options:
            try:
                t = self.timer(functools.partial(self._run, c, xnumel, args))
            except Exception as e:  # a configuration the compiler rejects (out of resources) is no candidate
                log.artifact("autotune", f"{self.name}: {c} failed ({type(e).__name__})")
                continue
            timings[repr(c)] = t
            if t < best_time:
                best, best_time = c, t
        log.artifact("autotune", lambda: f"{self.name} (xnumel {xnumel}):\n" + "\n".join(
            f"  {k}: {v * 1e6:.1f} us" for k, v in sorted(timings.items(), key=lambda kv: kv[1])))
        store_choice(key, best, timings)
        return best
