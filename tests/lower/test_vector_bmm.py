"""A batched matrix-vector product on the CPU ([B, 1, K] @ [B, K, N], [B, M, K] @ [B, K, 1], and the
outer product [B, M, 1] @ [B, 1, N]) is computed in Kiln's loops, not by ATen's bmm (one tiny GEMM per
batch): a mixture of experts' per-token expert weights (`bmm(x, w[expert])`) are read through the
gather inside the sum, never stored, and the sum over K runs vectorized across N (a column reduction,
every read contiguous). Results against eager at the lowering tests' tolerances; the structure is
checked on the schedule and the C++ (no timing here: the held-out MoE model measures it)."""
from __future__ import annotations

import pytest
import torch

from kiln.lower.schedule import format_program

from .conftest import check

pytestmark = pytest.mark.cpp


def _bmm_externs(c) -> int:
    return format_program(c.program).count("aten.bmm.default")


@pytest.mark.parametrize("shapes", [((8, 1, 64), (8, 64, 512)), ((8, 1, 512), (8, 512, 64)), ((3, 1, 7), (3, 7, 5)),
                                    ((8, 64, 32), (8, 32, 1)), ((4, 6, 1), (4, 1, 9))], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vector_bmm_is_computed_in_loops(shapes, dtype) -> None:
    a, b = (torch.randn(s, dtype=dtype) for s in shapes)
    c = check(torch.bmm, a, b, atol=1e-4, rtol=1e-5)
    assert _bmm_externs(c) == 0, format_program(c.program)


def test_gathered_expert_weights_are_read_in_the_sum_along_the_columns() -> None:
    x, w, idx = torch.randn(64, 1, 64), torch.randn(4, 64, 128), torch.randint(0, 4, (64,))
    c = check(lambda x, w, idx: torch.bmm(x, w[idx]), x, w, idx, atol=1e-4, rtol=1e-5)
    assert _bmm_externs(c) == 0 and c.kernel_count == 1, format_program(c.program)
    assert "xt += " in c.cpp_source  # the column loop: a tile of N outputs per row of K


def test_vector_product_reads_along_the_columns() -> None:
    c = check(torch.bmm, torch.randn(8, 1, 64), torch.randn(8, 64, 512), atol=1e-4, rtol=1e-5)
    assert "xt += " in c.cpp_source, c.cpp_source


def test_matrix_products_and_half_stay_aten_calls() -> None:
    c = check(torch.bmm, torch.randn(4, 8, 16), torch.randn(4, 16, 8), atol=1e-4, rtol=1e-5)
    assert _bmm_externs(c) == 1
    h = check(torch.bmm, torch.randn(4, 1, 16).half(), torch.randn(4, 16, 8).half(), atol=1e-2, rtol=1e-2)
    assert _bmm_externs(h) == 1


def test_out_of_range_expert_raises_index_error() -> None:
    """The gathered row's bounds check still runs inside the column loop (eager's text has no
    'index(): ' prefix; Kiln's gather says it for every out-of-range index, before this change too)."""
    import kiln
    x, w, idx = torch.randn(4, 1, 8), torch.randn(3, 8, 16), torch.tensor([0, 1, 3, 2])
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        kiln.compile(lambda x, w, idx: torch.bmm(x, w[idx]))(x, w, idx)


def test_a_lazy_vector_is_stored_not_recomputed_per_column() -> None:
    """The vector side of the product is read once per column of the matrix: silu(h) between an
    MoE's two products is computed once into a buffer (inlined, each sigmoid ran 128 times)."""
    h, w, idx = torch.randn(64, 1, 128), torch.randn(4, 128, 64), torch.randint(0, 4, (64,))
    c = check(lambda h, w, idx: torch.bmm(torch.nn.functional.silu(h), w[idx]), h, w, idx, atol=1e-4, rtol=1e-5)
    assert c.kernel_count == 2 and _bmm_externs(c) == 0, format_program(c.program)
    column = c.cpp_source.split("xt += ")[1]
    assert "exp" not in column.split("outer_")[0], c.cpp_source  # no sigmoid inside the column loop
