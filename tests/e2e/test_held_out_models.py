"""Held-out transformers models (tests/e2e/held_out_models.py: families outside the tuned corpus)
through kiln.compile(backend="eager"), compared with eager, and kiln.explain's counts compared with
torch._dynamo.explain's on the same call, as tests/e2e/test_real_models.py does for the corpus:

- test_held_out_matches_eager[model-mode]: outputs (and, for "train", every parameter's gradient)
  equal eager's.
- test_held_out_graph_counts[model-mode]: no frame falls back to eager as a whole, Kiln captures a
  graph where torch.compile does, never more graphs or breaks than torch.compile, and its graphs
  hold at least half of torch.compile's ops.

A fast slice runs by default; the rest is `-m slow`. Known gaps are xfail(strict=True) with their
cause. Needs `pip install transformers` (skipped without it).
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from held_out_models import HELD_OUT  # noqa: E402  (after the importorskip: it imports transformers)
from real_models import assert_close_trees, eager_result, kiln_counts, kiln_result, torch_counts  # noqa: E402

MODES = ("infer", "train")
INFER_ONLY = {"detr", "yolos"}  # their losses match boxes with scipy's Hungarian solver
FAST = {("gpt_bigcode", "infer"), ("deit", "train")}

# (test, model, mode) -> reason
XFAIL: dict[tuple[str, str, str], str] = {}


def _params(test: str):
    for model in HELD_OUT:
        for mode in MODES:
            if mode == "train" and model in INFER_ONLY:
                continue
            marks = [] if (model, mode) in FAST else [pytest.mark.slow]
            if (test, model, mode) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[test, model, mode]))
            yield pytest.param(model, mode, marks=marks, id=f"{model}-{mode}")


@pytest.mark.parametrize("model,mode", list(_params("match")))
def test_held_out_matches_eager(model: str, mode: str) -> None:
    entry = HELD_OUT[model]
    training = mode == "train"
    want_out, want_grads = eager_result(entry, training)
    got_out, got_grads = kiln_result(entry, training, "eager")
    assert_close_trees(got_out, want_out, entry.tol, f"{model} {mode} outputs")
    if training:
        assert_close_trees(got_grads, want_grads, entry.tol, f"{model} grads")


@pytest.mark.parametrize("model,mode", list(_params("counts")))
def test_held_out_graph_counts(model: str, mode: str) -> None:
    entry = HELD_OUT[model]
    training = mode == "train"
    torch_graphs, torch_breaks, torch_explained = torch_counts(entry, training)
    graphs, breaks, explained = kiln_counts(entry, training)
    fallbacks = [f for f in explained.fallbacks if "no tensor ops were traced" not in f.reason]
    said = f"kiln {graphs} graphs / {breaks} breaks, torch.compile {torch_graphs} / {torch_breaks}\n{explained}"
    assert not fallbacks, "frames ran eagerly as a whole: " + said
    assert (graphs >= 1) == (torch_graphs >= 1), said
    assert graphs <= torch_graphs and breaks <= torch_breaks, said
    assert explained.op_count * 2 >= torch_explained.op_count, (
        f"kiln's graphs hold {explained.op_count} ops, torch.compile's {torch_explained.op_count}: " + said)


def test_held_out_models_are_outside_the_corpus() -> None:
    from real_models import MODELS

    assert not set(HELD_OUT) & set(MODELS)
    assert len(HELD_OUT) >= 30
