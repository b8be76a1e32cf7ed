"""Benchmark: a 2-process DDP training step (gloo, CPU) of the small GPT, four ways in one run.

eager DDP, Kiln with the graph split at DDP's buckets (the default), Kiln without the split
(`kiln.config.optimize_ddp = False`) and the real torch.compile, each `DDP(model)` compiled from
outside. Each process runs on `--threads` threads (1 by default: two processes on two cores).
It also says how much of the all-reduce time is hidden behind the backward, per system:
    hidden = 1 - (step - step without all-reduce) / (all-reduce of every gradient on its own)
where "step without all-reduce" runs under `no_sync()`. Run alone (`python -m benchmarks.ddp`) or
from `make bench` (`--only ddp`); prints a table and returns the rows.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NAME = "ddp"
DESCRIPTION = "2-process DDP training step of the small GPT (gloo), eager vs Kiln (split / no split) vs torch.compile"
SYSTEMS = ("eager", "kiln", "kiln_no_split", "torch")


def _model(quick: bool) -> tuple[torch.nn.Module, Any]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from examples.gpt import GPT, GPTConfig

    config = GPTConfig(n_layer=2 if quick else 4, n_embd=64 if quick else 128, n_head=4, block_size=64)
    torch.manual_seed(0)
    return GPT(config), config


def _wrap(system: str, ddp: torch.nn.Module) -> Callable[..., Any]:
    if system == "eager":
        return ddp
    if system == "torch":
        return torch.compile(ddp)
    import kiln

    return kiln.compile(ddp)


def _timed(fn: Callable[[], None], samples: int) -> float:
    times = []
    for _ in range(samples):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _one_system(system: str, rank: int, quick: bool) -> dict[str, float]:
    import kiln
    from examples.gpt import sample_batch
    from torch.nn.parallel import DistributedDataParallel as DDP

    kiln.reset()  # the same forward code is compiled per system: no entry may carry over
    base, config = _model(quick)
    # torch.compile's DDP optimizer requires buckets no smaller than DDP's first one (1 MiB): the
    # quick model then fills one or two buckets, the full one several
    ddp = DDP(base, bucket_cap_mb=1)
    model = _wrap(system, ddp)
    idx, targets = sample_batch(config, 8, 64, seed=rank)

    def step() -> None:
        _, loss = model(idx, targets)
        loss.backward()

    def step_no_sync() -> None:
        with ddp.no_sync():
            step()

    grads = [p for p in ddp.parameters() if p.requires_grad]

    def all_reduce_alone() -> None:
        for p in grads:
            dist.all_reduce(p.grad)

    samples = 5 if quick else 15
    with kiln.config.patch(optimize_ddp=system != "kiln_no_split"):
        start = time.perf_counter()
        step()  # compiles
        first = (time.perf_counter() - start) * 1e3
        for _ in range(2):
            step()
        result = {"first_step_ms": first, "step_ms": _timed(step, samples),
                  "no_sync_ms": _timed(step_no_sync, samples), "all_reduce_ms": _timed(all_reduce_alone, samples)}
    result["recompiles"] = kiln.stats()["recompiles"] if system.startswith("kiln") else 0
    exposed = max(result["step_ms"] - result["no_sync_ms"], 0.0)
    result["hidden"] = max(0.0, 1.0 - exposed / result["all_reduce_ms"]) if result["all_reduce_ms"] > 0 else 0.0
    return result


def _worker(rank: int, world: int, port: int, quick: bool, threads: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = {system: _one_system(system, rank, quick) for system in SYSTEMS}
        if rank == 0:
            torch.save(rows, out)
    finally:
        dist.destroy_process_group()


def run(quick: bool = False, threads: int = 1) -> dict[str, dict[str, float]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="kiln-ddp-bench-"), "rows.pt")
    mp.spawn(_worker, args=(2, port, quick, threads, out), nprocs=2, join=True)
    rows = torch.load(out)
    eager = rows["eager"]["step_ms"]
    print(f"DDP training step, 2 processes x {threads} thread(s), gloo, small GPT{' (quick)' if quick else ''}")
    print(f"{'system':<15}{'step ms':>9}{'speedup':>9}{'no_sync ms':>12}{'all-reduce ms':>15}{'hidden':>8}{'first ms':>10}")
    for system, r in rows.items():
        print(f"{system:<15}{r['step_ms']:>9.2f}{eager / r['step_ms']:>8.2f}x{r['no_sync_ms']:>12.2f}"
              f"{r['all_reduce_ms']:>15.2f}{r['hidden']:>7.0%}{r['first_step_ms']:>10.0f}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ddp", description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = parser.parse_args()
    run(args.quick, args.threads)
    sys.exit(0)
