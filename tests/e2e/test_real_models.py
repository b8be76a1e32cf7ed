"""End-to-end on real models: small `transformers` models (built from configs, random weights, no
hub download) through kiln.compile with each backend, compared with eager, and kiln.explain's graph
counts compared with torch._dynamo.explain's on the same call.

- test_matches_eager[backend-model-mode] (backend "native": inductor on native wrappers): "infer" runs one forward under torch.no_grad in eval
  mode and compares the outputs; "train" runs one forward in train mode (dropout off), backward on
  the loss, and compares the outputs and every parameter's gradient.
- test_graph_counts[model-mode]: Kiln must capture at least one graph where torch.compile does,
  never more graphs than torch.compile, no frame may fall back to eager as a whole, and its graphs
  must hold at least half of torch.compile's ops (equal graph counts alone once hid a model whose
  whole body ran uncompiled, with only the 2-op head in a graph).

Failures whose root cause in Kiln is known are xfail(strict=True) with that cause as the reason:
when the fix lands the case XPASSes, the run goes red, and the mark must be removed. A fast slice
runs by default; the rest is `-m slow`. Needs `pip install transformers` (skipped without it).
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import real_models  # noqa: E402  (after the importorskip: it imports transformers)
from real_models import MODELS, assert_close_trees, eager_result, kiln_counts, kiln_result, torch_counts  # noqa: E402

# "native": inductor with every CPU graph on its native wrapper from the first call (hot graphs tier
# up to it by default; kiln.config.cpu_wrapper), compared with eager like the rest
BACKENDS = ("eager", "aot_eager", "inductor", "native")
MODES = ("infer", "train")

# Runs by default (a few seconds each on a shared CPU); everything else is marked slow.
FAST_MATCH = {("eager", "llama", "infer"), ("aot_eager", "llama", "train"), ("eager", "clip", "infer"),
              ("native", "gpt2", "train"), ("native", "t5", "infer")}
FAST_COUNTS = {("llama", "infer")}

# Known root causes, open today. Fixed ones have a minimal reproducer in
# tests/capture/test_real_model_patterns.py or tests/capture/test_transformers_patterns.py.
ILL_CONDITIONED = (
    "training MobileNetV2 at this size is ill-conditioned (BatchNorm over 2 samples of 1x1 maps): reordered "
    "float32 sums move the grads by ~6e-3 (the real torch.compile by ~7e-2); in float64 Kiln matches eager "
    "to 1e-10"
)

REFORMER_SEEDED_RANDOM = (
    "inductor: Reformer's LSH attention reseeds (torch.manual_seed(hash_seed), modeling_reformer.py:726) and "
    "then draws its random rotations with torch.randn; now that the forward of _ReversibleFunction is "
    "captured (in inference, and in training under its own backward), those draws are in an inductor graph, whose counter-based rand/randn (kiln/lower/ops.py) gives "
    "other numbers than eager's CPU generator for the same seed (as torch.compile's inductor does without "
    "fallback_random): the hash buckets, and so the outputs, differ from eager"
)

# (test, backend or None, model, mode) -> reason.
XFAIL: dict[tuple, str] = {
    **{("match", backend, "mobilenet_v2", "train"): ILL_CONDITIONED for backend in ("inductor", "native")},
    **{("match", backend, "reformer", mode): REFORMER_SEEDED_RANDOM for mode in MODES for backend in ("inductor", "native")},
}


def _marks(key: tuple, fast: bool, *extra) -> list:
    marks = list(extra)
    if not fast:
        marks.append(pytest.mark.slow)
    if key in XFAIL:
        marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[key]))
    return marks


def _match_params():
    for backend in BACKENDS:
        for model in MODELS:
            for mode in MODES:
                extra = [pytest.mark.cpp] if backend in ("inductor", "native") else []
                marks = _marks(("match", backend, model, mode), (backend, model, mode) in FAST_MATCH, *extra)
                yield pytest.param(backend, model, mode, marks=marks, id=f"{backend}-{model}-{mode}")


def _count_params():
    for model in MODELS:
        for mode in MODES:
            marks = _marks(("counts", None, model, mode), (model, mode) in FAST_COUNTS)
            yield pytest.param(model, mode, marks=marks, id=f"{model}-{mode}")


_EAGER: dict[tuple[str, str], tuple] = {}


def _eager(model: str, mode: str) -> tuple:
    if (model, mode) not in _EAGER:
        _EAGER[model, mode] = eager_result(MODELS[model], mode == "train")
    return _EAGER[model, mode]


@pytest.mark.parametrize("backend,model,mode", list(_match_params()))
def test_matches_eager(backend: str, model: str, mode: str) -> None:
    entry = MODELS[model]
    want_out, want_grads = _eager(model, mode)
    if backend == "native":
        from kiln import config

        with config.patch(cpu_wrapper="native"):
            got_out, got_grads = kiln_result(entry, mode == "train", "inductor")
    else:
        got_out, got_grads = kiln_result(entry, mode == "train", backend)
    assert_close_trees(got_out, want_out, entry.tol, f"{model} {mode} outputs")
    if mode == "train":
        assert_close_trees(got_grads, want_grads, entry.tol, f"{model} grads")


@pytest.mark.parametrize("model,mode", list(_count_params()))
def test_graph_counts(model: str, mode: str) -> None:
    entry = MODELS[model]
    training = mode == "train"
    torch_graphs, torch_breaks, torch_explained = torch_counts(entry, training)
    graphs, breaks, explained = kiln_counts(entry, training)
    fallbacks = [f for f in explained.fallbacks if "no tensor ops were traced" not in f.reason]
    said = f"kiln {graphs} graphs / {breaks} breaks, torch.compile {torch_graphs} / {torch_breaks}\n{explained}"
    assert not fallbacks, "frames ran eagerly as a whole: " + said
    assert (graphs >= 1) == (torch_graphs >= 1), said
    assert graphs <= torch_graphs, said
    assert explained.op_count * 2 >= torch_explained.op_count, (
        f"kiln's graphs hold {explained.op_count} ops, torch.compile's {torch_explained.op_count}: " + said)


def test_corpus_builds() -> None:
    """Every model of the corpus constructs offline (no hub access) and the helper has them all."""
    assert set(MODELS) == {
        "gpt2", "bert", "distilbert", "llama", "mistral", "qwen2", "opt", "t5", "vit",
        "roberta", "albert", "electra", "deberta_v2", "mpnet", "bart", "whisper", "clip", "swin", "convnext",
        "resnet", "mobilenet_v2", "segformer", "gpt_neox", "phi", "gemma", "falcon", "bloom", "mixtral",
        "bert_all_outputs", "mistral_cache", "wav2vec2", "longformer", "reformer"}
    assert real_models.BATCH == 2 and real_models.SEQ == 8
