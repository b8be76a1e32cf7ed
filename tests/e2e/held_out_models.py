"""Held-out `transformers` models: families outside the corpus of real_models.py (the one the
project tunes against), built the same way (tiny configs, random weights, no hub download, dropout
off) and run by the same helpers, to measure Kiln as a new user would meet it: decoders, a MoE,
vision encoders and convnets, a DETR-style detector, speech encoders, seq2seq, text encoders.

`HELD_OUT` maps a name to a `RealModel`; tests/e2e/test_held_out_models.py compares each with eager
(inference and a training step) and its graph and break counts with torch.compile's.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from real_models import BATCH, SEQ, SMALL, VOCAB, LazyNames, RealModel, _no_dropout, _tokens
from real_models import _cls_inputs as _cls, _lm_inputs as _lm, _seq2seq_inputs as _seq2seq

HELD_OUT: dict[str, RealModel] = {}


def _add(name: str, make: Callable[[Any], torch.nn.Module], config: Callable[[], Any],
         inputs: Callable[[bool], dict], tol: float = 1e-4, table: dict[str, RealModel] = HELD_OUT) -> None:
    """A model built from its tiny config with dropout off and seed 0, entered in `table` (the later
    held-out sets pass their own)."""
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make(_no_dropout(config()))

    table[name] = RealModel(name, build, inputs, tol)


def _pixels(size: int = 16) -> Callable[[bool], dict]:
    def inputs(training: bool) -> dict:
        g = torch.Generator().manual_seed(1)
        out = {"pixel_values": torch.randn(BATCH, 3, size, size, generator=g)}
        if training:
            out["labels"] = torch.tensor([0, 1])
        return out
    return inputs


def _pixels_only(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g)}


def _detection(training: bool) -> dict:
    # DETR's loss matches predictions to targets with scipy's Hungarian solver: inference only
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g)}


AUDIO_SAMPLES, AUDIO_VOCAB = 1024, 32


def _audio(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_values": torch.randn(BATCH, AUDIO_SAMPLES, generator=g)}
    if training:
        out["labels"] = torch.randint(1, AUDIO_VOCAB, (BATCH, 4), generator=g)
    return out


def _mel(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_features": torch.randn(BATCH, 16, 32, generator=g)}
    if training:
        out["labels"] = torch.tensor([0, 1])
    return out


def _define(tf: Any) -> None:
    lm = dict(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)
    cls = dict(vocab_size=VOCAB, max_position_embeddings=64, num_labels=2, **SMALL)
    seq2seq = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                   pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    vit = dict(image_size=16, patch_size=4, num_channels=3, num_labels=2, **SMALL)
    # decoders
    _add("qwen2_moe", tf.Qwen2MoeForCausalLM, lambda: tf.Qwen2MoeConfig(
        **{**lm, "intermediate_size": 40}, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24), _lm)
    _add("gemma2", tf.Gemma2ForCausalLM, lambda: tf.Gemma2Config(
        **lm, num_key_value_heads=2, head_dim=8, sliding_window=4), _lm)
    _add("phi3", tf.Phi3ForCausalLM, lambda: tf.Phi3Config(**lm, num_key_value_heads=2, pad_token_id=0), _lm)
    _add("stablelm", tf.StableLmForCausalLM, lambda: tf.StableLmConfig(**lm, num_key_value_heads=2), _lm)
    _add("gptj", tf.GPTJForCausalLM, lambda: tf.GPTJConfig(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4), _lm)
    _add("codegen", tf.CodeGenForCausalLM, lambda: tf.CodeGenConfig(
        vocab_size=VOCAB, n_positions=64, n_ctx=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4), _lm)
    _add("gpt_neo", tf.GPTNeoForCausalLM, lambda: tf.GPTNeoConfig(
        vocab_size=VOCAB, max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=4,
        attention_types=[[["global", "local"], 1]], window_size=4), _lm)
    _add("olmo", tf.OlmoForCausalLM, lambda: tf.OlmoConfig(**lm, num_key_value_heads=2, pad_token_id=0), _lm)
    _add("starcoder2", tf.Starcoder2ForCausalLM, lambda: tf.Starcoder2Config(
        **lm, num_key_value_heads=2, sliding_window=None), _lm)
    _add("gpt_bigcode", tf.GPTBigCodeForCausalLM, lambda: tf.GPTBigCodeConfig(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4), _lm)
    _add("biogpt", tf.BioGptForCausalLM, lambda: tf.BioGptConfig(**lm), _lm)
    # vision
    _add("clip_vision", tf.CLIPVisionModelWithProjection, lambda: tf.CLIPVisionConfig(
        image_size=16, patch_size=4, projection_dim=16, **SMALL), _pixels_only)
    _add("siglip_vision", tf.SiglipVisionModel, lambda: tf.SiglipVisionConfig(
        image_size=16, patch_size=4, **SMALL), _pixels_only)
    _add("deit", tf.DeiTForImageClassification, lambda: tf.DeiTConfig(**vit), _pixels())
    _add("beit", tf.BeitForImageClassification, lambda: tf.BeitConfig(
        use_relative_position_bias=True, **vit), _pixels())
    _add("dinov2", tf.Dinov2ForImageClassification, lambda: tf.Dinov2Config(**vit), _pixels())
    # LeViT's stem divides the image by 16: 64 pixels make 4x4 tokens, subsampled to 2x2
    _add("levit", tf.LevitForImageClassification, lambda: tf.LevitConfig(
        image_size=64, hidden_sizes=[16, 24], num_attention_heads=[2, 2], depths=[1, 1],
        key_dim=[8, 8], down_ops=[["Subsample", 8, 2, 4, 2, 2]], num_labels=2), _pixels(64))
    _add("regnet", tf.RegNetForImageClassification, lambda: tf.RegNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, num_labels=2), _pixels())
    _add("efficientnet", tf.EfficientNetForImageClassification, lambda: tf.EfficientNetConfig(
        image_size=64, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128, num_labels=2), _pixels(64))
    _add("poolformer", tf.PoolFormerForImageClassification, lambda: tf.PoolFormerConfig(
        hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], num_labels=2), _pixels(32))
    _add("mobilevit", tf.MobileViTForImageClassification, lambda: tf.MobileViTConfig(
        image_size=32, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 8, 8, 8, 8, 16], num_labels=2),
        _pixels(32))
    _add("convnextv2", tf.ConvNextV2ForImageClassification, lambda: tf.ConvNextV2Config(
        image_size=16, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=2), _pixels())
    _add("swinv2", tf.Swinv2ForImageClassification, lambda: tf.Swinv2Config(
        image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2,
        num_labels=2), _pixels())
    _add("detr", tf.DetrForObjectDetection, lambda: tf.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone=None,
        backbone_config=tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                        layer_type="basic", out_features=["stage4"]),
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, num_queries=6, num_labels=3), _detection)
    _add("yolos", tf.YolosForObjectDetection, lambda: tf.YolosConfig(
        image_size=[32, 32], patch_size=8, num_detection_tokens=4, num_labels=3, **SMALL), _detection)
    # speech
    _add("hubert", tf.HubertForCTC, lambda: tf.HubertConfig(
        vocab_size=AUDIO_VOCAB, conv_dim=(16, 16, 16), conv_stride=(4, 4, 4), conv_kernel=(8, 8, 8),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, mask_time_prob=0.0, **SMALL), _audio)
    _add("wavlm", tf.WavLMForCTC, lambda: tf.WavLMConfig(
        vocab_size=AUDIO_VOCAB, conv_dim=(16, 16, 16), conv_stride=(4, 4, 4), conv_kernel=(8, 8, 8),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, mask_time_prob=0.0, num_buckets=16,
        max_bucket_distance=32, **SMALL), _audio)
    _add("whisper_encoder", tf.WhisperForAudioClassification, lambda: tf.WhisperConfig(
        num_mel_bins=16, max_source_positions=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=37, num_labels=2,
        vocab_size=VOCAB), _mel)
    # seq2seq and text encoders
    _add("pegasus", tf.PegasusForConditionalGeneration, lambda: tf.PegasusConfig(**seq2seq), _seq2seq)
    _add("marian", tf.MarianMTModel, lambda: tf.MarianConfig(**{**seq2seq, "pad_token_id": 0}), _seq2seq)
    _add("mbart", tf.MBartForConditionalGeneration, lambda: tf.MBartConfig(**seq2seq), _seq2seq)
    _add("funnel", tf.FunnelForSequenceClassification, lambda: tf.FunnelConfig(
        vocab_size=VOCAB, block_sizes=[1, 1], num_decoder_layers=1, d_model=32, n_head=4, d_head=8, d_inner=37,
        num_labels=2), _cls)
    # grouped 1x1 convolutions (4 groups) in place of linears: an intermediate size of 40, not 37
    _add("squeezebert", tf.SqueezeBertForSequenceClassification, lambda: tf.SqueezeBertConfig(
        embedding_size=32, **{**cls, "intermediate_size": 40}), _cls)
    _add("xlm_roberta", tf.XLMRobertaForSequenceClassification, lambda: tf.XLMRobertaConfig(
        pad_token_id=1, **cls), _cls)


try:
    import transformers as _tf

    _define(LazyNames(_tf))  # classes looked up when a model is built, not all modeling modules now
except ImportError:  # no transformers: the tests importorskip it
    pass
