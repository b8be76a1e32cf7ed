"""Steady-state cost of symbolic shape propagation: Kiln's SymNode vs torch's own, per op.

Run as a script: `.venv/bin/python tests/symbolic/bench_symbolic.py`. Both sides run the same meta
kernels under the Python dispatcher on tensors whose sizes are SymInts; only the node behind the
SymInt differs (kiln.symbolic.SymNode over kiln's ShapeEnv, or torch.fx.experimental's, as the
oracle). Static (plain int) sizes give the floor: the cost of the meta kernels themselves. The last
column runs the same op on kiln.fake tensors with those dims dynamic (the whole fake+symbolic stack).
Numbers are the best of 5 rounds, in milliseconds per op call after a warm-up call.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher

from kiln.symbolic import ShapeEnv

OPS: dict[str, Callable[[Callable[..., torch.Tensor]], Callable[[], object]]] = {
    "matmul": lambda T: (lambda x=T("a", 64), w=T(64, 32): x @ w),
    "add_broadcast": lambda T: (lambda x=T("a", 64), b=T(64): x + b),
    "view": lambda T: (lambda x=T("a", "b", 64): x.view(-1, 64)),
    "softmax": lambda T: (lambda x=T("a", "b", 64): x.softmax(-1)),
    "layer_norm": lambda T: (lambda x=T("a", "b", 64): F.layer_norm(x, [64])),
    "cat": lambda T: (lambda x=T("a", 64), y=T("b", 64): torch.cat([x, y])),
    "conv2d": lambda T: (lambda x=T(2, 3, "a", "b"), w=T(8, 3, 3, 3): F.conv2d(x, w, padding=1)),
    "cumsum": lambda T: (lambda x=T("a", "b", 64): x.cumsum(1)),
    "sdpa": lambda T: (lambda q=T(2, 4, "a", 16): F.scaled_dot_product_attention(q, q, q)),
}
HINTS = {"a": 6, "b": 5}


def best_ms(fn: Callable[[], object], n: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e3


def kiln_maker() -> Callable[..., torch.Tensor]:
    env = ShapeEnv()
    syms = {n: env.create_symbol(h, f"L['x'].size()[{i}]") for i, (n, h) in enumerate(HINTS.items())}
    return lambda *dims: torch.empty([syms.get(d, d) for d in dims], device="meta")


def torch_maker() -> Callable[..., torch.Tensor]:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv as TorchShapeEnv

    env = TorchShapeEnv()
    syms = {}
    for n, h in HINTS.items():
        source = ConstantSource(n)
        sym = env.create_symbol(h, source, dynamic_dim=DimDynamic.DYNAMIC)
        syms[n] = env.create_symintnode(sym, hint=h, source=source)
    return lambda *dims: torch.empty([syms.get(d, d) for d in dims], device="meta")


def static_maker() -> Callable[..., torch.Tensor]:
    return lambda *dims: torch.empty([HINTS.get(d, d) for d in dims], device="meta")


def kiln_fake_op(build: Callable) -> Callable[[], object]:
    """The op on kiln.fake tensors (dims named in HINTS dynamic), the way capture runs it."""
    from kiln.fake import FakeTensorMode

    mode = FakeTensorMode(shape_env=ShapeEnv())
    count = iter(range(100))

    def make(*dims: int | str) -> torch.Tensor:
        real = torch.empty([HINTS.get(d, d) for d in dims])
        dyn = tuple(i for i, d in enumerate(dims) if isinstance(d, str))
        return mode.from_real(real, source=f"L['x{next(count)}']", dynamic_dims=dyn)

    op = build(make)

    def run() -> object:
        with mode:
            return op()
    return run


def main() -> None:
    print(f"{'op':<14}{'static':>9}{'kiln':>9}{'torch':>9}{'kiln fake':>11}   (ms per call)")
    with enable_python_dispatcher():
        for name, build in OPS.items():
            row = [best_ms(build(maker())) for maker in (static_maker, kiln_maker, torch_maker)]
            print(f"{name:<14}" + "".join(f"{v:9.3f}" for v in row), end="")
            print(f"{best_ms(kiln_fake_op(build)):11.3f}")


if __name__ == "__main__":
    main()
