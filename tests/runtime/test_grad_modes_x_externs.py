"""Grad modes x externs x runtime tiers on the default backend: compiled calls are eager's calls.

tests/reliability/test_grad_modes_externs.py pins each extern kind under the grad modes with the
wrapper chosen by hand; this sweep runs what a user runs, `kiln.compile(fn)` with no backend, across
the runtime tiers a graph goes through: its first calls (the Python wrapper), the calls after tier-up
(native_wrapper_after=1, then waiting for the background build), mode="reduce-overhead" (native from
the start), dynamic=True, and a second process served from the disk cache. Each case is a small module
with parameters around one extern (matmuls in every rank, linear, convolutions with stride, dilation and
groups, transposed convolution, attention with a causal flag or a mask, embedding, the norms in train
and eval, pooling, RNNs, index ops, sort/topk, cumsum, fft) called under one grad-mode program (no_grad
around or inside, enable_grad inside no_grad, set_grad_enabled(False) for part, inference_mode around
with inference tensors or inside, outputs that are views of inputs or alias each other, an input
returned unchanged, detach inside, autocast around and inside, a mutated input), with the parameters
and the input requiring grad or not. Three calls each, then a backward without zeroing: output values,
requires_grad, grad_fn, is_leaf, is_inference, the accumulated .grad of the input and every parameter,
the module's buffers, the mutated input, and exceptions (type and first line) are eager's.
CI runs a slice; the whole product is marked slow.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import os
import subprocess
import sys
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.log import KilnWarning
from kiln.runtime import native

pytestmark = pytest.mark.cpp

Factory = Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]


# ------------------------------------------------------------------------------ one module per extern

class _Call(nn.Module):
    """A module whose forward is `body(self, x)`: parameters registered by the factory."""

    def __init__(self, body: Callable[..., torch.Tensor], **members: Any) -> None:
        super().__init__()
        self.body = body
        for name, member in members.items():
            setattr(self, name, member)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self, x)


def _p(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


def _attention(mask: str) -> Factory:
    def body(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        q, k, v = m.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if mask == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(1)
        if mask == "bool":
            keep = torch.ones(6, 6, dtype=torch.bool).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep).sum(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m.bias).sum(1)
    return lambda: (_Call(body, qkv=nn.Linear(16, 48), bias=_p(6, 6)), (torch.randn(2, 6, 16),))


def _rnn(kind: type[nn.Module]) -> Factory:
    return lambda: (_Call(lambda m, x: m.rnn(x)[0], rnn=kind(4, 6, batch_first=True)), (torch.randn(2, 5, 4),))


MODELS: dict[str, Factory] = {
    "mm": lambda: (nn.Linear(8, 6, bias=False), (torch.randn(5, 8),)),
    "addmm": lambda: (nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), (torch.randn(5, 8),)),
    "linear_3d": lambda: (nn.Linear(8, 6), (torch.randn(2, 5, 8),)),
    "bmm": lambda: (_Call(lambda m, x: torch.bmm(x, m.w).relu(), w=_p(3, 8, 5)), (torch.randn(3, 4, 8),)),
    "baddbmm": lambda: (_Call(lambda m, x: torch.baddbmm(m.b, x, m.w), w=_p(3, 8, 5), b=_p(3, 4, 5)),
                        (torch.randn(3, 4, 8),)),
    "matmul_1d_1d": lambda: (_Call(lambda m, x: torch.matmul(x, m.w) * x, w=_p(8)), (torch.randn(8),)),
    "matmul_1d_2d": lambda: (_Call(lambda m, x: torch.matmul(x, m.w), w=_p(8, 4)), (torch.randn(8),)),
    "matmul_2d_1d": lambda: (_Call(lambda m, x: torch.matmul(m.w, x), w=_p(4, 8)), (torch.randn(8),)),
    "matmul_3d_2d": lambda: (_Call(lambda m, x: x @ m.w, w=_p(8, 5)), (torch.randn(3, 4, 8),)),
    "matmul_broadcast": lambda: (_Call(lambda m, x: x @ m.w, w=_p(3, 8, 5)), (torch.randn(2, 1, 4, 8),)),
    "conv1d": lambda: (nn.Conv1d(4, 6, 3, stride=2, padding=1), (torch.randn(2, 4, 24),)),
    "conv2d_dilated_groups": lambda: (nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=2),
                                      (torch.randn(2, 8, 20, 20),)),
    "conv2d_stride": lambda: (nn.Conv2d(8, 16, 3, stride=2), (torch.randn(2, 8, 21, 21),)),
    "conv3d": lambda: (nn.Conv3d(4, 8, 3, padding=1), (torch.randn(1, 4, 8, 8, 8),)),
    "conv_transpose2d": lambda: (nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
                                 (torch.randn(2, 8, 10, 10),)),
    "sdpa_causal": _attention("causal"),
    "sdpa_bool_mask": _attention("bool"),
    "sdpa_float_mask": _attention("float"),
    "embedding": lambda: (_Call(lambda m, x: m.fc(m.emb((x.abs() * 3).long() % 10)) + x.sum(),
                                emb=nn.Embedding(10, 8), fc=nn.Linear(8, 3)), (torch.randn(6),)),
    "layer_norm": lambda: (nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), (torch.randn(4, 8),)),
    "batch_norm_train": lambda: (nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)), (torch.randn(7, 6),)),
    "batch_norm_eval": lambda: (nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)).eval(),
                                (torch.randn(2, 8, 12, 12),)),
    "group_norm": lambda: (nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8)), (torch.randn(2, 4, 10, 10),)),
    "max_pool": lambda: (_Call(lambda m, x: F.max_pool2d(m.conv(x), 2), conv=nn.Conv2d(4, 8, 3)),
                         (torch.randn(2, 4, 12, 12),)),
    "avg_pool": lambda: (_Call(lambda m, x: F.avg_pool2d(m.conv(x), 3, stride=2, padding=1),
                               conv=nn.Conv2d(4, 8, 3)), (torch.randn(2, 4, 12, 12),)),
    "lstm": _rnn(nn.LSTM),
    "gru": _rnn(nn.GRU),
    "index_select": lambda: (_Call(lambda m, x: torch.index_select(m.w, 0, (x.abs() * 2).long() % 6) * x[:, None],
                                   w=_p(6, 5)), (torch.randn(4),)),
    "gather": lambda: (_Call(lambda m, x: torch.gather(m.w * x, 1, torch.tensor([[0, 2], [1, 1], [3, 0]])),
                             w=_p(3, 4)), (torch.randn(3, 4),)),
    "scatter_add": lambda: (_Call(lambda m, x: torch.zeros(3, 4).scatter_add(
        0, torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]), x * m.w), w=_p(2, 4)), (torch.randn(2, 4),)),
    "sort": lambda: (_Call(lambda m, x: torch.sort(x @ m.w, dim=-1)[0], w=_p(6, 6)), (torch.randn(3, 6),)),
    "topk": lambda: (_Call(lambda m, x: torch.topk(x @ m.w, 3, dim=-1).values, w=_p(6, 6)), (torch.randn(3, 6),)),
    "cumsum": lambda: (_Call(lambda m, x: torch.cumsum(x * m.w, 1), w=_p(3, 7)), (torch.randn(3, 7),)),
    "fft": lambda: (_Call(lambda m, x: torch.fft.rfft(x * m.w).abs(), w=_p(4, 16)), (torch.randn(4, 16),)),
    # no extern at all: the compiled forward is Kiln's kernels only, and a training graph's
    # autograd.Function runs it on the caller's tensors with grad mode off (aot.make_autograd_function's
    # forward_grad_free); every grad-mode program must still see eager's results
    "softmax_kernels": lambda: (_Call(lambda m, x: torch.softmax(x * m.w, -1), w=_p(4, 16)), (torch.randn(4, 16),)),
    "pointwise_kernels": lambda: (_Call(lambda m, x: torch.tanh(x * m.w + m.b) * x, w=_p(6), b=_p(6)),
                                  (torch.randn(5, 6),)),
}
# the models whose graphs have no extern (EXTERN_FREE): the grad-free forward's whole matrix runs in CI
EXTERN_FREE = ("softmax_kernels", "pointwise_kernels")


# ------------------------------------------------------------------------------ grad-mode programs
# Each program calls the model inside the compiled function; `around` is the context around the call.

def _plain(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    return m(x)


def _with(context: Callable[[], Any]) -> Callable[..., Any]:
    def program(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
        with context():
            return m(x)
    return program


def _grad_off_for_part(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    with torch.set_grad_enabled(False):
        frozen = m(x)
    return m(x) * 2 + frozen


def _view_of_input(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    return m(x), x[..., :2], x.unsqueeze(0)


def _aliased_outputs(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    y = m(x)
    return y, y, y.view(-1)


def _input_returned(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    return m(x), x


def _detach_inside(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    y = m(x)
    return y.detach() * 3 + y, y.detach()


def _autocast() -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _mutated_input(m: nn.Module, x: torch.Tensor, s: torch.Tensor) -> Any:
    y = m(x)
    s.add_(y.detach().float().mean())
    return y * s.sum()


def _each_step(*contexts: Callable[[], Any]) -> Callable[[], Any]:
    """A context around the call that changes from one call to the next (the same compiled function
    called for training, then evaluation, then training again)."""
    calls = itertools.count()
    return lambda: contexts[next(calls) % len(contexts)]()


# name: (a factory of the context around each call, the program)
MODES: dict[str, tuple[Callable[[], Callable[[], Any]], Callable[..., Any]]] = {
    "default": (lambda: contextlib.nullcontext, _plain),
    "no_grad_around": (lambda: torch.no_grad, _plain),
    "no_grad_inside": (lambda: contextlib.nullcontext, _with(torch.no_grad)),
    "enable_grad_inside_no_grad": (lambda: torch.no_grad, _with(torch.enable_grad)),
    "grad_off_for_part": (lambda: contextlib.nullcontext, _grad_off_for_part),
    "inference_around": (lambda: torch.inference_mode, _plain),
    "inference_inside": (lambda: contextlib.nullcontext, _with(torch.inference_mode)),
    "view_of_input": (lambda: contextlib.nullcontext, _view_of_input),
    "aliased_outputs": (lambda: contextlib.nullcontext, _aliased_outputs),
    "input_returned": (lambda: contextlib.nullcontext, _input_returned),
    "detach_inside": (lambda: contextlib.nullcontext, _detach_inside),
    "autocast_around": (lambda: _autocast, _plain),
    "autocast_inside": (lambda: contextlib.nullcontext, _with(_autocast)),
    "mutated_input": (lambda: contextlib.nullcontext, _mutated_input),
    # per call: the grad mode around it changes; the input's and parameters' requires_grad flip
    "grad_then_no_grad": (lambda: _each_step(contextlib.nullcontext, torch.no_grad), _plain),
    "grad_then_inference": (lambda: _each_step(contextlib.nullcontext, torch.inference_mode), _plain),
    "requires_grad_flips": (lambda: contextlib.nullcontext, _plain),
    # the caller updates the result in place (with grad on), after a training call and an evaluation one
    "result_updated": (lambda: contextlib.nullcontext, _plain),
    "no_grad_result_updated": (lambda: torch.no_grad, _plain),
}
UPDATED = ("result_updated", "no_grad_result_updated")

TIERS = ("first", "tier_up", "reduce_overhead", "dynamic")
GRADS = ((True, True), (True, False), (False, True), (False, False))  # (parameters, input)


# ------------------------------------------------------------------------------ running and comparing

def _facts(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return (tuple(t.shape), t.dtype, t.requires_grad, t.grad_fn is not None, t.is_leaf, t.is_inference())


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _close(got: torch.Tensor, expected: torch.Tensor, bfloat16: bool, where: str) -> None:
    """Element-wise within float32's noise; under autocast, bfloat16 roundings land elsewhere in a
    fused kernel than in eager's op-by-op run, so the whole tensor is compared by its norm."""
    if not bfloat16 or not expected.is_floating_point():
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4, msg=lambda m: f"{where}: {m}")
        return
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape), where
    error = (got.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-6)
    assert error < 2e-2, f"{where}: relative error {error:.3g}"


def _setup(name: str, mode: str, grads: tuple[bool, bool]) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model, (x,) = MODELS[name]()
    model.requires_grad_(grads[0])
    if mode == "inference_around":  # inference tensors as inputs (they cannot require grad)
        with torch.inference_mode():
            x = x.clone()
    else:
        x = x.requires_grad_(grads[1])
    return model, x, torch.zeros(3)


def _steps(fn: Callable[..., Any], model: nn.Module, x: torch.Tensor, s: torch.Tensor, around: Callable[[], Any],
           between: Callable[[int], None], flips: bool, update: bool) -> list[Any]:
    """Three calls, each followed by a backward where an output requires grad (.grad accumulates):
    what each call gave, the gradients after it, the buffers and the mutated input."""
    record: list[Any] = []
    kept: list[torch.Tensor] = []
    for step in range(3):
        between(step)
        if flips:  # frozen for the second call, trainable again for the third
            model.requires_grad_(step != 1)
            x.requires_grad_(step == 1)
        try:
            with around():
                out = _flat(fn(model, x, s))
            if update and out[0].is_floating_point():
                out[0].mul_(torch.full((), 2.0, requires_grad=True))
        except Exception as exc:  # eager's exception is the expected result
            record.append(("raised", type(exc), _gist(exc)))
            continue
        record.append(("facts", [_facts(o) for o in out]))
        record.append(("aliasing", _aliasing(out, [x, s])))
        record.append(("values", [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out]))
        kept.extend(o for o in out if isinstance(o, torch.Tensor))
        losses = [o.float().sin().sum() for o in out
                  if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
        if losses and torch.is_grad_enabled():
            try:
                torch.stack(losses).sum().backward()
            except Exception as exc:
                record.append(("backward raised", type(exc), _gist(exc)))
        leaves = [x, *model.parameters()]
        record.append(("grads", [None if p.grad is None else p.grad.clone() for p in leaves]))
        record.append(("state", [v.clone() for v in model.state_dict().values()] + [s.clone()]))
    # every output kept by the caller still holds its value after the later calls (a planned buffer
    # handed out as an output must not be written again)
    record.append(("kept", [o.detach().clone() for o in kept]))
    return record


def _gist(exc: BaseException) -> str:
    """An exception's message up to its first colon: a version-counter error names the op that saved
    the tensor (a compiled graph's is CompiledFunction, eager's ReluBackward0)."""
    return str(exc).split(":")[0]


def _aliasing(out: list[Any], inputs: list[torch.Tensor]) -> list[Any]:
    """Which outputs are the same object, share storage with another output or an input: eager's
    `return y, y` gives one tensor twice, `x[..., :2]` a view of the input."""
    tensors = [o for o in out if isinstance(o, torch.Tensor)]

    def storage(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()
    same = [[a is b for b in tensors] for a in tensors]
    shared = [[storage(a) == storage(b) for b in tensors + inputs] for a in tensors]
    # whether a result is an autograd view matters for one with no history (an in-place op with
    # grad on refuses a view made under no_grad); a training graph's results are never views
    # (kiln.runtime.aot.not_views), where eager's linear on 3-d input gives one
    return [same, shared, [None if t.requires_grad else t._is_view() for t in tensors]]


def _compare(expected: list[Any], got: list[Any], where: str, bfloat16: bool) -> None:
    assert [e[0] for e in expected] == [g[0] for g in got], f"{where}: {got} where eager gave {expected}"
    for e, g in zip(expected, got):
        kind = e[0]
        if kind in ("raised", "backward raised", "facts", "aliasing"):
            assert g == e, f"{where} {kind}: compiled {g[1:]}, eager {e[1:]}"
            continue
        assert len(e[1]) == len(g[1]), f"{where} {kind}: {len(g[1])} values, eager {len(e[1])}"
        for i, (a, b) in enumerate(zip(e[1], g[1])):
            assert (a is None) == (b is None), f"{where} {kind}[{i}]: compiled {b}, eager {a}"
            if isinstance(a, torch.Tensor):
                _close(b, a, bfloat16, f"{where} {kind}[{i}]")
            else:
                assert a == b, f"{where} {kind}[{i}]: compiled {b}, eager {a}"


def _compiled(program: Callable[..., Any], tier: str) -> Callable[..., Any]:
    if tier == "reduce_overhead":
        return kiln.compile(program, mode="reduce-overhead")
    if tier == "dynamic":
        return kiln.compile(program, dynamic=True)
    return kiln.compile(program)


def check(name: str, mode: str, grads: tuple[bool, bool], tier: str) -> None:
    kiln.reset()
    around, program = MODES[mode]
    model, x, s = _setup(name, mode, grads)
    compiled_model, compiled_x, compiled_s = copy.deepcopy(model), x.detach().clone(), s.clone()
    if mode == "inference_around":
        with torch.inference_mode():
            compiled_x = x.clone()
    compiled_x.requires_grad_(x.requires_grad)
    flips = mode == "requires_grad_flips"
    expected = _steps(program, model, x, s, around(), lambda step: None, flips, mode in UPDATED)

    def settle(step: int) -> None:
        if tier == "tier_up" and step == 1:
            assert native.wait_for_tier_up(600)

    knobs = {"native_wrapper_after": 1} if tier == "tier_up" else {}
    with config.patch(**knobs), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", KilnWarning)
        got = _steps(_compiled(program, tier), compiled_model, compiled_x, compiled_s, around(), settle, flips,
                     mode in UPDATED)
    where = f"{name}/{mode}/params_grad={grads[0]},input_grad={grads[1]}/{tier}"
    _compare(expected, got, where, mode.startswith("autocast"))
    kiln_warnings = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, KilnWarning)]
    assert not kiln_warnings, f"{where}: {kiln_warnings}"
    if mode != "inference_inside":  # a graph break: inference_mode's __exit__ runs eagerly
        assert kiln.stats()["fallbacks"] == 0, where


def _cases() -> list[tuple[str, str, tuple[bool, bool], str]]:
    cases = []
    for name, mode, grads, tier in itertools.product(MODELS, MODES, GRADS, TIERS):
        if mode == "inference_around" and grads[1]:
            continue  # an inference tensor cannot require grad
        if mode == "requires_grad_flips" and grads != (True, True):
            continue  # the flips set both
        cases.append((name, mode, grads, tier))
    return cases


def _id(case: tuple) -> str:
    name, mode, (params, inp), tier = case
    return f"{name}-{mode}-{'P' if params else 'p'}{'X' if inp else 'x'}-{tier}"


ALL = _cases()
# The CI slice: every extern on the first tier under the mode of the first report (no_grad inside,
# parameters and input requiring grad); every mode on one matmul; the bugs the sweep found (a result
# updated in place, a folded BatchNorm's result viewed); every tier on a matmul and an LSTM.
CI = sorted({c for c in ALL if (c[1] == "no_grad_inside" and c[2] == (True, True) and c[3] == "first")
             or (c[0] == "addmm" and c[2] == (True, True) and c[3] == "first")
             or (c[0] in ("matmul_3d_2d", "lstm") and c[1] in UPDATED and c[2] == (True, False) and c[3] == "first")
             or (c[0] == "batch_norm_eval" and c[1] == "aliased_outputs" and c[2] == (False, False)
                 and c[3] == "first")
             or (c[0] in ("addmm", "lstm") and c[1] in ("default", "no_grad_inside") and c[2] == (True, False)
                 and c[3] != "first")
             or (c[0] == "softmax_kernels" and c[2] != (False, False) and c[3] == "first")
             or (c[0] == "pointwise_kernels" and c[2] == (True, True) and c[3] != "first"
                 and c[1] in ("default", "no_grad_around", "no_grad_inside", "view_of_input", "input_returned",
                              "mutated_input"))}, key=ALL.index)


@pytest.mark.parametrize("case", CI, ids=_id)
def test_grad_mode_x_extern_x_tier(case: tuple) -> None:
    check(*case)


def _known(case: tuple) -> str | None:
    """Open bugs the sweep found and this change does not fix (the reason is the report): none now;
    a case that fails again is a regression."""
    return None


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    pytest.param(c, id=_id(c), marks=[pytest.mark.xfail(reason=_known(c), strict=False)] if _known(c) else [])
    for c in ALL if c not in CI])
def test_grad_mode_x_extern_x_tier_full(case: tuple) -> None:
    check(*case)


# ------------------------------------------------------------------------------ the compiled optimizer step

OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
}


# Adam through every tier and grad mode around the step; the others on the first tier in CI
OPTIMIZER_CASES = [pytest.param(optimizer, tier, around, id=f"{optimizer}-{tier}-{around}",
                                marks=[] if optimizer == "adam" or (tier, around) == ("first", "default")
                                else [pytest.mark.slow])
                   for optimizer in OPTIMIZERS for tier in ("first", "tier_up", "reduce_overhead", "dynamic")
                   for around in ("default", "no_grad_around")]


@pytest.mark.parametrize("optimizer, tier, around", OPTIMIZER_CASES)
def test_compiled_optimizer_step(optimizer: str, tier: str, around: str) -> None:
    """Eager forward and backward through a convolution and a matmul, the optimizer's step compiled:
    after three steps the parameters, their gradients and the optimizer's state are eager's, and the
    parameters are still leaves requiring grad."""
    kiln.reset()
    results = []
    for compile_step in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
        opt = OPTIMIZERS[optimizer](list(model.parameters()))
        step = _compiled(lambda: opt.step(), tier) if compile_step else opt.step
        x = torch.randn(2, 3, 8, 8)
        with config.patch(native_wrapper_after=1 if tier == "tier_up" else config.native_wrapper_after):
            for i in range(3):
                opt.zero_grad()
                model(x).square().mean().backward()
                with torch.no_grad() if around == "no_grad_around" else contextlib.nullcontext():
                    step()
                if tier == "tier_up" and i == 0:
                    assert native.wait_for_tier_up(600)
        assert all(p.is_leaf and p.requires_grad for p in model.parameters())
        state = [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        results.append(([p.detach().clone() for p in model.parameters()], [p.grad for p in model.parameters()],
                        state))
    for expected, got in zip(*results):
        assert len(expected) == len(got)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert kiln.stats()["fallbacks"] == 0


# ------------------------------------------------------------------------------ a second process

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WARM_SCRIPT = """
import json, sys, kiln
from tests.runtime import test_grad_modes_x_externs as sweep
name, mode, params, inp = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
sweep.check(name, mode, (params, inp), "first")
print(json.dumps({"disk_hits": kiln.stats()["disk_hits"]}))
"""

WARM = [("addmm", "no_grad_inside", True, True), ("conv2d_stride", "view_of_input", True, True),
        ("sdpa_causal", "enable_grad_inside_no_grad", True, False), ("lstm", "aliased_outputs", True, True),
        ("embedding", "inference_around", True, False), ("layer_norm", "mutated_input", False, True)]


@pytest.mark.parametrize("name, mode, params, inp", [
    pytest.param(*case, id="-".join(map(str, case)), marks=[] if i == 0 else [pytest.mark.slow])
    for i, case in enumerate(WARM)])
def test_second_process_warm_start(tmp_path: Any, name: str, mode: str, params: bool, inp: bool) -> None:
    """The same case in two fresh processes sharing a cache folder: the second serves the frame from
    disk and still gives eager's values, autograd facts and gradients (the check runs inside)."""
    environment = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_PERSISTENT_CACHE": "1",
                   "PYTHONPATH": os.pathsep.join([_REPO, os.environ.get("PYTHONPATH", "")])}
    hits = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _WARM_SCRIPT, name, mode, str(int(params)), str(int(inp))],
                              capture_output=True, text=True, env=environment, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        hits.append(int(proc.stdout.strip().splitlines()[-1].split(":")[1].strip(" }")))
    assert hits[0] == 0 and hits[1] > 0, hits
