"""OpInfo backward sweep through backend "inductor" (AOT autograd + compile_graph): a CI slice, the rest @slow.

Run `python tests/lower/opinfo_backward_sweep.py` for the full table and the pass rate.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from opinfo_backward_sweep import check_op_backward, summarize  # noqa: E402
from opinfo_sweep import op_db  # noqa: E402

# Common differentiable ops; dropout is left out (random).
CI_SLICE = [
    "matmul", "nn.functional.linear", "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.gelu",
    "nn.functional.silu", "tanh", "sigmoid", "exp", "log", "pow", "div.no_rounding_mode", "mul", "add", "sub",
    "sum", "mean", "var", "amax", "where", "cat", "stack", "transpose", "permute", "view", "reshape", "expand",
    "select", "index_select", "gather", "nn.functional.embedding", "masked_fill", "clamp", "nn.functional.relu",
]


@pytest.mark.cpp
@pytest.mark.parametrize("name", CI_SLICE)
def test_opinfo_backward_slice(name: str) -> None:
    result = check_op_backward(name, opt_level="-O1")
    assert result == "pass", result


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_sweep_catches_wrong_gradients(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is live: skewing the compiled side's cotangent must make the check fail."""
    import opinfo_backward_sweep as sweep

    real = sweep._cotangent_loss
    calls = []

    def skewed(outputs, weights):  # eager's loss is built first, the compiled one second
        calls.append(1)
        return real(outputs, weights) * (1.0 if len(calls) == 1 else 1.01)

    monkeypatch.setattr(sweep, "_cotangent_loss", skewed)
    assert sweep.check_op_backward("mul", dtype=dtype, opt_level="-O1").startswith("fail: grad")


@pytest.mark.cpp
@pytest.mark.slow
def test_opinfo_backward_full_sweep() -> None:
    results = {n: check_op_backward(n, opt_level="-O1") for n in sorted(op_db())}
    print(summarize(results))
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    passed = sum(r == "pass" for r in tried.values())
    assert passed / len(tried) > 0.9, {n: r for n, r in tried.items() if r != "pass"}
