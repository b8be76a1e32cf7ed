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
    # layerdrop (wav2vec2, bart, whisper) skips whole layers in training on a torch.rand draw, which a
    # compiled graph draws from its own generator (as torch.compile's inductor): off, like dropout
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and any(word in key for word in ("dropout", "pdrop", "drop_path", "layerdrop")):
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


def _clip_inputs(training: bool) -> dict:
    ids = _tokens()
    g = torch.Generator().manual_seed(1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g), "return_loss": training}


def _segmentation_inputs(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g)}
    if training:
        out["labels"] = torch.randint(0, 2, (BATCH, 16, 16), generator=g)
    return out


MEL_BINS, MEL_FRAMES = 16, 32  # whisper's encoder wants 2 * max_source_positions frames


def _speech_inputs(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_features": torch.randn(BATCH, MEL_BINS, MEL_FRAMES, generator=g), "use_cache": False}
    if training:
        out["labels"] = _tokens(2)
    else:
        out["decoder_input_ids"] = _tokens(2)
    return out


class LazyNames:
    """A module whose attributes are looked up when they are called: `tf.GPT2LMHeadModel(config)`
    imports GPT-2's modeling module only when a model is built. Naming all 33 classes at import
    would import every modeling module (about 5 s of CPU), in each test process that runs one model."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Callable[..., Any]:
        module = self._module

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(module, name)(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call


def _define() -> None:
    import transformers

    tf = LazyNames(transformers)
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
    _define_more(tf)


def _define_more(tf: Any) -> None:
    """The wider corpus: encoders, seq2seq, speech, text+vision, convnets, decoders, a MoE."""
    cls = dict(vocab_size=VOCAB, max_position_embeddings=64, num_labels=2, **SMALL)
    lm = dict(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)
    seq2seq = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37)
    image = dict(num_channels=3, num_labels=2)
    _register("roberta", tf.RobertaForSequenceClassification, lambda: tf.RobertaConfig(
        pad_token_id=1, **cls), _cls_inputs)
    _register("albert", tf.AlbertForSequenceClassification, lambda: tf.AlbertConfig(
        embedding_size=16, **cls), _cls_inputs)
    _register("electra", tf.ElectraForSequenceClassification, lambda: tf.ElectraConfig(
        embedding_size=16, **cls), _cls_inputs)
    _register("deberta_v2", tf.DebertaV2ForSequenceClassification, lambda: tf.DebertaV2Config(
        relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8, **cls), _cls_inputs)
    _register("mpnet", tf.MPNetForSequenceClassification, lambda: tf.MPNetConfig(**cls), _cls_inputs)
    _register("bart", tf.BartForConditionalGeneration, lambda: tf.BartConfig(
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        **seq2seq), _seq2seq_inputs)
    _register("whisper", tf.WhisperForConditionalGeneration, lambda: tf.WhisperConfig(
        num_mel_bins=MEL_BINS, max_source_positions=MEL_FRAMES // 2, max_target_positions=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None,
        begin_suppress_tokens=None, **seq2seq), _speech_inputs)
    _register("clip", tf.CLIPModel, lambda: tf.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=64, **SMALL),
        vision_config=dict(image_size=16, patch_size=4, **SMALL), projection_dim=16), _clip_inputs)
    _register("swin", tf.SwinForImageClassification, lambda: tf.SwinConfig(
        image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2, **image),
        _image_inputs)
    _register("convnext", tf.ConvNextForImageClassification, lambda: tf.ConvNextConfig(
        image_size=16, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], **image), _image_inputs)
    _register("resnet", tf.ResNetForImageClassification, lambda: tf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **image), _image_inputs)
    _register("mobilenet_v2", tf.MobileNetV2ForImageClassification, lambda: tf.MobileNetV2Config(
        image_size=16, depth_multiplier=0.25, **image), _image_inputs)
    _register("segformer", tf.SegformerForSemanticSegmentation, lambda: tf.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[3, 3],
        strides=[2, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, **image),
        _segmentation_inputs)
    _register("gpt_neox", tf.GPTNeoXForCausalLM, lambda: tf.GPTNeoXConfig(**lm), _lm_inputs)
    _register("phi", tf.PhiForCausalLM, lambda: tf.PhiConfig(**lm), _lm_inputs)
    _register("gemma", tf.GemmaForCausalLM, lambda: tf.GemmaConfig(
        num_key_value_heads=2, head_dim=8, **lm), _lm_inputs)
    _register("falcon", tf.FalconForCausalLM, lambda: tf.FalconConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4), _lm_inputs)
    _register("bloom", tf.BloomForCausalLM, lambda: tf.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4), _lm_inputs)
    # the experts' grouped matmul wants 16-byte aligned strides: an intermediate size of 40, not 37
    _register("mixtral", tf.MixtralForCausalLM, lambda: tf.MixtralConfig(
        **{**lm, "intermediate_size": 40}, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        _lm_inputs)
    _define_outputs(tf)


def _audio_inputs(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_values": torch.randn(BATCH, AUDIO_SAMPLES, generator=g)}
    if training:
        out["labels"] = torch.randint(1, AUDIO_VOCAB, (BATCH, 4), generator=g)
    return out


def _global_attention_inputs(training: bool) -> dict:
    out = _cls_inputs(training)
    out["global_attention_mask"] = torch.zeros_like(out["input_ids"])
    out["global_attention_mask"][:, 0] = 1  # the first token attends everywhere, as a [CLS] would
    return out


def _cache_inputs(training: bool) -> dict:
    from transformers import DynamicCache

    return {**_lm_inputs(training), "use_cache": True, "past_key_values": DynamicCache()}


def _all_outputs_inputs(training: bool) -> dict:
    return {**_cls_inputs(training), "output_hidden_states": True, "output_attentions": True}


AUDIO_SAMPLES, AUDIO_VOCAB = 1024, 32  # three stride-4 convolutions: 1024 samples -> 14 frames


def _define_outputs(tf: Any) -> None:
    """Models whose calls carry more than tensors: a KV cache object in and out, every hidden
    state and attention map, a global attention mask, raw audio, reversible layers."""
    cls = dict(vocab_size=VOCAB, max_position_embeddings=64, num_labels=2, **SMALL)
    _register("bert_all_outputs", tf.BertForSequenceClassification, lambda: tf.BertConfig(
        attn_implementation="eager", **cls), _all_outputs_inputs)
    _register("mistral_cache", tf.MistralForCausalLM, lambda: tf.MistralConfig(
        vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, sliding_window=None,
        **SMALL), _cache_inputs)
    _register("wav2vec2", tf.Wav2Vec2ForCTC, lambda: tf.Wav2Vec2Config(
        vocab_size=AUDIO_VOCAB, conv_dim=(16, 16, 16), conv_stride=(4, 4, 4), conv_kernel=(8, 8, 8),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, mask_time_prob=0.0,
        mask_feature_prob=0.0, **SMALL), _audio_inputs)
    _register("longformer", tf.LongformerForSequenceClassification, lambda: tf.LongformerConfig(
        attention_window=4, pad_token_id=1, **cls), _global_attention_inputs)
    # LSH hashing draws random rotations: a fixed hash_seed makes eager and compiled runs agree
    _register("reformer", tf.ReformerModelWithLMHead, lambda: tf.ReformerConfig(
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, attention_head_size=8, feed_forward_size=37,
        attn_layers=["local", "lsh"], axial_pos_shape=[2, 4], axial_pos_embds_dim=[16, 16],
        local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1, hash_seed=0,
        is_decoder=True, max_position_embeddings=SEQ, pad_token_id=0), _reformer_inputs)


def _reformer_inputs(training: bool) -> dict:
    out = _cls_inputs(False)
    if training:
        out["labels"] = out["input_ids"].clone()
    return out


try:
    _define()
except ImportError:  # no transformers: the tests importorskip it
    pass


# ---------------------------------------------------------------------------------------------
# running one call


def _as_tree(out: Any) -> Any:
    """A model output (ModelOutput, a dict subclass) as plain containers, for comparison; a KV
    cache as the tuple of its layers' (keys, values); another transformers object by its fields."""
    if hasattr(out, "layers") and hasattr(out, "get_seq_length"):
        return tuple((layer.keys, layer.values) for layer in out.layers)
    if isinstance(out, dict):
        return {k: _as_tree(v) for k, v in out.items() if v is not None}
    if isinstance(out, (tuple, list)):
        return type(out)(_as_tree(v) for v in out) if type(out) in (tuple, list) else tuple(_as_tree(v) for v in out)
    if type(out).__module__.startswith("transformers.") and hasattr(out, "__dict__"):
        # another cache object (Reformer's buckets and states): its class and fields, compared by value
        return {"__class__": type(out).__qualname__, **{k: _as_tree(v) for k, v in vars(out).items()}}
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
