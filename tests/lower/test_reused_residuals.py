"""A value read by a LayerNorm (or softmax, var_mean: a kernel that reads its input in several passes
per row) and by another node is stored once when it reads two places or more, and every pass and
every other user reads it back: inlined, each pass of each reader recomputed it (an MLP-Mixer's
residual stream x + mlp(norm(x)^T)^T + ... was recomputed whole, three stride-64 loads per element,
by all three passes of every later LayerNorm). Its results stay eager's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.lower.ir import Load, walk
from kiln.lower.schedule import Kernel

from .conftest import check

pytestmark = pytest.mark.cpp


def _loads(c, arg: int) -> int:  # type: ignore[no-untyped-def]
    """How many of the kernels' loop nodes (each reduction pass, each stored value) read input `arg`."""
    nodes = [n for s in c.program.steps if isinstance(s, Kernel) for n in s.nodes]
    return sum(any(isinstance(v, Load) and v.buffer == f"arg{arg}" for v in walk(n.body)) for n in nodes)


def mixer_residuals(x, y1, y2, y3, w, b):  # type: ignore[no-untyped-def]
    d = x.shape[-1]
    h1 = x + y1.transpose(1, 2)
    a = F.layer_norm(h1, (d,), w, b)
    h2 = h1 + y2
    c = F.layer_norm(h2, (d,), w, b)
    h3 = h2 + y3.transpose(1, 2)
    return a, c, F.layer_norm(h3, (d,), w, b), h3 * 0.5


def _mixer_inputs(shape, dtype):  # type: ignore[no-untyped-def]
    b, n, d = shape
    return (torch.randn(b, n, d, dtype=dtype), torch.randn(b, d, n, dtype=dtype), torch.randn(b, n, d, dtype=dtype),
            torch.randn(b, d, n, dtype=dtype), torch.randn(d, dtype=dtype), torch.randn(d, dtype=dtype))


def test_a_residual_chain_read_by_layer_norms_is_computed_once() -> None:
    c = check(mixer_residuals, *_mixer_inputs((2, 64, 48), torch.float32), atol=1e-5, rtol=1e-5)
    # x, y1, y2 and y3 each read by one node: inlined, by every pass of every later LayerNorm
    assert [_loads(c, i) for i in range(4)] == [1, 1, 1, 1], c.cpp_source


def test_a_value_read_by_a_softmax_and_another_node_is_computed_once() -> None:
    def fn(x, y):  # type: ignore[no-untyped-def]
        h = x + y.t()
        return h.softmax(-1), h * 2

    c = check(fn, torch.randn(40, 24), torch.randn(24, 40))
    assert _loads(c, 1) == 1, c.cpp_source


def test_a_value_read_by_var_mean_and_another_node_is_computed_once() -> None:
    def fn(x, y):  # type: ignore[no-untyped-def]
        h = x * y
        v, m = torch.var_mean(h, -1, keepdim=True)
        return (h - m) / (v + 1e-5), v

    c = check(fn, torch.randn(33, 70), torch.randn(33, 70), atol=1e-4, rtol=1e-4)
    assert _loads(c, 0) == 1 and _loads(c, 1) == 1, c.cpp_source


@pytest.mark.parametrize("shape", [(2, 32, 8, 8), (3, 12, 5, 7)], ids=["even", "odd"])
def test_a_value_grouped_by_a_reshape_for_var_mean_is_computed_once(shape: tuple) -> None:
    # a GroupNorm's statistics: var_mean reads the value through a reshape into groups
    def fn(x, y):  # type: ignore[no-untyped-def]
        h = x + y
        v, m = torch.var_mean(h.reshape(h.shape[0], 4, -1), -1, keepdim=True)
        return v, m, torch.sigmoid(h) * 2

    c = check(fn, torch.randn(shape), torch.randn(shape), atol=1e-5, rtol=1e-5)
    assert _loads(c, 0) == 1 and _loads(c, 1) == 1, c.cpp_source


@pytest.mark.parametrize("op", ["layer_norm", "softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(4, 64, 64), (2, 17, 33), (1, 130, 9)], ids=["square", "odd", "short_rows"])
def test_a_row_op_over_a_transposed_residual_reads_it_once(op: str, shape: tuple) -> None:
    # read once per element into a row in cache, not with a stride of a whole row by every pass
    b, n, d = shape
    ops = {"layer_norm": lambda h: F.layer_norm(h, (d,)), "softmax": lambda h: h.softmax(-1),
           "log_softmax": lambda h: h.log_softmax(-1)}

    def fn(x, y):  # type: ignore[no-untyped-def]
        return ops[op](x + y.transpose(1, 2))

    c = check(fn, torch.randn(b, n, d), torch.randn(b, d, n), atol=1e-5, rtol=1e-5)
    assert _loads(c, 1) == 1 and c.kernel_count == 1, c.cpp_source


def test_a_row_plus_a_broadcast_bias_is_recomputed_not_stored() -> None:
    # the bias stays in cache: storing x + bias would add a store and save no read of memory
    def fn(x, bias, w, b):  # type: ignore[no-untyped-def]
        h = x + bias
        return F.layer_norm(h, (64,), w, b), h * 2

    c = check(fn, torch.randn(32, 64), torch.randn(64), torch.randn(64), torch.randn(64))
    assert _loads(c, 0) > 1, c.cpp_source  # by the LayerNorm's passes and by h * 2, not by one stored node


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 2e-5, "rtol": 2e-5}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 64, 48), (1, 17, 33), (3, 5, 130)], ids=["mixer", "odd", "long_rows"])
@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_residual_layer_norms_match_eager(dtype: torch.dtype, shape: tuple, training: bool) -> None:
    kiln.reset()
    inputs = _mixer_inputs(shape, dtype)
    eager_in = [t.clone().requires_grad_(training) for t in inputs]
    kiln_in = [t.clone().requires_grad_(training) for t in inputs]
    want = mixer_residuals(*eager_in)
    got = kiln.compile(mixer_residuals)(*kiln_in)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, **_tol(dtype))
    if training:
        seed = [torch.randn_like(e) for e in want]
        torch.autograd.backward(want, seed)
        torch.autograd.backward(got, seed)
        for g, e in zip(kiln_in, eager_in):
            # bfloat16: a weight's gradient sums rows rounded to 8 bits, in another order than eager's
            scale = float(e.grad.float().abs().max())
            atol, rtol = (2e-2 * scale, 2e-2) if dtype == torch.bfloat16 else (1e-4, 1e-4)
            torch.testing.assert_close(g.grad, e.grad, atol=atol, rtol=rtol)
