"""A ninth held-out set of `transformers` families, none in real_models.py (the tuned corpus) nor in
held_out_models.py: state-space and recurrent decoders (Mamba's selective scan in plain torch, RWKV's
time mixing), ALiBi and partial-rotary decoders (MPT, Persimmon), MoE routers (OLMoE, Qwen3-MoE),
Cohere's interleaved rotary, Granite's multipliers, disentangled attention (DeBERTa v1), span-based
dynamic convolution (ConvBERT), layout embeddings (LayoutLM), masked autoencoding with given noise
(ViT-MAE), focal modulation (FocalNet), overlapping patch embeddings (PVTv2), weight-standardized
convs (BiT), convolutional projections (CvT), unrolled mask units (Hiera), SEW-D's squeezed attention,
an audio spectrogram transformer (AST), a speech-to-text seq2seq (Speech2Text), patched time series
(PatchTST), n-gram prediction with bucketed relative positions (ProphetNet). Built as the other sets
(tiny configs, random weights, dropout off, no hub download).

`HELD_OUT9` maps a name to a `RealModel`; tests/e2e/test_held_out_models9.py runs each through
kiln.compile's default backend (lowered code, not "eager") and compares with eager and with the
real torch.compile's graph counts.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from real_models import BATCH, SEQ, SMALL, VOCAB, LazyNames, RealModel, _tokens
import held_out_models
from held_out_models import _pixels
from real_models import _cls_inputs as _cls, _lm_inputs as _lm, _seq2seq_inputs as _seq2seq

HELD_OUT9: dict[str, RealModel] = {}


def _add(name: str, make: Callable[[Any], torch.nn.Module], config: Callable[[], Any],
         inputs: Callable[[bool], dict], tol: float = 1e-4) -> None:
    held_out_models._add(name, make, config, inputs, tol, table=HELD_OUT9)


def _mae(training: bool) -> dict:
    # tol 1e-3: the mask token's gradient sums over every masked patch (entries up to 1e4 here; eager's
    # and Kiln's float32 sums both sit ~4e-3 from a float64 run, apart by up to 1.1e-4 relative)
    # ViT-MAE masks patches by ranking a uniform draw; handing the draw in (`noise`) makes the
    # compiled and eager runs mask the same patches
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g), "noise": torch.rand(BATCH, 16, generator=g)}


def _layout(training: bool) -> dict:
    out = _cls(training)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randint(0, 500, (BATCH, SEQ, 1), generator=g)
    y0 = torch.randint(0, 500, (BATCH, SEQ, 1), generator=g)
    size = torch.randint(1, 400, (BATCH, SEQ, 2), generator=g)
    out["bbox"] = torch.cat([x0, y0, x0 + size[..., :1], y0 + size[..., 1:]], -1)
    out["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ)
    return out


AUDIO_SAMPLES, AUDIO_VOCAB = 1024, 32


def _audio(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_values": torch.randn(BATCH, AUDIO_SAMPLES, generator=g)}
    if training:
        out["labels"] = torch.randint(1, AUDIO_VOCAB, (BATCH, 4), generator=g)
    return out


def _spectrogram(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_values": torch.randn(BATCH, 32, 16, generator=g)}  # frames x mel bins
    if training:
        out["labels"] = torch.tensor([0, 1])
    return out


def _speech2text(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"input_features": torch.randn(BATCH, 32, 16, generator=g), "attention_mask": torch.ones(BATCH, 32).long(),
           "use_cache": False}
    if training:
        out["labels"] = _tokens(2)
    else:
        out["decoder_input_ids"] = _tokens(2)
    return out


def _series(training: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    out = {"past_values": torch.randn(BATCH, 32, 3, generator=g)}
    if training:
        out["future_values"] = torch.randn(BATCH, 8, 3, generator=g)
    return out


def _define(tf: Any) -> None:
    lm = dict(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)
    cls = dict(vocab_size=VOCAB, max_position_embeddings=64, num_labels=2, **SMALL)
    # decoders
    _add("mamba", tf.MambaForCausalLM, lambda: tf.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
        use_mambapy=False), _lm_nocache)
    _add("rwkv", tf.RwkvForCausalLM, lambda: tf.RwkvConfig(
        vocab_size=VOCAB, context_length=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
        intermediate_size=64), _lm_nocache)
    _add("mpt", tf.MptForCausalLM, lambda: tf.MptConfig(
        vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64), _lm)
    _add("persimmon", tf.PersimmonForCausalLM, lambda: tf.PersimmonConfig(
        **lm, partial_rotary_factor=0.5, qk_layernorm=True), _lm)
    _add("olmoe", tf.OlmoeForCausalLM, lambda: tf.OlmoeConfig(
        **{**lm, "intermediate_size": 16}, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2), _lm)
    _add("qwen3_moe", tf.Qwen3MoeForCausalLM, lambda: tf.Qwen3MoeConfig(
        **{**lm, "intermediate_size": 40}, num_key_value_heads=2, head_dim=8, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1), _lm)
    _add("cohere", tf.CohereForCausalLM, lambda: tf.CohereConfig(**lm, num_key_value_heads=2), _lm)
    _add("granite", tf.GraniteForCausalLM, lambda: tf.GraniteConfig(
        **lm, num_key_value_heads=2, embedding_multiplier=2.0, logits_scaling=4.0, residual_multiplier=0.5,
        attention_multiplier=0.3), _lm)
    # text encoders
    _add("deberta", tf.DebertaForSequenceClassification, lambda: tf.DebertaConfig(
        relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=8, **cls), _cls)
    _add("convbert", tf.ConvBertForSequenceClassification, lambda: tf.ConvBertConfig(
        embedding_size=32, conv_kernel_size=3, head_ratio=2, **cls), _cls)
    _add("layoutlm", tf.LayoutLMForSequenceClassification, lambda: tf.LayoutLMConfig(
        max_2d_position_embeddings=1024, type_vocab_size=2, **cls), _layout)
    # vision
    vit = dict(image_size=16, patch_size=4, num_channels=3, **SMALL)
    _add("vit_mae", tf.ViTMAEForPreTraining, lambda: tf.ViTMAEConfig(
        decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=24, mask_ratio=0.5, **vit), _mae, tol=1e-3)
    _add("focalnet", tf.FocalNetForImageClassification, lambda: tf.FocalNetConfig(
        image_size=16, patch_size=2, embed_dim=8, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3],
        num_labels=2), _pixels())
    _add("pvt_v2", tf.PvtV2ForImageClassification, lambda: tf.PvtV2Config(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[3, 3],
        strides=[2, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=2), _pixels())
    _add("bit", tf.BitForImageClassification, lambda: tf.BitConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck", global_padding="SAME",
        num_groups=4, num_labels=2), _pixels())
    _add("cvt", tf.CvtForImageClassification, lambda: tf.CvtConfig(
        embed_dim=[8, 16], num_heads=[1, 2], depth=[1, 2], patch_sizes=[3, 3], patch_stride=[2, 2],
        patch_padding=[1, 1], mlp_ratio=[2.0, 2.0], qkv_projection_method=["dw_bn", "dw_bn"],
        kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1],
        cls_token=[False, True], drop_path_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], attention_drop_rate=[0.0, 0.0],
        qkv_bias=[True, True], num_labels=2), _pixels())  # depth [1, 2]: CvT indexes its drop-path rates by stage
    _add("hiera", tf.HieraForImageClassification, lambda: tf.HieraConfig(
        image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=8,
        num_heads=[1, 2], depths=[1, 1], query_stride=[2, 2], masked_unit_size=[4, 4], mlp_ratio=2.0, num_query_pool=1,
        masked_unit_attention=[True, False],
        num_labels=2), _pixels(32))
    # speech and series
    _add("sew_d", tf.SEWDForCTC, lambda: tf.SEWDConfig(
        vocab_size=AUDIO_VOCAB, conv_dim=(16, 16, 16), conv_stride=(4, 4, 4), conv_kernel=(8, 8, 8),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, squeeze_factor=2, mask_time_prob=0.0,
        max_position_embeddings=64, position_buckets=8, **SMALL), _audio)
    _add("ast", tf.ASTForAudioClassification, lambda: tf.ASTConfig(
        patch_size=8, frequency_stride=4, time_stride=4, max_length=32, num_mel_bins=16, num_labels=2,
        **SMALL), _spectrogram)
    _add("speech2text", tf.Speech2TextForConditionalGeneration, lambda: tf.Speech2TextConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_source_positions=64,
        max_target_positions=64, num_conv_layers=2, conv_channels=16, conv_kernel_sizes=[5, 5],
        input_feat_per_channel=16, input_channels=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2), _speech2text)
    _add("patchtst", tf.PatchTSTForPrediction, lambda: tf.PatchTSTConfig(
        num_input_channels=3, context_length=32, prediction_length=8, patch_length=8, patch_stride=8,
        d_model=16, num_attention_heads=2, num_hidden_layers=2, ffn_dim=24), _series)
    _add("prophetnet", tf.ProphetNetForConditionalGeneration, lambda: tf.ProphetNetConfig(
        vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=37, decoder_ffn_dim=37, num_encoder_layers=2,
        num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2,
        num_buckets=8, relative_max_distance=16, max_position_embeddings=64, pad_token_id=0,
        decoder_start_token_id=0), _seq2seq)


def _lm_nocache(training: bool) -> dict:
    out = _lm(training)
    del out["attention_mask"]  # Mamba and RWKV take no attention mask (their slow paths ignore one)
    return out


try:
    import transformers as _tf

    _define(LazyNames(_tf))
except ImportError:  # no transformers: the tests importorskip it
    pass
