"""A first call imports only what it uses: no torch.distributed.tensor, and no sympy from Kiln's
shape environment while every size is static.

Each case runs in a fresh process (an import, once made, stays). torch.distributed.tensor (about
0.4 s) came with the first meta kernel that read a fake's device from C++ (`x.to(dtype)` inside a
Python decomposition: GELU, mse_loss's backward): torch checks whether a tensor subclass is a
DTensor before its __torch_dispatch__ runs, and that check imports the package. Sympy came with
every capture's ShapeEnv, even where no size is symbolic. Only Kiln's side of sympy is tested: torch
imports it too, in most of its Python meta kernels (type promotion in torch._prims_common, torch._check
through torch.fx.experimental.symbolic_shapes: `x + x`, relu, linear), and AOT autograd and the
lowering use it, so the sympy cases capture views and slices only (C++ meta kernels), backend="eager".
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import sys, warnings
import torch
import torch.nn.functional as F
import kiln
warnings.simplefilter("error")  # a fallback to eager warns
torch.manual_seed(0)


def same(a, b):  # torch.testing.assert_close imports torch.distributed.tensor (to unwrap DTensors)
    assert a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)
"""

EPILOGUE = """
assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["compiles"] >= 1, kiln.stats()
print(sorted(m for m in WATCH if m in sys.modules))
"""

# name: (what must stay unimported, the program)
CASES = {
    # the inductor training step of an MLP (benchmarks/mlp_training.py's shape): forward with GELU
    # and mse_loss, the compiled backward
    "inductor_training": ("torch.distributed.tensor", """
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        x, t = torch.randn(8, 16), torch.randn(8, 16)
        step = kiln.compile(lambda x, t: F.mse_loss(m(x), t))
        loss = step(x, t)
        loss.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        F.mse_loss(m(x), t).backward()
        for g, p in zip(grads, m.parameters()):
            same(g, p.grad)
    """),
    # a dtype conversion in the user's code and a decomposition's upcast (GELU on bfloat16)
    "aot_eager_upcast": ("torch.distributed.tensor", """
        fn = kiln.compile(lambda x: F.gelu(x.to(torch.bfloat16)).to(torch.float32) * 2, backend="aot_eager")
        x = torch.randn(4, 8, requires_grad=True)
        out = fn(x)
        out.sum().backward()
        same(out, F.gelu(x.detach().to(torch.bfloat16)).to(torch.float32) * 2)
    """),
    # capture only: sizes read as Python ints, formatted, used in arithmetic, slices and views
    "eager_views": ("sympy", """
        def f(x):
            n, k = x.shape
            label = f"{n}x{k}"
            return x.reshape(k, n)[: len(label) - 1], x[: n // 2].t()
        x = torch.randn(6, 4)
        for got, want in zip(kiln.compile(f, backend="eager")(x), f(x)):
            same(got, want)
    """),
    # kiln.explain captures and records guards; with static sizes no symbol, so no sympy
    "explain": ("sympy", """
        def f(x):
            return x[: x.shape[0] // 2].view(-1)
        report = kiln.explain(f)(torch.randn(6, 2))
        assert report.graph_count == 1, report
        x = torch.randn(6, 2)
        same(kiln.compile(f, backend="eager")(x), f(x))
    """),
}


def _run(name: str) -> subprocess.CompletedProcess:
    watched, body = CASES[name]
    code = PRELUDE + f"WATCH = [{watched!r}]\n" + textwrap.dedent(body) + EPILOGUE
    env = {**os.environ, "KILN_PERSISTENT_CACHE": "0"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.cpp
@pytest.mark.parametrize("name", ["inductor_training"])
def test_a_compiled_training_step_leaves_dtensor_unimported(name: str) -> None:
    done = _run(name)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-3000:])


@pytest.mark.parametrize("name", ["aot_eager_upcast", "eager_views", "explain"])
def test_a_static_capture_imports_neither(name: str) -> None:
    done = _run(name)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-3000:])


def test_a_dynamic_capture_still_makes_its_symbols() -> None:
    """The shape environment made on demand is the one the symbols and guards come from."""
    code = PRELUDE + textwrap.dedent("""
        fn = kiln.compile(lambda x: x * x.shape[0], backend="eager", dynamic=True)
        for n in (3, 5, 7):
            x = torch.randn(n)
            same(fn(x), x * n)
        assert kiln.stats()["compiles"] == 1, kiln.stats()
        assert "sympy" in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KILN_PERSISTENT_CACHE": "0"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout, done.stderr[-3000:])
