"""Graphs on a device no code generator handles (meta), or holding a sparse tensor, run as ATen
calls instead of kernels.

A kernel handed a meta tensor's data pointer reads memory that does not exist, so the default
backend once crashed the process on meta inputs; the checks run in a subprocess for that reason.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from kiln.autograd import trace_aten
from kiln.lower import compile_graph


def test_meta_graph_compiles_to_aten_calls() -> None:
    gm = torch.fx.symbolic_trace(lambda a, b: (torch.relu(a * 2 + b).sum(0), a @ b.t()))
    args = (torch.randn(3, 4, device="meta"), torch.randn(3, 4, device="meta"))
    compiled = compile_graph(trace_aten(gm, args), args)
    assert compiled.kernel_count == 0 and compiled.cpp_source == ""
    assert any("meta" in hint for hint in compiled.perf_hints)
    out = compiled(*args)
    assert [(o.device.type, tuple(o.shape)) for o in out] == [("meta", (4,)), ("meta", (3, 3))]


def test_meta_inputs_under_the_default_backend_do_not_crash() -> None:
    script = textwrap.dedent("""
        import warnings
        import torch, kiln
        kiln.config.persistent_cache = False
        warnings.simplefilter("error")  # no fallback warning either: the lowering takes this path itself

        def f(a, b, i):
            return (a * 2 + b).sum(0), torch.relu(a) @ b.t(), a[i]

        a, b = torch.randn(3, 4, device="meta"), torch.randn(3, 4, device="meta")
        i = torch.zeros(2, dtype=torch.int64, device="meta")
        got, expected = kiln.compile(f)(a, b, i), f(a, b, i)
        for g, e in zip(got, expected):
            assert g.device.type == "meta" and g.shape == e.shape and g.dtype == e.dtype, (g, e)
        made_inside = kiln.compile(lambda x: torch.ones(2, 3, device="meta") * x.sum())(torch.randn(3))
        assert made_inside.device.type == "meta" and made_inside.shape == (2, 3)
        assert kiln.stats()["fallbacks"] == 0
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_sparse_inputs_under_the_default_backend_run_as_aten_calls() -> None:
    # a CSR input's graph once asked it for strides (it has none) in the AOT trace and the graph key
    script = textwrap.dedent("""
        import warnings
        import torch, kiln
        kiln.config.persistent_cache = False
        warnings.simplefilter("error", kiln.log.KilnWarning)

        def f(s, d):
            return s.to_dense().sum(0) * d + 1, (s.to_dense() @ d.unsqueeze(1)).relu()

        for dynamic in (False, True):
            kiln.reset()
            compiled = kiln.compile(f, dynamic=dynamic)
            for n in (3, 4):
                s, d = torch.eye(n).to_sparse_csr(), torch.randn(n)
                for g, e in zip(compiled(s, d), f(s, d)):
                    torch.testing.assert_close(g, e)
            assert kiln.stats()["fallbacks"] == 0
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-W", "ignore::UserWarning", "-c", script], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
