"""Kernels over tiles of outer points (kiln/lower/codegen/cpp_loops.py) against eager: a row kernel
whose rows are strided (a softmax, log_softmax, variance, logsumexp or normalization over a dim that
is not the last) runs as `tiled_rows_kernel`, a copy that reads along one dim and writes along
another (a transpose made contiguous) as `blocked_copy_kernel`. Shapes that leave a partial tile or
a partial block, NaN and infinite inputs, the half types, dynamic sizes. Each test also checks that
the tiled form was chosen (the plain row kernel is also right, only slow: 14x eager's time for a
softmax over dim 0); speed is measured by benchmarks/eager_floor.py, not here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check, compile_fn

pytestmark = pytest.mark.cpp

DEFAULT = {"atol": None, "rtol": None}  # assert_close's own tolerances for each dtype
TILED = "xt += "  # the tile loop of tiled_rows_kernel and column_kernel
BLOCKED = "yb += "  # the block loop of blocked_copy_kernel


def _x(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(shape) * scale).to(dtype)


# CI: every shape in float32, every dtype at the first
@pytest.mark.ci_slice({"shape,dim": ((37, 5), 0), "dtype": torch.float32})
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape,dim", [((37, 5), 0), ((1024, 40), 0), ((3, 7, 19), 1), ((6, 33, 2, 70), 1),
                                       ((300, 17), 0)], ids=str)
def test_softmax_and_log_softmax_over_a_strided_dim(shape: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
    x = _x(shape, dtype)
    compiled = check(lambda x: torch.softmax(x, dim), x, **DEFAULT)
    assert TILED in compiled.cpp_source
    compiled = check(lambda x: torch.log_softmax(x, dim), x, **DEFAULT)
    assert TILED in compiled.cpp_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_inf_and_fully_masked_columns_are_as_in_eager(dtype: torch.dtype) -> None:
    x = _x((40, 21), dtype)
    x[:, 1] = float("-inf")  # a whole column masked: eager's 0/0
    x[3, 2] = float("nan")
    x[7, 4] = float("inf")
    x[: 20, 5] = float("-inf")
    for fn in (lambda x: torch.softmax(x, 0), lambda x: torch.log_softmax(x, 0),
               lambda x: torch.logsumexp(x, 0), lambda x: x.amax(0)):
        check(fn, x, **DEFAULT)


def test_a_softmax_over_a_transposed_input_reads_it_in_tiles() -> None:
    # the softmax's dim is the input's strided one: x.t() of a row-major matrix, softmax over -1
    x = _x((513, 70))
    compiled = check(lambda x: torch.softmax(x.t() * 2.0, -1), x, **DEFAULT)
    assert TILED in compiled.cpp_source


@pytest.mark.parametrize("shape", [(100, 30), (2, 64, 9)], ids=str)
def test_variance_normalization_and_logsumexp_over_the_first_dims(shape: tuple[int, ...]) -> None:
    x = _x(shape)
    check(lambda x: x.var(0), x, atol=1e-4, rtol=1e-4)
    check(lambda x: (x - x.mean(0, keepdim=True)) / (x.std(0, keepdim=True) + 1e-5), x, atol=1e-4, rtol=1e-4)
    compiled = check(lambda x: torch.logsumexp(x, 0), x, **DEFAULT)
    assert TILED in compiled.cpp_source
    w = _x(shape[1:])
    compiled = check(lambda x, w: torch.softmax(x * w, 0) + w, x, w, **DEFAULT)
    assert TILED in compiled.cpp_source


def test_a_strided_softmax_with_dynamic_sizes() -> None:
    compiled = compile_fn(lambda x: torch.softmax(x, 0), _x((40, 21)), dynamic=True)
    assert TILED in compiled.cpp_source
    for shape in ((40, 21), (3, 100), (257, 5), (2, 2)):
        x = _x(shape)
        torch.testing.assert_close(compiled(x)[0], torch.softmax(x, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(1024, 1024), (33, 70), (5, 3)], ids=str)
def test_a_transpose_made_contiguous_is_copied_in_blocks(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _x(shape).to(dtype)
    blocked = min(shape) >= 32  # a side shorter than a block stays in cache as it is
    compiled = check(lambda x: x.t().contiguous(), x, atol=0, rtol=0)
    assert (BLOCKED in compiled.cpp_source) == blocked
    compiled = check(lambda x: (x.t() * 2).contiguous(), x, atol=0, rtol=0) if dtype != torch.bool else None
    assert compiled is None or (BLOCKED in compiled.cpp_source) == blocked


def test_a_permute_of_heads_and_a_batched_transpose_are_as_eager() -> None:
    x = _x((2, 40, 3, 36))
    check(lambda x: x.permute(0, 2, 3, 1).contiguous(), x, atol=0, rtol=0)
    check(lambda x: F.gelu(x.transpose(1, 3)).contiguous(), x, **DEFAULT)
    y = _x((4, 50, 33))
    compiled = check(lambda y: y.transpose(1, 2).contiguous() + 1, y, **DEFAULT)
    assert BLOCKED in compiled.cpp_source


# concatenations: the parts of a cat along the inner dim are one select chain (each part's loads
# guarded by its own mask and the masks of the parts before it), a row that copies one input of a
# stack (the mask the same along the row) is one plain loop per side


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_cats_and_stacks_along_each_dim_are_as_eager(dtype: torch.dtype) -> None:
    a, b, c = _x((5, 7)).to(dtype), _x((5, 3)).to(dtype), _x((5, 11)).to(dtype)
    compiled = check(lambda a, b, c: torch.cat([a, b, c], -1), a, b, c, atol=0, rtol=0)
    assert "[&]()" not in compiled.cpp_source.split("// kernel0")[1]  # no lambda left: GCC vectorizes it
    d, e = _x((3, 7)).to(dtype), _x((4, 7)).to(dtype)
    check(lambda a, d, e: torch.cat([a, d, e], 0), a, d, e, atol=0, rtol=0)
    check(lambda a, d: torch.stack([a, a, a]), a, d, atol=0, rtol=0)
    compiled = check(lambda p, q, r, s: torch.stack([p, q, r, s]), *(_x((6, 40)).to(dtype) for _ in range(4)),
                     atol=0, rtol=0)
    assert "} else {" in compiled.cpp_source  # a loop per input: the row's mask chosen outside it
    check(lambda a, b: torch.stack([a, b], 1), a, a.clone(), atol=0, rtol=0)


def test_cats_of_computed_parts_pads_and_dynamic_sizes_are_as_eager() -> None:
    a, b = _x((4, 9)), _x((4, 6))
    check(lambda a, b: torch.cat([a.exp(), b * 2, a[:, :3] + 1], -1), a, b, **DEFAULT)
    check(lambda a, b: torch.cat([F.pad(a, (2, 3)), b], -1).sum(-1), a, b, atol=1e-4, rtol=1e-4)
    check(lambda a: F.pad(a, (1, 1, 2, 0), value=-1.5), a, atol=0, rtol=0)
    check(lambda a, b: torch.stack([a[:, :6], b]).softmax(-1), a, b, **DEFAULT)
    compiled = compile_fn(lambda a, b: torch.cat([a, b], -1), a, b, dynamic=True)
    for n, m in ((4, 9), (3, 1), (7, 40)):
        a, b = _x((5, n)), _x((5, m))
        torch.testing.assert_close(compiled(a, b)[0], torch.cat([a, b], -1), atol=0, rtol=0)
