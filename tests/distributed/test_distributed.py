"""Kiln under DDP and FSDP2: 2 gloo processes, 3 SGD steps, every parameter vs eager DDP / FSDP2.

Covers both DDP wrappings (kiln.compile(DDP(m)) and DDP(kiln.compile(m))), the graph split at bucket
boundaries and `optimize_ddp=False`, `no_sync()` gradient accumulation, find_unused_parameters,
FSDP2 (`fully_shard`) on a small transformer, and a collective called in a compiled function.
float64 so that a difference is a bug, not rounding. Corresponds to PyTorch's test_dynamo_distributed.
"""
from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed import ddp_worker

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

JOBS = [("outer", "aot_eager"), ("inner", "aot_eager"), ("no_split", "aot_eager"),
        ("no_sync", "aot_eager"), ("unused", "aot_eager"), ("step", "aot_eager"), ("outer", "inductor"),
        ("fsdp2", "aot_eager"), ("fsdp2", "inductor")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(ddp_worker.run, args=(2, _free_port(), JOBS, str(out)), nprocs=2, join=True)
    return {rank: torch.load(out / f"rank{rank}.pt") for rank in range(2)}


@pytest.mark.parametrize("job", [f"{n}/{b}" for n, b in JOBS])
def test_parameters_match_eager_ddp(results: dict, job: str) -> None:
    for rank in range(2):
        r = results[rank][job]
        assert r["max_diff"] < 1e-10, (rank, r)
        assert r["fallbacks"] == 0, (rank, r)
        assert r["backend_calls"], (rank, r)  # something was compiled, not run eagerly


@pytest.mark.parametrize("job", ["outer/aot_eager", "inner/aot_eager", "outer/inductor", "step/aot_eager"])
def test_graph_split_at_buckets(results: dict, job: str) -> None:
    # float64 Linear(32, 32) holds 8448 B, the head 1056 B; with a 5242 B cap, walking backwards:
    # [head, layers[3]] fill the first bucket, then each of layers[2], [1], [0] fills one: 4 pieces,
    # each handed to the backend on its own, with the ops of its layers (linear + tanh each).
    calls = results[0][job]["backend_calls"]
    # a compiled training step around DDP adds two graphs of its own: the loss after DDP's call,
    # and `loss.detach()` after the break at `backward()`
    assert len(calls) == (6 if job.startswith("step") else 4), calls


def test_no_split_when_turned_off(results: dict) -> None:
    assert len(results[0]["no_split/aot_eager"]["backend_calls"]) == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fsdp2_blocks_compile_between_hooks(results: dict, backend: str) -> None:
    # FSDP2's all-gather/reshard hooks run natively; each block's forward (LayerNorm, attention,
    # MLP) and the head are compiled: three graphs, two breaks (one per sharded block call).
    r = results[0][f"fsdp2/{backend}"]
    assert r["graphs"] == 3 and r["graph_breaks"] == 2, r
    assert sorted(r["backend_calls"])[-1] >= 5, r  # a block's graph holds its ops, not just one


def test_bucket_nodes_walk_backwards() -> None:
    import kiln
    from kiln.capture.distributed import bucket_nodes

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
    seen = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        # Linear(16, 16): 1088 B in float32; the head 136 B. Backwards: the head and the middle
        # Linear fill the first bucket (1224 B >= 1000), the first Linear starts the second.
        seen.append(bucket_nodes(gm, example_inputs, first_cap=1000, cap=1000))
        return gm

    kiln.compile(model, backend=backend)(torch.randn(3, 16))
    buckets = seen[0]
    assert [b.nbytes for b in buckets] == [1088, 136 + 1088]
    assert sum(len(b.nodes) for b in buckets) == 5  # every op in exactly one piece
    assert buckets[-1].nodes[-1].startswith("linear")  # forward order: the head comes last


def test_collective_in_compiled_function_breaks_cleanly() -> None:
    import kiln

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        def step(x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            dist.all_reduce(y)
            return y + 1

        x = torch.arange(3.0)
        assert torch.equal(kiln.compile(step, backend="aot_eager")(x), x * 2 + 1)
        explained = kiln.explain(step)(x)
        assert explained.graph_count == 2 and explained.graph_break_count == 1
        reason = explained.break_reasons[0]
        assert "all_reduce" in reason.reason and "collective" in reason.suggestion
        assert reason.lineno == step.__code__.co_firstlineno + 2
    finally:
        dist.destroy_process_group()
