"""The plain-function half of the end-to-end corpus: code shaped like training scripts' helpers.

Functions with config dataclasses and namedtuples, closures and factories, helpers calling helpers,
keyword arguments with defaults, globals, comprehensions, no_grad regions, in-place updates of
inputs, dict inputs, dict/list/tuple outputs, changes of dtype, constants and sizes that make the
real torch.compile recompile, and a few programs with graph breaks (print, .item(), numpy).
"""
from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from e2e_harness import Program, case

EPS = 1e-5
ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


def _randn(*shape: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@dataclass(frozen=True)
class FFNConfig:
    activation: str = "gelu"
    scale: float = 0.5
    use_bias: bool = True


def feed_forward(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, cfg: FFNConfig) -> torch.Tensor:
    h = x @ w1
    if cfg.use_bias:
        h = h + b1
    h = ACTIVATIONS[cfg.activation](h)
    return (h @ w2) * cfg.scale


@case()
def ffn_with_config_dataclass() -> Program:
    x, w1, b1, w2 = _randn(4, 8), _randn(8, 16, seed=2), _randn(16, seed=3), _randn(16, 8, seed=4)
    calls = [
        ((x, w1, b1, w2, FFNConfig()), {}),
        ((x, w1, b1, w2, FFNConfig()), {}),  # an equal config: no recompile
        ((x, w1, b1, w2, FFNConfig(activation="silu", use_bias=False)), {}),
    ]
    return Program(feed_forward, calls)


def manual_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + EPS) * weight + bias


@case()
def layer_norm_by_hand() -> Program:
    return Program(manual_layer_norm, [((_randn(3, 4, 10), _randn(10, seed=2), _randn(10, seed=3)), {})])


def make_scaled_activation(alpha: float, shift: torch.Tensor):
    def activation(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x * alpha, torch.expm1(x)) + shift

    return activation


@case()
def closure_over_float_and_tensor() -> Program:
    return Program(make_scaled_activation(1.5, _randn(6, seed=9)), [((_randn(4, 6),), {})])


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def _project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _normalize(x @ w)


def _similarity(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _project(a, w) @ _project(b, w).transpose(0, 1)


@case()
def helpers_calling_helpers() -> Program:
    return Program(_similarity, [((_randn(5, 8), _randn(7, 8, seed=2), _randn(8, 4, seed=3)), {})])


def scaled_dot(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
               scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.dropout(scores.softmax(-1), p=dropout_p, training=dropout_p > 0)
    return weights @ v


@case()
def kwargs_defaults_and_none() -> Program:
    q, k, v = _randn(2, 5, 4), _randn(2, 5, 4, seed=2), _randn(2, 5, 4, seed=3)
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    calls = [((q, k, v), {}), ((q, k, v, mask), {}), ((q, k, v), {"mask": mask, "scale": 0.25}), ((q, k, v), {})]
    return Program(scaled_dot, calls)


def add_into(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    x.clamp_(max=1.0)
    return x * 2


@case()
def inplace_on_input() -> Program:
    x = _randn(3, 4)
    return Program(add_into, [((x, _randn(3, 4, seed=2)), {})], state=lambda: x)


def summarize(x: torch.Tensor) -> dict:
    return {"mean": x.mean(), "max": x.amax(dim=0), "centered": [x - x.mean(), (x.min(), x.max())]}


@case()
def returns_dict_list_tuple() -> Program:
    return Program(summarize, [((_randn(4, 3),), {})])


Stats = namedtuple("Stats", ["mean", "std"])


def moments(x: torch.Tensor) -> Stats:
    return Stats(x.mean(0), x.std(0))


@case()
def returns_namedtuple() -> Program:
    return Program(moments, [((_randn(6, 3),), {})])


def masked_mean(batch: dict) -> torch.Tensor:
    weights = batch["mask"].to(batch["x"].dtype)
    return (batch["x"] * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True)


@case()
def dict_input() -> Program:
    batch = {"x": _randn(2, 5, 3), "mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)}
    return Program(masked_mean, [((batch,), {})])


def chunk_mix(x: torch.Tensor) -> torch.Tensor:
    parts = [c * (i + 1) for i, c in enumerate(x.chunk(4, dim=-1))]
    return torch.cat(parts[::-1], dim=-1) + sum(p.sum() for p in parts)


@case()
def comprehension_over_chunks() -> Program:
    return Program(chunk_mix, [((_randn(3, 8),), {})])


def clip_by_max(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        limit = x.abs().amax() * 0.5
    return torch.maximum(torch.minimum(x, limit), -limit) * 2


@case()
def no_grad_region_with_grads() -> Program:
    x = _randn(4, 4).requires_grad_()
    return Program(clip_by_max, [((x,), {})], backward=True, grads_of=[x])


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


@case(tol=1e-5)
def dtype_change_recompiles() -> Program:
    calls = [
        ((_randn(2, 6), _randn(6, seed=2)), {}),
        ((_randn(2, 6, dtype=torch.float64), _randn(6, seed=2, dtype=torch.float64)), {}),
        ((_randn(2, 6, seed=5), _randn(6, seed=2)), {}),
    ]
    return Program(rms_norm, calls)


def activation_by_name(x: torch.Tensor, name: str, slope: int) -> torch.Tensor:
    return getattr(F, name)(x) * slope


@case()
def constants_recompile() -> Program:
    x = _randn(3, 3)
    calls = [((x, "relu", 2), {}), ((x, "relu", 2), {}), ((x, "silu", 2), {}), ((x, "relu", 3), {}), ((x, "relu", 4), {})]
    return Program(activation_by_name, calls)


def pad_and_pool(x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    x = F.pad(x, (0, 0, 0, (4 - t % 4) % 4))
    return x.view(b, -1, 4, c).mean(2)


@case()
def shape_arithmetic_varying_length() -> Program:
    return Program(pad_and_pool, [((_randn(2, t, 3, seed=t),), {}) for t in (8, 6, 9, 12)])


def noisy_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ w)
    print("hidden norm computed")
    return h.sum(-1)


@case(breaks=True)
def print_in_middle() -> Program:
    return Program(noisy_step, [((_randn(3, 4), _randn(4, 4, seed=2)), {})] * 2)


def threshold_by_item(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


@case(breaks=True)
def item_control_flow() -> Program:
    return Program(threshold_by_item, [((_randn(4),), {}), ((-_randn(4) - 10,), {})])


def numpy_in_the_middle(x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x)
    factor = float(np.sqrt(16.0))
    return h * factor + 1


@case(breaks=True)
def numpy_call() -> Program:
    return Program(numpy_in_the_middle, [((_randn(5),), {})])


def log_every_step(xs: list, w: torch.Tensor) -> list:
    out = []
    for i, x in enumerate(xs):
        y = x @ w
        print(f"step {i}")
        out.append(y.relu())
    return out


@case(breaks=True)
def print_in_loop() -> Program:
    xs = [_randn(2, 3, seed=s) for s in range(3)]
    return Program(log_every_step, [((xs, _randn(3, 3, seed=7)), {})])
