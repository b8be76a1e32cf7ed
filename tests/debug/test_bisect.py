"""kiln.debug.bisect names the stage, then the kernel, lowering or decomposition of a planted bug."""
from __future__ import annotations

import pytest
import torch

from kiln.debug.bisect import bisect
from tests.debug.conftest import inputs, program

pytestmark = pytest.mark.cpp


def test_no_bug_nothing_to_bisect(fresh_cache):
    result = bisect(program, *inputs())
    assert result.stage is None, str(result)
    assert [t.split(":")[0] for t in result.trials] == ["backend=eager", "backend=aot_eager", "backend=inductor"]
    assert "matches eager" in str(result)


def test_names_a_wrong_lowering(planted):
    planted("wrong_lowering")
    result = bisect(program, *inputs())
    assert (result.stage, result.subsystem, result.culprit) == ("lowering", "lowering", "aten.mul.Tensor"), str(result)
    assert "mul" in result.nodes
    assert 'extern "C" void kernel' in result.kernel_source
    # the kernel shown is the one that computes the multiplication
    assert "mul" in result.kernel_nodes


def test_names_a_decomposition_that_drops_a_term(planted):
    planted("dropped_term")
    result = bisect(program, *inputs())
    assert (result.subsystem, result.culprit) == ("decomposition", "aten.addcmul.default"), str(result)
    assert result.nodes == ["addcmul"]
    assert "kernel" in result.kernel_source


def test_names_a_fusion_that_breaks_a_reduction(planted):
    planted("broken_fusion")
    result = bisect(program, *inputs())
    assert result.subsystem == "fusion", str(result)
    assert result.culprit.startswith("graph 0 kernel"), str(result)
    assert {"softmax", "sum_1"} <= set(result.nodes)
    assert result.kernel_source.startswith(f"// {result.culprit.split()[-1]}: fused from")


def test_training_run_compares_gradients(planted):
    planted("wrong_lowering")
    x, w = inputs()
    w.requires_grad_(True)

    def loss(x, w):
        return (x + torch.sin(w)).sum(-1)  # no multiplication forward; the backward of sin has one

    result = bisect(loss, x, w)
    assert result.stage == "lowering", str(result)
    assert "gradient" in result.failure
    assert result.culprit == "aten.mul.Tensor"


def test_eager_exception_is_not_a_failure(fresh_cache):
    def bad(x):
        return x @ torch.ones(3, 3)  # wrong sizes: eager raises, so must compiled, the same way

    result = bisect(bad, torch.ones(2, 2))
    assert result.stage is None, str(result)
