"""A corpus of small real models from the `transformers` library, built from configs with random
weights (never a hub download), and the runs that compare Kiln with eager and with torch.compile.

Each `RealModel` builds a fresh model (fixed seed, dropout off so that eager and compiled runs
compute the same thing) and the inputs of one call. `infer` runs the call under torch.no_grad in
eval mode; `train` runs it in train mode, takes the loss the model returns (or the sum of its
first output) and runs backward, then reads every parameter's gradient. Sizes are tiny (2 layers,
hidden 32, sequence 8, batch 2): the point is the code paths of real model code, not the maths.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

BATCH, SEQ, VOCAB = 2, 8, 99
SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=37)


@dataclass(frozen=True)
class RealModel:
    name: str
    build: Callable[[], torch.nn.Module]  # a fresh model with random weights (seeded)
    inputs: Callable[[bool], dict]  # keyword inputs of one call; the flag: training (add labels)
    tol: float = 1e-4


MODELS: dict[str, RealModel] = {}


def _no_dropout(config: Any) -> Any:
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(config, key, 0.0)
    return config


def _register(name: str, make: Callable[[Any], torch.nn.Module], config: Callable[[], Any],
              inputs: Callable[[bool], dict], tol: float = 1e-4) -> None:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make(_no_dropout(config()))

    MODELS[name] = RealModel(name, build, inputs, tol)


def _tokens(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)


def _lm_inputs(training: bool) -> dict:
    ids = _tokens()
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    if training:
        out["labels"] = ids.clone()
    return out


def _cls_inputs(training: bool) -> dict:
    ids = _tokens()
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if training:
        out["labels"] = torch.tensor([0, 1])
    return out


def _seq2seq_inputs(training: bool) -> dict:
    ids = _tokens()
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    if training:
        out["labels"] = _tokens(2)
    else:
        out["decoder_input_ids"] = _tokens(2)
    return out


def _image_inputs(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g)}
    if training:
        out["labels"] = torch.tensor([0, 1])
    return out


def _define() -> None:
    import transformers as tf

    _register("gpt2", tf.GPT2LMHeadModel, lambda: tf.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4), _lm_inputs)
    _register("bert", tf.BertForSequenceClassification, lambda: tf.BertConfig(
        vocab_size=VOCAB, max_position_embeddings=64, num_labels=2, **SMALL), _cls_inputs)
    _register("distilbert", tf.DistilBertForSequenceClassification, lambda: tf.DistilBertConfig(
        vocab_size=VOCAB, max_position_embeddings=64, n_layers=2, dim=32, n_heads=4, hidden_dim=37,
        num_labels=2), _cls_inputs)
    _register("llama", tf.LlamaForCausalLM, lambda: tf.LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, **SMALL), _lm_inputs)
    _register("mistral", tf.MistralForCausalLM, lambda: tf.MistralConfig(
        vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, sliding_window=None,
        **SMALL), _lm_inputs)
    _register("qwen2", tf.Qwen2ForCausalLM, lambda: tf.Qwen2Config(
        vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, **SMALL), _lm_inputs)
    _register("opt", tf.OPTForCausalLM, lambda: tf.OPTConfig(
        vocab_size=VOCAB, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, ffn_dim=37, word_embed_proj_dim=32), _lm_inputs)
    _register("t5", tf.T5ForConditionalGeneration, lambda: tf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0), _seq2seq_inputs)
    _register("vit", tf.ViTForImageClassification, lambda: tf.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, num_labels=2, **SMALL), _image_inputs)


try:
    _define()
except ImportError:  # no transformers: the tests importorskip it
    pass


# ---------------------------------------------------------------------------------------------
# running one call


def _as_tree(out: Any) -> Any:
    """A model output (ModelOutput, a dict subclass) as plain containers, for comparison."""
    if isinstance(out, dict):
        return {k: _as_tree(v) for k, v in out.items() if v is not None}
    if isinstance(out, (tuple, list)):
        return type(out)(_as_tree(v) for v in out) if type(out) in (tuple, list) else tuple(_as_tree(v) for v in out)
    return out


def _detach(tree: Any) -> Any:
    return pytree.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, tree)


def _scalar_loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else None
    if loss is None:
        first = next(t for t in pytree.tree_leaves(_as_tree(out)) if isinstance(t, torch.Tensor) and t.requires_grad)
        loss = first.float().sum()
    return loss


def run_call(model: torch.nn.Module, wrap: Callable[[torch.nn.Module], Callable], entry: RealModel,
             training: bool) -> tuple[Any, dict | None]:
    """(outputs, parameter grads or None) of one call of `wrap(model)` on the entry's inputs."""
    model.train(training)
    fn = wrap(model)
    kwargs = entry.inputs(training)
    if not training:
        with torch.no_grad():
            return _detach(_as_tree(fn(**kwargs))), None
    out = fn(**kwargs)
    _scalar_loss(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return _detach(_as_tree(out)), grads


def assert_close_trees(got: Any, want: Any, tol: float, what: str) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec, f"{what}: structure differs from eager:\n{got_spec}\nvs\n{want_spec}"
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves)):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}[{i}]: {type(a).__name__} where eager has a tensor"
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}[{i}]: {m}")
        else:
            assert a == b, f"{what}[{i}]: {a!r} != eager's {b!r}"


def eager_result(entry: RealModel, training: bool) -> tuple[Any, dict | None]:
    return run_call(entry.build(), lambda m: m, entry, training)


def kiln_result(entry: RealModel, training: bool, backend: str) -> tuple[Any, dict | None]:
    import kiln

    kiln.reset()
    try:
        return run_call(entry.build(), lambda m: kiln.compile(m, backend=backend), entry, training)
    finally:
        kiln.reset()


def _call_for_explain(entry: RealModel, training: bool) -> tuple[torch.nn.Module, dict]:
    model = entry.build()
    model.train(training)
    return model, entry.inputs(training)


def kiln_counts(entry: RealModel, training: bool) -> tuple[int, int, Any]:
    import kiln

    kiln.reset()
    model, kwargs = _call_for_explain(entry, training)
    try:
        with torch.set_grad_enabled(training):
            out = kiln.explain(model)(**kwargs)
    finally:
        kiln.reset()
    return out.graph_count, out.graph_break_count, out


def torch_counts(entry: RealModel, training: bool) -> tuple[int, int, Any]:
    import torch._dynamo

    torch._dynamo.reset()
    model, kwargs = _call_for_explain(entry, training)
    try:
        with torch.set_grad_enabled(training):
            out = torch._dynamo.explain(model)(**kwargs)
    finally:
        torch._dynamo.reset()
    return out.graph_count, out.graph_break_count, out


def fresh_copy(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)
