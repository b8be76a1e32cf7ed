"""Accumulating scatters into float16 and bfloat16 tensors give eager's values, bit for bit.

The kernels added a float into the bfloat16 buffer's uint16 words (garbage: `index_add`,
`scatter_add`, `index_put(accumulate=True)`). ATen's CPU kernels accumulate in two ways, and each
is matched: scatter_add (and index_add where it hands over to scatter_add: the first or last dim of a
2+-d tensor, alpha 1) sums in float32 and rounds once; index_put with accumulate, index_add's own loop
and the embedding backward add element after element in the half type, rounding after each (which
loses small addends once a sum is large, so many duplicate indices tell the two apart). Checked for
both half types with 600 adds into 3 rows, fused sources, the backward of indexing, gather,
index_select and embedding (padding_idx too), the scatter_reduce/index_reduce/bincount/histc
siblings, and the Triton code generator (whose bfloat16 add is a compare-and-swap loop, also
compiled to PTX here).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

HALF = [torch.bfloat16, torch.float16]
N = 600  # adds into 3 rows: sums near 2 where the addends (< 0.02) are partly below half a bfloat16 step


def _data(dtype: torch.dtype, n: int = N):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 3, (n,), generator=g)
    src1 = (torch.rand(n, generator=g) * 0.02).to(dtype)
    src2 = (torch.rand(n, 4, generator=g) * 0.02).to(dtype)
    src3 = (torch.rand(2, n, 4, generator=g) * 0.02).to(dtype)
    return idx, src1, src2, src3


def _forward_ops(x1, x2, x3, idx, s1, s2, s3):
    n = idx.shape[0]
    return (
        x1.index_add(0, idx, s1),  # ATen's own loop: rounds after each add
        x2.index_add(0, idx, s2),  # first dim of 2-d: scatter_add, in float32
        x2.t().index_add(1, idx, s2.t()),  # last dim: scatter_add
        x3.index_add(1, idx, s3),  # a middle dim: its own loop
        x2.index_add(0, idx, s2, alpha=2),  # alpha: its own loop
        x2.index_add(0, idx, s2 * 3),  # a source computed in the kernel
        x1.scatter_add(0, idx, s1),
        (x2 * 2).scatter_add(0, idx[:, None].expand(n, 4), s2 * 3) + 1,
        x2.index_put((idx,), s2, accumulate=True),
        x2.clone().index_put_((idx, idx % 4), s2[:, 0], accumulate=True),
        x1.scatter_reduce(0, idx, s1, "sum"),
        x1.scatter_reduce(0, idx, s1, "mean"),
        x1.scatter_reduce(0, idx, s1 + 1, "prod"),
        x1.scatter_reduce(0, idx, s1, "amax", include_self=False),
        x2.index_reduce(0, idx, s2, "mean"),
        torch.bincount(idx, s1.float()),
        torch.histc(s1.float(), 5),
        # self and source computed in the kernel: eager adds them as stored, rounded to their type
        (x2 * 1.37).scatter_add(0, idx[:, None].expand(n, 4), s2 * 0.71),
        (x2 * 1.37).index_add(0, idx, s2 * 0.71),
        (x1 * 1.37).index_add(0, idx, s1 * 0.71, alpha=3),
        (x2 * 1.37).index_put((idx,), s2 * 0.71, accumulate=True),
    )


def _inputs(dtype: torch.dtype):
    return torch.ones(3, dtype=dtype), torch.ones(3, 4, dtype=dtype), torch.ones(2, 3, 4, dtype=dtype)


def _same(got, expected) -> None:
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, k
        assert torch.equal(g, e), (k, (g.float() - e.float()).abs().max().item())


def _compare(fn, *args) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # index_reduce is "in beta"
        expected = fn(*args)
        got = kiln.compile(fn)(*args)
    assert kiln.stats()["fallbacks"] == 0
    _same(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,))


def _index_backward(w, i, g):
    w = w.clone().requires_grad_()
    w[i].backward(g)
    return w.grad


def _embedding_backward(w, i, g):
    w = w.clone().requires_grad_()
    F.embedding(i, w, padding_idx=1).backward(g)
    return w.grad


def _embedding_backward_3d(w, i, g):
    w = w.clone().requires_grad_()
    F.embedding(i.view(-1, 6), w).backward(g.view(-1, 6, 4))
    return w.grad


def _gather_backward(w, i, g):
    w = w.clone().requires_grad_()
    w.gather(0, i[:, None].expand(-1, 4)).backward(g)
    return w.grad


def _index_select_backward(w, i, g):
    w = w.clone().requires_grad_()
    w.index_select(0, i).backward(g)
    return w.grad


BACKWARDS = [_index_backward, _embedding_backward, _embedding_backward_3d, _gather_backward, _index_select_backward]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_accumulating_scatters(dtype) -> None:
    idx, s1, s2, s3 = _data(dtype)
    _compare(_forward_ops, *_inputs(dtype), idx, s1, s2, s3)


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fn", BACKWARDS, ids=lambda f: f.__name__)
def test_backward_of_indexing(dtype, fn) -> None:
    idx, _, s2, _ = _data(dtype)
    _compare(fn, torch.ones(3, 4, dtype=dtype), idx, s2)


@pytest.mark.cpp
def test_many_elements_take_the_parallel_float32_path() -> None:
    # 40k adds: scatter_add's float32 sums run on threads (atomic float adds, any order), so the
    # result is compared to a float tolerance; the half-typed adds stay in ATen's order
    idx, _, s2, _ = _data(torch.bfloat16, 10_000)
    x = torch.ones(3, 4, dtype=torch.bfloat16)
    fn = lambda x, i, s: (x.scatter_add(0, i[:, None].expand(-1, 4), s), x.index_put((i,), s, accumulate=True))  # noqa: E731
    got, expected = kiln.compile(fn)(x, idx, s2), fn(x, idx, s2)
    torch.testing.assert_close(got[0], expected[0])
    assert torch.equal(got[1], expected[1])


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_triton_scatters(dtype) -> None:
    pytest.importorskip("triton")
    idx, s1, s2, s3 = _data(dtype, 200)
    with config.patch(cpu_backend="triton"):
        _compare(_forward_ops, *_inputs(dtype), idx, s1, s2, s3)
        for fn in (_index_backward, _embedding_backward):
            kiln.reset()
            _compare(fn, torch.ones(3, 4, dtype=dtype), idx, s2)


@pytest.mark.triton
def test_triton_bf16_add_compiles_for_a_gpu(tmp_path) -> None:
    """The compare-and-swap loop through Triton's real compiler down to PTX (sm_80, no GPU needed)."""
    pytest.importorskip("triton")
    from tests.lower.conftest import compile_fn

    with config.patch(cpu_backend="triton"):
        c = compile_fn(lambda x, i, s: x.index_put((i,), s, accumulate=True), torch.ones(3, 4, dtype=torch.bfloat16),
                       torch.randint(0, 3, (50,)), torch.rand(50, 4).bfloat16())
    assert "tl.atomic_cas" in c.triton_source
    kernels = tmp_path / "kernels.py"
    kernels.write_text(c.triton_source)
    signature = {"arg2": "*bf16", "arg1": "*i64", "buf0": "*bf16", "index_error": "*i32", "kiln_err": "*i64",
                 "XBLOCK": "constexpr"}
    script = textwrap.dedent(f"""
        import importlib.util, sys
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        source = ASTSource(module.kernel1, signature={signature!r}, constexprs={{"XBLOCK": 128}})
        ptx = triton.compile(source, target=GPUTarget("cuda", 80, 32)).asm["ptx"]
        print(".entry kernel1" in ptx and "atom.global" in ptx)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script, str(kernels)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.strip().endswith("True"), out.stderr[-3000:]
