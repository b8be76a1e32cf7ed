"""Per-op cost of kiln.fake against torch's own FakeTensorMode (run by hand; not a test).

`python tests/fake/bench_fake.py` prints, for a few ops and one model forward+backward, the
steady-state time per call under each mode (the op cache warm) and the first call (cache cold).
Times are CPU time of this process (time.process_time), steadier than wall time on a shared machine.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode as TorchFakeTensorMode

from kiln.fake import FakeTensorMode, cache


def _cases():
    def setup():
        return {
            "a": torch.randn(64, 64), "b": torch.randn(64, 64),
            "img": torch.randn(8, 16, 32, 32), "conv": nn.Conv2d(16, 32, 3),
            "layer": nn.TransformerEncoderLayer(64, 4, 128, batch_first=True),
            "seq": torch.randn(4, 16, 64),
        }

    ops = {
        "matmul": lambda e: e["a"] @ e["b"],
        "add": lambda e: e["a"] + e["b"],
        "slice": lambda e: e["a"][1:, ::2],
        "view": lambda e: e["a"].view(-1),
        "layer_norm": lambda e: F.layer_norm(e["a"], (64,)),
        "conv2d": lambda e: e["conv"](e["img"]),
        "softmax": lambda e: e["a"].softmax(-1),
        "transformer_fwd_bwd": lambda e: e["layer"](e["seq"]).sum().backward(),
    }
    return setup, ops


def measure(mode_factory, n: int = 200) -> dict[str, tuple[float, float]]:
    setup, ops = _cases()
    mode = mode_factory()
    results = {}
    with mode:
        env = setup()
        for name, fn in ops.items():
            cache.clear()
            t0 = time.process_time()
            fn(env)
            first = time.process_time() - t0
            reps = n if name != "transformer_fwd_bwd" else max(n // 20, 3)
            t0 = time.process_time()
            for _ in range(reps):
                fn(env)
            results[name] = (first * 1e6, (time.process_time() - t0) / reps * 1e6)
    return results


def main() -> None:
    ours = measure(FakeTensorMode)
    theirs = measure(TorchFakeTensorMode)
    print(f"{'op':22} {'kiln first':>11} {'kiln steady':>12} {'torch first':>12} {'torch steady':>13}  (us)")
    for name in ours:
        (f1, s1), (f2, s2) = ours[name], theirs[name]
        print(f"{name:22} {f1:11.0f} {s1:12.0f} {f2:12.0f} {s2:13.0f}")


if __name__ == "__main__":
    main()
