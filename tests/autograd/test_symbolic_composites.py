"""Composite ops whose Python decomposition (taken under symbolic sizes) differs from eager's C++,
compiled with dynamic=True against eager (kiln.fake.composites).

nn.LSTM, with and without autocast: result dtypes, values and gradients for several layouts
(layers, directions, biases, batch_first), two batch sizes through one compiled graph.

Found by the grad-modes sweep (tests/runtime/test_grad_modes_x_externs.py): under symbolic sizes
the trace's Python dispatcher took torch._decomp's LSTM, which runs oneDNN for inference only and
otherwise unrolls the cells, where eager runs oneDNN's mkldnn_rnn_layer; the unrolled cells miss
autocast's cast of the hidden state, so an LSTM under autocast with an input requiring grad gave
float32 where eager gives bfloat16.

matmul of every rank pairing, made under no_grad: whether the result is an autograd view is
eager's, so an in-place op on it later with grad on runs (or raises) as eager's. Torch's Python
matmul ends in squeeze/view where eager's ends in squeeze_/_unsafe_view: the compiled result was a
view, and `r.add_(1)` with grad on raised "a view ... created in no_grad mode".
"""
from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.fake.composites import python_dispatcher

LAYOUTS: dict[str, dict[str, Any]] = {
    "one_layer_batch_first": dict(num_layers=1, batch_first=True),
    "two_layers_bidirectional": dict(num_layers=2, bidirectional=True),
    "no_biases_time_major": dict(num_layers=1, bias=False),
}


def _run(model: nn.LSTM, x: torch.Tensor, autocast: bool, fn: Any) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
        out, (h, c) = fn(x)
    (out.float().square().sum() + h.float().sum() + c.float().sum()).backward()
    return [out.detach(), h.detach(), c.detach(), x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.cpp
@pytest.mark.parametrize("autocast", [True, False], ids=["autocast_bf16", "float32"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dynamic_lstm_matches_eager(layout: str, autocast: bool) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = nn.LSTM(4, 6, **LAYOUTS[layout])
    compiled = kiln.compile(model, dynamic=True)
    for batch in (3, 5):
        x = torch.randn(batch, 7, 4)
        try:
            expected = _run(model, x, autocast, model)
        except RuntimeError as eager_error:
            # oneDNN has no bfloat16 LSTM on a CPU without AVX-512 (eager raises there): the compiled
            # model, which runs the same mkldnn_rnn_layer, raises eager's error
            with pytest.raises(RuntimeError, match=re.escape(str(eager_error).splitlines()[0][:80])):
                _run(model, x, autocast, compiled)
            continue
        got = _run(model, x, autocast, compiled)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            scale = max(1.0, e.float().abs().max().item())
            tol = 2e-2 * scale if autocast else 1e-4 * scale
            torch.testing.assert_close(g.float(), e.float(), rtol=tol, atol=tol)
    assert kiln.stats()["fallbacks"] == 0


def test_python_dispatcher_restores_torchs_lstm_kernels() -> None:
    """The oneDNN choice is Kiln's only inside its traces: torch's table is as before on exit,
    an exception included."""
    op = torch.ops.aten.lstm.input
    before = dict(op.py_kernels)
    with pytest.raises(RuntimeError, match="inside"):
        with python_dispatcher():
            assert op.py_kernels != before
            raise RuntimeError("inside")
    assert op.py_kernels == before


MATMUL_SHAPES = {
    "1d_2d": ((4,), (4, 3)),
    "2d_1d": ((3, 4), (4,)),
    "3d_1d_folded": ((2, 3, 4), (4,)),
    "1d_3d_broadcast": ((4,), (2, 4, 3)),
    "2d_3d_folded_transposed": ((5, 4), (2, 4, 3)),
    "3d_3d_broadcast": ((1, 3, 4), (2, 4, 5)),
    "4d_3d_broadcast": ((2, 1, 3, 4), (3, 4, 2)),
}


@pytest.mark.cpp
@pytest.mark.parametrize("shapes", list(MATMUL_SHAPES))
def test_dynamic_matmul_under_no_grad_views_as_eager(shapes: str) -> None:
    kiln.reset()
    torch.manual_seed(0)
    a_shape, b_shape = MATMUL_SHAPES[shapes]
    a, b = torch.randn(a_shape), torch.randn(b_shape, requires_grad=True)
    compiled = kiln.compile(lambda x, y: x @ y, dynamic=True)
    results = []
    for fn in (lambda x, y: x @ y, compiled):
        with torch.no_grad():
            r = fn(a, b)
        try:
            r.add_(1)  # grad on: eager refuses this on a view made under no_grad
            outcome = "ran"
        except RuntimeError as e:
            outcome = str(e).split(":")[0]
        results.append((r._is_view(), r.requires_grad, outcome, r.detach().clone()))
    (e_view, e_grad, e_outcome, e_value), (g_view, g_grad, g_outcome, g_value) = results
    assert (g_view, g_grad, g_outcome) == (e_view, e_grad, e_outcome)
    torch.testing.assert_close(g_value, e_value)
    assert kiln.stats()["fallbacks"] == 0
