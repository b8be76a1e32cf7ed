"""A blocked copy (a kernel that reads along its last outer dim and writes along its last inner
one) whose body calls a vector math function computes each square along the loads' contiguous dim
into a tile, then copies the tile out: with strided loads GCC left the loop scalar and each element
ran a whole libmvec call (Mamba's softplus of a transposed dt, 5x slower than staged)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _body(compiled) -> str:
    return compiled.cpp_source.split("// kernel0")[1]


def _transposed(dtype: torch.dtype, shape=(3, 40, 96)) -> torch.Tensor:
    x = torch.randn(*shape, dtype=dtype) * 10
    x.view(-1)[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 25.0], dtype=dtype)
    return x


CASES = {
    "softplus": lambda x, b: F.softplus(x.transpose(1, 2).contiguous() + b[:, None]),
    "log_sin": lambda x, b: (torch.sin(x.transpose(1, 2))
                             * torch.log(x.transpose(1, 2).abs() + b[:, None].abs())).contiguous(),
    "two_outputs": lambda x, b: (torch.tanh(x.transpose(1, 2) + b[:, None]).contiguous(),
                                 torch.atan(x.transpose(1, 2)).contiguous()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(CASES))
def test_math_over_a_transposed_input_is_staged_and_matches_eager(name, dtype) -> None:
    x, b = _transposed(dtype), torch.randn(96, dtype=dtype)
    c = check(CASES[name], x, b)
    assert "tile_" in _body(c) and "xb += 32" in _body(c)


@pytest.mark.parametrize("shape", [(2, 32, 32), (1, 33, 65), (2, 64, 100)], ids=["square", "ragged", "wide"])
def test_staged_edges(shape) -> None:
    x, b = _transposed(torch.float32, shape), torch.randn(shape[2])
    check(CASES["softplus"], x, b)


def test_a_plain_transpose_is_not_staged() -> None:
    c = check(lambda x, b: (x.transpose(1, 2) + b[:, None]).contiguous(), _transposed(torch.float32), torch.randn(96))
    assert "xb += 32" in _body(c) and "tile_" not in _body(c)


def test_a_half_output_is_not_staged() -> None:
    x, b = _transposed(torch.float32), torch.randn(96)
    c = check(lambda x, b: torch.log1p(x.transpose(1, 2).abs() + b[:, None]).half(), x, b, atol=1e-3, rtol=1e-3)
    assert "tile_" not in _body(c)
