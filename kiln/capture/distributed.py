"""Compiling inside DDP and FSDP2: DDP's and FSDP's own Python runs natively, the model runs compiled.

DDP: compile the wrapped module, and split its graph at gradient-bucket boundaries.

DDP all-reduces gradients bucket by bucket while backward runs. One compiled graph has one backward,
so every parameter's gradient would appear at its end and no all-reduce could overlap it; cutting
the captured graph into pieces whose parameters fill about one bucket each (in reverse order, as
DDP fills its buckets) lets bucket k's all-reduce run while the backward of piece k-1 still runs.
Sits between capture and the backend: `compile_split(gm, example_inputs, compiler, ddp)` -> callable.
FSDP2: a module whose hooks all-gather and reshard is called natively with its forward compiled.
Corresponds to torch/_dynamo/backends/distributed.py (DDPOptimizer) and Dynamo's skip rules.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from kiln import config, log
from kiln.runtime.pieces import compile_pieces, run_and_compile


def is_ddp(module: Any) -> bool:
    """Whether `module` is a DistributedDataParallel wrapper (without importing torch.distributed's
    heavy parts when the program never built one)."""
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def active_ddp_module() -> Any | None:
    """The DDP module whose forward is running now (DDP sets it around its inner module's call), or
    None; None too when `kiln.config.optimize_ddp` is off, so that graphs are not split."""
    if not config.optimize_ddp or not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._get_active_ddp_module()


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One piece of the split graph: the op nodes it holds and the parameters it reads first."""

    nodes: tuple[str, ...]
    params: tuple[str, ...]
    nbytes: int


def bucket_nodes(gm: torch.fx.GraphModule, examples: Sequence[Any], first_cap: int, cap: int) -> list[Bucket]:
    """Assign each op node to a bucket, walking the graph backwards as backward will run it.

    A parameter belongs to the bucket of its last reader in forward order (the first the backward
    reaches, so the first place its gradient can be final). A new bucket starts at the next node
    once the current one holds `cap` bytes of parameters (`first_cap` for the first, which DDP keeps
    small so the first all-reduce starts early). Buckets come back in forward order.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_bytes = {p.name: _nbytes(ex) for p, ex in zip(placeholders, examples) if _is_trainable_param(ex)}
    reversed_buckets: list[tuple[list[str], list[str], int]] = [([], [], 0)]
    counted: set[str] = set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        nodes, params, nbytes = reversed_buckets[-1]
        limit = first_cap if len(reversed_buckets) == 1 else cap
        if nodes and nbytes >= limit:
            reversed_buckets.append(([], [], 0))
            nodes, params, nbytes = reversed_buckets[-1]
        nodes.append(node.name)
        for source in node.all_input_nodes:
            if source.name in param_bytes and source.name not in counted:
                counted.add(source.name)
                params.append(source.name)
                nbytes += param_bytes[source.name]
        reversed_buckets[-1] = (nodes, params, nbytes)
    return [Bucket(tuple(reversed(nodes)), tuple(params), nbytes)
            for nodes, params, nbytes in reversed(reversed_buckets) if nodes]


def compile_split(gm: torch.fx.GraphModule, examples: Sequence[Any], compiler: Callable[..., Any],
                  ddp: Any) -> Callable[..., Any]:
    """Compile `gm` as one backend call per bucket; a graph that fits one bucket is compiled whole."""
    cap = int(ddp.bucket_bytes_cap)
    bucket_config = getattr(ddp, "_bucket_config", None)  # DDP's own record of its first bucket's size
    first_cap = int(getattr(bucket_config, "first_bucket_bytes_cap", cap))
    buckets = bucket_nodes(gm, examples, first_cap, cap)
    log.artifact("ddp", lambda: _describe(gm, buckets, first_cap, cap))
    if len(buckets) <= 1:
        return compiler(gm, list(examples))
    partition = {name: index for index, bucket in enumerate(buckets) for name in bucket.nodes}
    split = split_module(gm, gm, lambda node: partition[node.name], keep_original_order=True,
                         tuple_return=True)
    _compile_pieces(split, gm, examples, compiler)
    return split


def _compile_pieces(split: torch.fx.GraphModule, original: torch.fx.GraphModule, examples: Sequence[Any],
                    compiler: Callable[..., Any]) -> None:
    """Run the split graph on the fake examples; each piece is handed to the backend with the fake
    values that reach it, and replaced by what the backend returns."""
    from kiln.fake import mode_of

    fake_mode = mode_of([e for e in examples if isinstance(e, torch.Tensor)])
    compile_pieces(split, original, examples, fake_mode, run_and_compile(compiler))


class DDPForward:
    """`kiln.compile(DDP(model))`: DDP's own forward runs as it is (its hooks into the reducer are
    Python that capture must not trace, as Dynamo skips it); the module it wraps runs compiled.
    DDP's forward sets itself as the active DDP module around the inner call, so the capture of
    the inner forward splits at its buckets.
    """

    def __init__(self, ddp: Any, compiled_forward: Callable[..., Any]) -> None:
        self.ddp = ddp
        self.compiled_forward = compiled_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with compiled_forward_of(self.ddp.module, self.compiled_forward):
            return self.ddp.forward(*args, **kwargs)


class HookedModuleCall:
    """A module with forward hooks called at a graph break (FSDP2's all-gather and reshard hooks,
    which live in torch.distributed and are not traced): `module(*args)` runs natively, hooks and
    all, while its forward, the part capture can trace, runs compiled. Called as
    `call(module, *args, **kwargs)` by the glue; `compiled` takes the module as its first argument.
    """

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled

    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        with compiled_forward_of(module, functools.partial(self.compiled, module)):
            return module(*args, **kwargs)


class DDPModuleCall:
    """A DDP module called inside a compiled function (a training step that calls `ddp(x)`): the
    call is a graph break; DDP's forward runs natively and the module it wraps runs compiled.
    Called as `call(ddp, *args, **kwargs)`; `compiled` is the wrapped module's forward, compiled,
    taking that module as its first argument."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled

    def __call__(self, ddp: Any, *args: Any, **kwargs: Any) -> Any:
        with compiled_forward_of(ddp.module, functools.partial(self.compiled, ddp.module)):
            return ddp(*args, **kwargs)


# Swaps nest (an FSDP block inside an FSDP root) and may come from several threads: one reentrant
# lock keeps each module's swap and restore paired.
_SWAP_LOCK = threading.RLock()


@contextlib.contextmanager
def compiled_forward_of(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """For the length of one call, `module.forward` is `forward` (an instance attribute, which
    Module.__call__ reads before the class's); whatever the instance had before comes back."""
    with _SWAP_LOCK:
        own = module.__dict__.get("forward", _ABSENT)
        module.__dict__["forward"] = forward
        try:
            yield
        finally:
            if own is _ABSENT:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = own


_ABSENT = object()


def _is_trainable_param(value: Any) -> bool:
    return isinstance(value, torch.nn.Parameter) and value.requires_grad


def _nbytes(value: torch.Tensor) -> int:
    return int(value.numel()) * value.element_size()


def _describe(gm: torch.fx.GraphModule, buckets: list[Bucket], first_cap: int, cap: int) -> str:
    lines = [f"DDP split of {type(gm).__name__}: {len(buckets)} bucket(s) "
             f"(first bucket cap {first_cap} B, then {cap} B), in forward order:"]
    for index, bucket in enumerate(buckets):
        lines.append(f"  piece {index}: {len(bucket.nodes)} nodes ({bucket.nodes[0]} .. {bucket.nodes[-1]}), "
                     f"{bucket.nbytes} B of parameters: {', '.join(bucket.params) or '-'}")
    return "\n".join(lines)
