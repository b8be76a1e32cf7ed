"""The held-out torchvision-style CNNs (tests/e2e/cnn_models.py) through kiln.compile's default
backend, compared with eager: inference outputs, and for a training step the outputs and every
parameter's gradient (train-mode BatchNorm). One model and mode run by default, the rest is `-m slow`;
`python -m benchmarks.models --cnn` times them."""
from __future__ import annotations

import pytest

from benchmarks import models as bench_models
from tests.e2e.cnn_models import CNN_MODELS
from tests.e2e.real_models import assert_close_trees, eager_result, kiln_result

FAST = {("shufflenet_v2", "infer")}


def _params():
    for model in CNN_MODELS:
        for mode in ("infer", "train"):
            marks = [pytest.mark.cpp] + ([] if (model, mode) in FAST else [pytest.mark.slow])
            yield pytest.param(model, mode, marks=marks, id=f"{model}-{mode}")


@pytest.mark.parametrize("model,mode", list(_params()))
def test_cnn_matches_eager(model, mode):
    entry = CNN_MODELS[model]
    training = mode == "train"
    want, want_grads = eager_result(entry, training)
    got, got_grads = kiln_result(entry, training, "inductor")
    assert_close_trees(got, want, entry.tol, f"{model} {mode} outputs")
    if training:
        assert_close_trees(got_grads, want_grads, 1e-2, f"{model} {mode} gradients")


def test_bench_models_cnn_flag_selects_the_cnns():
    try:
        bench_models.parse_args(["--cnn", "--only", "densenet", "--modes", "infer"])
        assert bench_models._models() is CNN_MODELS
    finally:
        bench_models.parse_args([])
    assert bench_models._models() is not CNN_MODELS
