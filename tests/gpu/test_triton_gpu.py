"""The Triton code generator on real CUDA tensors (compiled kernels, not the interpreter): the fusion
cases and an OpInfo slice against eager on the GPU. Needs a GPU (skipped without one)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CASES = {
    "pointwise": (lambda x, y: ((x.sin() + y.cos()) * x).relu() + 1, [(64, 33), (64, 33)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(37, 129)]),
    "long_softmax": (lambda x: torch.softmax(x, -1), [(5, 3000)]),
    "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (48,), w, b)), [(16, 48), (48,), (48,)]),
    "reductions": (lambda x: (x.sum(0), x.amax(-1), x.argmax(-1), x.cumsum(1)), [(33, 700)]),
    "gather": (lambda x, i: x[i] * 2, [(50, 8), "index"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_on_cuda_match_eager(name: str, dtype: torch.dtype) -> None:
    fn, shapes = CASES[name]
    args = [torch.randint(0, 50, (7,), device="cuda") if s == "index" else
            torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    compiled = kiln.compile(fn)
    got, expected = compiled(*args), fn(*args)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(g, e, **tol)


def test_training_step_on_cuda_matches_eager() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(16, 32, device="cuda")
    compiled = kiln.compile(model)
    compiled(x).square().mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-4)



def test_speed_against_torch_compile_both_modes() -> None:
    """The GPU figures `make gpu-check` reports: per fused case, Kiln and torch.compile per call, in
    the default mode and reduce-overhead (results checked against eager first)."""
    import time

    def per_call(fn, args) -> float:
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            fn(*args)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / 50

    rows = []
    for name, (fn, shapes) in sorted(CASES.items()):
        args = [torch.randint(0, 50, (7,), device="cuda") if s == "index" else
                torch.randn(tuple(d * 8 for d in s), device="cuda") for s in shapes]
        if name == "layer_norm_gelu":
            args = [torch.randn(4096, 48, device="cuda"), torch.randn(48, device="cuda"), torch.randn(48, device="cuda")]
        if name == "gather":
            args = [torch.randn(400, 64, device="cuda"), torch.randint(0, 400, (7,), device="cuda")]
        eager = per_call(fn, args)
        times = {}
        for mode in (None, "reduce-overhead"):
            k = kiln.compile(fn, mode=mode)
            t = torch.compile(fn, mode=mode)
            got, expected = k(*args), fn(*args)
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expected if isinstance(expected, tuple) else (expected,)):
                torch.testing.assert_close(g, e, atol=1e-3, rtol=1e-3)
            times[mode] = (per_call(k, args), per_call(t, args))
        rows.append(f"{name:16s} eager {eager * 1e6:8.1f} us | default: kiln {times[None][0] * 1e6:8.1f} "
                    f"torch {times[None][1] * 1e6:8.1f} | reduce-overhead: kiln {times['reduce-overhead'][0] * 1e6:8.1f} "
                    f"torch {times['reduce-overhead'][1] * 1e6:8.1f}")
    print("\n" + "\n".join(rows))
