"""Worker side of the DDP tests: one process of a 2-rank gloo group runs a scenario and reports.

Each scenario trains a model for 3 SGD steps under Kiln and, on identical data, the same model
under eager DDP, and returns the largest parameter difference plus what Kiln compiled. Run by
tests/distributed/test_ddp.py through torch.multiprocessing (spawn), never collected by pytest.
"""
from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln


class Net(torch.nn.Module):
    """Four layers, so that small buckets split the graph; `unused` takes no part in forward."""

    def __init__(self, with_unused: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))
        self.head = torch.nn.Linear(32, 4)
        if with_unused:
            self.unused = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _counting(backend: str, calls: list[int]) -> Any:
    inner = kiln.backends.lookup(backend)

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        calls.append(len([n for n in gm.graph.nodes if n.op == "call_function"]))
        return inner(gm, example_inputs)

    return counting_backend


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()


def scenario(rank: int, name: str, backend: str) -> dict[str, Any]:
    """Train eager DDP and Kiln side by side; `name` picks the wrapping and the DDP options."""
    torch.manual_seed(0)
    base = Net(with_unused=name == "unused").double()
    ddp_kwargs: dict[str, Any] = {"bucket_cap_mb": 0.005}  # 5242 B: about one Linear(32, 32) a bucket
    if name == "unused":
        ddp_kwargs["find_unused_parameters"] = True
    reference = DDP(copy.deepcopy(base), **ddp_kwargs)
    calls: list[int] = []
    compiler = _counting(backend, calls)
    if name == "inner":
        model = DDP(kiln.compile(copy.deepcopy(base), backend=compiler), **ddp_kwargs)
    elif name == "step":  # DDP called inside a compiled training step: forward and backward in one frame
        model = DDP(copy.deepcopy(base), **ddp_kwargs)
        train_step = kiln.compile(_train_step, backend=compiler)
    else:
        model = kiln.compile(DDP(copy.deepcopy(base), **ddp_kwargs), backend=compiler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    with kiln.config.patch(optimize_ddp=name != "no_split"):
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(6, 32, dtype=torch.float64, generator=gen)
            if name == "no_sync":  # gradient accumulation: a local micro-batch, then a synced one
                with model.no_sync():
                    model(x[:3]).sum().backward()
                model(x[3:]).sum().backward()
                with reference.no_sync():
                    reference(x[:3]).sum().backward()
                reference(x[3:]).sum().backward()
            elif name == "step":
                train_step(model, x)
                _train_step(reference, x)
            else:
                model(x).sum().backward()
                reference(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            ref_optimizer.step()
            ref_optimizer.zero_grad()
    pairs = list(zip(model.parameters(), reference.parameters()))
    stats = kiln.stats()
    return {"max_diff": max(float((a - b).abs().max()) for a, b in pairs), "n_params": len(pairs),
            "backend_calls": calls, "fallbacks": stats["fallbacks"], "graphs": stats["graphs"]}


def run(rank: int, world: int, port: int, jobs: list[tuple[str, str]], out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for name, backend in jobs:
            kiln.reset()
            if name == "fsdp2":
                results[f"{name}/{backend}"] = fsdp_scenario(rank, world, backend)
            else:
                results[f"{name}/{backend}"] = scenario(rank, name, backend)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


class Block(torch.nn.Module):
    """A small pre-norm transformer block: attention and an MLP, each behind a LayerNorm."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def fsdp_scenario(rank: int, world: int, backend: str) -> dict[str, Any]:
    """FSDP2 (`fully_shard` on each block and the root) under Kiln vs eager FSDP2, 3 SGD steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    base = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(32, 4)).double()

    def sharded() -> torch.nn.Module:
        model = copy.deepcopy(base)
        for block in model[:2]:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    reference, plain = sharded(), sharded()
    calls: list[int] = []
    model = kiln.compile(plain, backend=_counting(backend, calls))
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.05)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(2, 8, 32, dtype=torch.float64, generator=gen)
        model(x).sum().backward()
        reference(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    diffs = [float((a.full_tensor() - b.full_tensor()).abs().max())
             for a, b in zip(plain.parameters(), reference.parameters())]
    stats = kiln.stats()
    return {"max_diff": max(diffs), "n_params": len(diffs), "backend_calls": calls,
            "fallbacks": stats["fallbacks"], "graphs": stats["graphs"], "graph_breaks": stats["graph_breaks"]}
