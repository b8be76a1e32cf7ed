"""A greedy generate loop over transformers' MistralForCausalLM with its DynamicCache (the cache
object passed in, grown in place, handed back in the output and passed in again), under
kiln.compile(backend="eager") and the real torch.compile: every step's logits and the cache's final
keys and values equal eager's, and Kiln compiles as many graphs as torch.compile (the prefill, the
first one-token step, then one graph for every later step once the cache length is dynamic).

Issue 30 measured 3 graphs where torch.compile makes 1 on Mistral with a DynamicCache; this pins the
counts over the loop and over repeated calls with a fresh cache each (the bench's way)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln

tf = pytest.importorskip("transformers")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.MistralConfig(vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, sliding_window=None,
                              num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=37)
    return tf.MistralForCausalLM(config).eval()


def _generate(model, steps: int = 3) -> tuple:
    cache = tf.DynamicCache()
    ids = torch.randint(1, 99, (2, 8), generator=torch.Generator().manual_seed(1))
    logits = []
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        for _ in range(steps):
            assert out.past_key_values is cache
            out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return logits, [(layer.keys, layer.values) for layer in cache.layers]


def _fresh_cache_calls(model) -> list:
    ids = torch.randint(1, 99, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return [model(input_ids=ids, past_key_values=tf.DynamicCache(), use_cache=True).logits for _ in range(3)]


@pytest.mark.parametrize("program", [_generate, _fresh_cache_calls], ids=["generate", "fresh_cache_calls"])
def test_mistral_dynamic_cache_graphs_match_torch_compile(program) -> None:
    model = _model()
    want = program(model)
    kiln.reset()
    try:
        with kiln.config.patch(suppress_errors=False):
            got = program(kiln.compile(model, backend="eager"))
        stats = kiln.stats()
    finally:
        kiln.reset()
    torch.testing.assert_close(got, want)
    counter = CompileCounter()
    torch._dynamo.reset()
    try:
        program(torch.compile(model, backend=counter))
    finally:
        torch._dynamo.reset()
    assert stats["fallbacks"] == 0 and stats["graph_breaks"] == 0, stats
    assert stats["graphs"] == counter.frame_count, f"kiln {stats}, torch.compile {counter.frame_count}"
