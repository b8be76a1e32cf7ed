"""A graph output the program order puts late (a saved activation the min-cut partitioner returns
after the rest of the forward) joins the kernel that makes its inputs instead of a kernel of its own."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def test_softmax_output_also_read_by_a_matmul_is_stored_by_the_softmax_kernel() -> None:
    def f(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.softmax(x, -1)
        y = torch.bmm(s.expand(2, 3, 8, 8).reshape(6, 8, 8), v)
        for _ in range(5):  # more steps than the hoisting window of a buffer that is no output
            y = torch.relu(y @ w)
        return y, s

    x, v, w = torch.randn(2, 3, 8, 8), torch.randn(6, 8, 8), torch.randn(8, 8)
    c = check(f, x, v, w, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 6  # the softmax (storing s and the bmm's input) and five relus


def test_layer_norm_statistics_are_stored_by_the_layer_norm_kernel() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [16], None, None, 1e-5)
        y = out.view(24, 16)
        for _ in range(5):
            y = torch.relu(y @ w)
        return y, mean, rstd

    x, w = torch.randn(4, 6, 16), torch.randn(16, 16)
    c = check(f, x, w, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 6
