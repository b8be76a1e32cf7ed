"""A float16/bfloat16 reduction's result is rounded to its type where a later op of the same kernel
reads it, as eager stores it: `y - y.logsumexp(-1, keepdim=True)` subtracted the float32 log-sum
(0.03 off eager in bfloat16). The sums, means, variances, norms, log-sum-exps, (log-)softmaxes, layer
norms and cumulative sums read by a subtraction, division or product, kept (keepdim) or broadcast
(indexed with None), against eager exactly: each result is one rounding of values both compute
alike in float32. logsumexp itself rounds each of ATen's steps (x - max, exp, sum, log, + max).
The rule is in kiln/lower/lowerings/reductions.py (rounded_on_read, logsumexp)."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from .conftest import compile_fn

pytestmark = pytest.mark.cpp

Fn = Callable[[torch.Tensor], torch.Tensor]

CASES: dict[str, Fn] = {
    "sub_logsumexp_keepdim": lambda y: y - torch.logsumexp(y, -1, keepdim=True),
    "sub_logsumexp_broadcast": lambda y: y - torch.logsumexp(y, -1)[:, None],
    "logsumexp_alone": lambda y: torch.logsumexp(y, -1),
    "logsumexp_dim0_times": lambda y: y * torch.logsumexp(y, 0),
    "sub_sum": lambda y: y - y.sum(-1, keepdim=True),
    "sub_sum_broadcast": lambda y: y - y.sum(-1)[:, None],
    "mul_sum_dim0": lambda y: y * y.sum(0),
    "sub_mean": lambda y: y - y.mean(-1, keepdim=True),
    "div_mean_broadcast": lambda y: y / y.mean(-1)[:, None],
    "mul_mean_all": lambda y: y * y.mean(),
    "sub_amax": lambda y: y - y.amax(-1, keepdim=True),
    "sub_amin_broadcast": lambda y: y - y.amin(-1)[:, None],
    "div_var": lambda y: y / y.var(-1, keepdim=True),
    "mul_var_broadcast": lambda y: y * y.var(-1)[:, None],
    "div_std": lambda y: y / y.std(-1, keepdim=True),
    "div_std_unbiased_false": lambda y: y / y.std(-1, keepdim=True, unbiased=False),
    "div_norm": lambda y: y / y.norm(dim=-1, keepdim=True),
    "mul_norm1_broadcast": lambda y: y * torch.linalg.vector_norm(y, 1, -1)[:, None],
    "div_norm3": lambda y: y / torch.linalg.vector_norm(y, 3, -1, keepdim=True),
    "mul_var_mean": lambda y: torch.var_mean(y, -1, keepdim=True)[0] * torch.var_mean(y, -1, keepdim=True)[1],
    "mul_softmax": lambda y: y.softmax(-1) * y,
    "add_log_softmax": lambda y: F.log_softmax(y, -1) + y,
    "softmax_denominator_by_hand": lambda y: y.abs() / y.abs().sum(-1, keepdim=True),
    "softmax_by_hand_of_exps": lambda y: y / y.sum(-1, keepdim=True),
    "layer_norm_by_hand_centering": lambda y: y - y.mean(-1)[:, None],
    "layer_norm_by_hand_scaling": lambda y: y / y.std(-1, correction=0)[:, None],
    "rms_norm_by_hand": lambda y: y / torch.linalg.vector_norm(y, 2, -1, keepdim=True),
    "sum_dtype_kept": lambda y: y - y.sum(-1, keepdim=True, dtype=y.dtype),
    "mean_all_dims_sub": lambda y: y - y.mean((0, 1), keepdim=True),
    "sub_cumsum": lambda y: y - y.cumsum(-1),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_half_reduction_result_is_rounded_where_read(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fn = CASES[name]
    for shape in [(33, 3), (17, 16), (5, 37)]:
        y = (torch.randn(*shape) * 3).to(dtype)
        got, want = compile_fn(fn, y)(y)[0], fn(y)
        assert got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan()), (name, shape)
        bad = (got != want) & ~want.isnan()
        assert not bad.any(), (name, shape, int(bad.sum()), float((got.float() - want.float()).abs().nan_to_num().max()))


def test_float32_is_unchanged_by_the_rounding() -> None:
    """The float32 kernel holds no conversion to a half type (its code is as before)."""
    torch.manual_seed(0)
    y = torch.randn(33, 7)
    fn = CASES["sub_logsumexp_keepdim"]
    torch.testing.assert_close(compile_fn(fn, y)(y)[0], fn(y))
