"""A concatenation along the inner dim is cut into one loop per part (cpp_loops.inner_cut): each loop
copies (or computes) its part's run of the row without the chain of masks and selects the single
loop evaluated per element. Checked on the kernel source, and the values against eager over parts
that are views with offsets, transposed, broadcast, of other dtypes, empty, computed by fused
producers or consumed by fused consumers, and of symbolic sizes."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from .conftest import check, compile_fn

pytestmark = pytest.mark.cpp


def _kernel(source: str) -> str:
    return source.split("// kernel0")[1].split("#include")[0]


def test_cat_of_contiguous_rows_is_one_loop_per_part() -> None:
    parts = [torch.randn(16, 32), torch.randn(16, 8), torch.randn(16, 24)]
    c = check(lambda a, b, d: torch.cat([a, b, d], -1), *parts)
    kernel = _kernel(c.cpp_source)
    assert "?" not in kernel, kernel  # no select between the parts
    starts = re.findall(r"for \(int64_t y0 = (\d+); y0 < (\d+); y0\+\+\)", kernel)
    assert starts == [("0", "32"), ("32", "40"), ("40", "64")], kernel
    for name in ("arg0", "arg1", "arg2"):  # each part is read in its own loop
        assert kernel.count(f"{name}[") == 1, kernel


def test_cat_with_a_fused_consumer_and_producer_is_cut_too() -> None:
    a, b = torch.randn(8, 20), torch.randn(8, 12)
    c = check(lambda a, b: torch.relu(torch.cat([a.sin(), b * 2], 1)) + 1, a, b)
    kernel = _kernel(c.cpp_source)
    assert c.cpp_source.count('extern "C" void kernel') == 1
    assert len(re.findall(r"for \(int64_t y0 = ", kernel)) == 2, kernel


def test_symbolic_cat_cuts_at_run_time() -> None:
    parts = [torch.randn(5, 7), torch.randn(5, 3), torch.randn(5, 6)]
    compiled = compile_fn(lambda a, b, d: torch.cat([a, b, d], 1), *parts, dynamic=True)
    assert "kiln_cut" in _kernel(compiled.cpp_source)
    for sizes in ((5, 7, 3, 6), (9, 2, 11, 4), (3, 17, 2, 2)):
        rows, *cols = sizes
        xs = [torch.randn(rows, n) for n in cols]
        torch.testing.assert_close(compiled(*xs)[0], torch.cat(xs, 1))


@pytest.mark.ci_slice({"shape,dim": ((2, 3, 17), -1), "dtype": torch.float32})  # each dtype, each shape (-m slow: all)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.bool])
@pytest.mark.parametrize("shape,dim", [((4, 5), 1), ((4, 5), 0), ((2, 3, 17), -1), ((2, 3, 17), 1),
                                       ((1, 1, 1), 2), ((3, 64), 1)])
def test_cat_values_match_eager(dtype: torch.dtype, shape: tuple[int, ...], dim: int) -> None:
    def make(extra: int) -> torch.Tensor:
        sizes = list(shape)
        sizes[dim] += extra
        return (torch.randn(sizes) * 50).to(dtype)

    check(lambda a, b, d: torch.cat([a, b, d], dim), make(0), make(2), make(5))


def test_cat_of_views_with_offsets_matches_eager() -> None:
    base = torch.randn(12, 40)
    other = torch.randn(30, 12)
    check(lambda x: torch.cat([x[2:8, 3:10], x[1:7, ::3], x[4:10, 20:21]], 1), base)  # offsets, a stride
    check(lambda x, y: torch.cat([x[:, :12], y.t()[:, 4:16]], 0), base, other)  # a transposed part
    check(lambda x: torch.cat([x[:6], x[6:].flip(1)], 1), base)  # a flipped part
    check(lambda x, v: torch.cat([x[:, :5], v.expand(12, 3)], 1), base, torch.randn(12, 1))  # broadcast


def test_cat_with_dtype_promotion_matches_eager() -> None:
    i, f, h = torch.randint(-9, 9, (4, 6)), torch.randn(4, 3), torch.randn(4, 5).to(torch.bfloat16)
    check(lambda i, f, h: torch.cat([i, f, h], 1), i, f, h, atol=1e-2, rtol=1e-2)
    check(lambda i, f: torch.cat([f, i], -1), i, f)


def test_cat_with_empty_parts_matches_eager() -> None:
    a, b = torch.randn(4, 6), torch.randn(4, 3)
    check(lambda a, b, e: torch.cat([a, e, b], 1), a, b, torch.randn(4, 0))
    check(lambda a, b, e: torch.cat([e, a, b], 1), a, b, torch.randn(4, 0))
    check(lambda a, b, e: torch.cat([a, b, e], 1), a, b, torch.randn(4, 0))
    check(lambda a, e: torch.cat([a, e], 0), a, torch.randn(0))  # a 1-D empty part is skipped


def test_two_cats_cut_at_different_points_match_eager() -> None:
    a, b, c, d = torch.randn(6, 10), torch.randn(6, 22), torch.randn(6, 25), torch.randn(6, 7)
    compiled = check(lambda a, b, c, d: torch.cat([a, b], 1) * torch.cat([c, d], 1), a, b, c, d)
    kernel = _kernel(compiled.cpp_source)
    assert "?" not in kernel, kernel
    assert len(re.findall(r"for \(int64_t y0 = ", kernel)) == 3, kernel  # [0, 10), [10, 25), [25, 32)


def test_many_parts_and_pads_match_eager() -> None:
    xs = [torch.randn(3, n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)]
    check(lambda *xs: torch.cat(xs, 1), *xs)
    check(lambda x, y: torch.cat([F.pad(x, (2, 3)), y], 1), torch.randn(5, 4), torch.randn(5, 6))
    check(lambda x, y: F.pad(torch.cat([x, y], 1), (1, 1), value=-2.0), torch.randn(5, 4), torch.randn(5, 6))


def test_cat_along_a_flattened_inner_range_matches_eager() -> None:
    # the inner range has several dims: cut only the last one's loop
    a, b = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 7)
    check(lambda a, b: torch.cat([a, b], -1).sum(1), a, b)
    check(lambda a, b: torch.cat([a, b], -1).transpose(1, 2).contiguous(), a, b)
