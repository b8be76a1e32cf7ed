"""mode="reduce-overhead" on a machine without a GPU: accepted, says why it records nothing, and
computes what eager computes. The recording itself is covered by tests/gpu/test_cudagraphs.py."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln import log
from kiln.runtime import cudagraphs


def test_reduce_overhead_on_cpu_logs_why_and_matches_eager(caplog: pytest.LogCaptureFixture) -> None:
    log.configure("cudagraphs")
    try:
        with caplog.at_level(logging.INFO):
            f = kiln.compile(lambda x: (x.sin() * 2).sum(), mode="reduce-overhead")
            x = torch.randn(8, requires_grad=True)
            y = f(x)
            y.backward()
    finally:
        log.configure(None)  # back to what KILN_LOGS says
    torch.testing.assert_close(y, (x.sin() * 2).sum())
    torch.testing.assert_close(x.grad, 2 * x.cos())
    assert "records CUDA graphs only for CUDA tensors" in caplog.text


def test_cpu_tensors_are_not_recorded() -> None:
    g = cudagraphs.CudaGraphed(lambda x: (x + 1,), name="probe")
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(g(x)[0], x + 1)
    assert g.skipped is not None and "CPU tensors" in g.skipped
    assert g.recordings == {} and g.replays == 0


def test_signature_tells_shapes_strides_and_ints_apart() -> None:
    a = torch.randn(4, 6)
    keys = {cudagraphs._signature(args) for args in [(a,), (a.t(),), (a[:2],), (a, 3), (a, 4)]}
    assert len(keys) == 5
    assert cudagraphs._signature((a,)) == cudagraphs._signature((torch.randn(4, 6),))
