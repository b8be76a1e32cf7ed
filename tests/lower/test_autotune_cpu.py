"""mode="max-autotune" on CPU (kiln.lower.autotune_cpu): the graph's variants are compiled, timed on
the first call on copies of its inputs, the fastest runs from then on, and it is what the cache holds
for a later compile of the same graph. Every variant computes eager's result."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.lower import compile_graph
from kiln.lower.autotune_cpu import AutotunedGraph, linear_onednn_rewrite, variants_for
from tests.lower.conftest import aten_graph

aten = torch.ops.aten
AUTOTUNE = {"mode": "max-autotune"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: a stored winner from an earlier run would skip the timing."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))


def mlp(x, w1, b1, w2, b2, w3, b3):
    h = torch.relu(torch.nn.functional.linear(x, w1, b1))
    h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w2, b2), approximate="tanh")
    return torch.nn.functional.linear(h, w3, b3) * 2  # no activation: oneDNN's linear alone


def _mlp_args():
    g = torch.Generator().manual_seed(0)
    shapes = [(8, 32), (64, 32), (64,), (48, 64), (48,), (16, 48), (16,)]
    return [torch.randn(s, generator=g) / 4 for s in shapes]


def test_rewrite_fuses_each_activation_into_onednn_linear():
    gm, _ = aten_graph(mlp, *_mlp_args())
    assert linear_onednn_rewrite(gm) == 3
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    fused = [(n.args[3], n.args[5]) for n in calls if n.target is torch.ops.mkldnn._linear_pointwise.default]
    assert fused == [("relu", None), ("gelu", "tanh"), ("none", None)]
    assert not any(n.target in (aten.addmm.default, aten.relu.default, aten.gelu.default) for n in calls)


@pytest.mark.parametrize("variant", ["default", "linear_onednn"])
def test_each_variant_matches_eager(variant):
    args = _mlp_args()
    gm, examples = aten_graph(mlp, *args)
    compiled = compile_graph(gm, examples, options={"cpu_variant": variant})
    assert ("mkldnn" in compiled.wrapper_source) == (variant == "linear_onednn")
    torch.testing.assert_close(compiled(*args)[0], mlp(*args), atol=1e-5, rtol=1e-5)


def test_first_call_times_the_variants_and_the_winner_is_stored():
    args = _mlp_args()
    gm, examples = aten_graph(mlp, *args)
    compiled = compile_graph(gm, examples, options=AUTOTUNE)
    tuned = compiled.fn
    assert isinstance(tuned, AutotunedGraph) and tuned.winner is None
    torch.testing.assert_close(compiled(*args)[0], mlp(*args), atol=1e-5, rtol=1e-5)
    assert set(tuned.times) == {"default", "linear_onednn"} and tuned.winner in tuned.times
    assert tuned.times[tuned.winner] == min(tuned.times.values())
    # a later compile of the same graph (another process) loads the winner, without timing again
    again = compile_graph(gm, examples, options=AUTOTUNE)
    assert "cache_load" in again.timings and not isinstance(again.fn, AutotunedGraph)
    assert again.wrapper_source == tuned.candidates[tuned.winner].wrapper_source
    torch.testing.assert_close(again(*args)[0], mlp(*args), atol=1e-5, rtol=1e-5)


def test_inputs_are_mutated_once_by_the_winner_only():
    def fn(x, w, b, counter):
        counter.add_(1)
        return (torch.relu(torch.nn.functional.linear(x, w, b)),)

    args = _mlp_args()[:3] + [torch.zeros(3)]
    gm, examples = aten_graph(fn, *[a.clone() for a in args])
    compiled = compile_graph(gm, examples, options=AUTOTUNE)
    assert isinstance(compiled.fn, AutotunedGraph)
    counter = args[3]
    compiled(*args)
    assert counter.tolist() == [1.0, 1.0, 1.0] and len(compiled.fn.times) == 2


def test_graphs_without_alternatives_compile_once():
    gm, examples = aten_graph(lambda x: (x.sin() + 1,), torch.randn(8))
    assert variants_for(gm) == ["default"]
    assert not isinstance(compile_graph(gm, examples, options=AUTOTUNE).fn, AutotunedGraph)


def test_small_cnn_tries_onednn_convolutions_and_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = kiln.compile(model, mode="max-autotune")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
