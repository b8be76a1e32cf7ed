"""A compiled frame draws from torch's generators as eager does: the same values, and the generator
left where eager leaves it (the next `torch.rand(5)` after the call is eager's), on the eager and
aot_eager backends, with gradients, across graph breaks, recompiles and second calls.

The class this guards: an op that draws (`torch.rand(3)` whose result is dropped, dropout in train
mode, `rrelu`, `multinomial`) removed as dead code, so the next draw differed from eager's; and
symbolic traces (dynamic=True) whose Python decompositions draw otherwise than eager's kernels
(dropout at p=1, a multi-layer RNN's dropout between layers). The programs are in
rng_stream_programs.py. The default backend draws from Kiln's own generator (as torch.compile's
default does, see test_default_backend_stream_is_not_eagers); under `fallback_random` it draws
eager's numbers, checked here for a slice.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

import kiln
from kiln import config
from rng_stream_programs import PROGRAMS
from torch_oracle import torch_graph_count

# what `make test` runs on aot_eager (which captures too); every program runs under -m slow
CI_PROGRAMS = (
    "unused_rand", "unused_randn_then_used", "unused_rand_like_randint", "unused_multinomial", "used_multinomial",
    "unused_dead_inplace", "unused_rand_in_loop", "dropout_unused_train", "dropout_eval_draws_nothing",
    "dropout_edge_probabilities_unused", "alpha_and_feature_dropout", "dropout_modules_train",
    "dropout_modules_eval", "rrelu_train_unused_and_used", "random_on_view_with_offset",
    "inplace_distributions_on_views", "random_integer_draws", "generator_passed_in_unused", "get_set_rng_state_in_frame",
    "draws_in_nested_function", "draws_across_item_break", "draws_in_loop_with_break", "dropout_grad",
    "training_step_with_dropout", "checkpoint_with_dropout", "autograd_function_draws", "gru_dropout_between_layers",
    "unused_vmap_and_func_transforms",
)
# a slice on the eager backend, the grad modes and dynamic=True (the RNN and dropout decompositions)
CI_EAGER = ("unused_rand", "dropout_modules_train", "unused_normal_variants", "draws_across_print_break",
            "fork_rng_in_frame", "generator_made_in_frame")
CI_NO_GRAD = ("dropout_unused_train", "rrelu_train_unused_and_used", "lstm_dropout_between_layers")
CI_INFERENCE = ("gru_dropout_between_layers", "dropout_edge_probabilities")  # composites reach the modes whole
CI_DYNAMIC = ("dropout_edge_probabilities", "gru_dropout_between_layers", "draws_shaped_like_input")


def _cases(ci: tuple[str, ...]) -> list[Any]:
    return [pytest.param(name, marks=() if name in ci else pytest.mark.slow) for name in PROGRAMS]


def _leaves(value: Any) -> list[Any]:
    """Tensors, module parameters and generator states in `value`, flattened."""
    out: list[Any] = []
    for leaf in tree_leaves(value):
        if isinstance(leaf, nn.Module):
            out += list(leaf.parameters())
        elif isinstance(leaf, torch.Generator):
            out.append(leaf.get_state())
        else:
            out.append(leaf)
    return out


def _calls(fn: Callable[..., Any], args: tuple, grad: str, calls: int = 2) -> list[tuple]:
    """Per call: the result, the arguments after it, the next draw of the global generator and the
    gradients of the arguments that require grad (a backward of every result that requires grad)."""
    record = []
    mode = {"enable": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[grad]
    for _ in range(calls):
        with mode():
            result = fn(*args)
        grads: list[Any] = []
        requiring = [t for t in _leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
        if requiring:
            sum(t.sum() for t in requiring).backward()
            inputs = [t for t in _leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]
            grads = [t.grad.clone() if t.grad is not None else None for t in inputs]
            for t in inputs:
                t.grad = None
        record.append((_leaves(result), _leaves(args), torch.rand(5), grads))
    return record


def _same(got: Any, want: Any, exact: bool) -> bool:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return False
        if exact or not want.is_floating_point():
            return torch.equal(got.detach(), want.detach())
        return torch.allclose(got.detach().double(), want.detach().double(), rtol=1e-5, atol=1e-6)
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _same(g, w, exact) for g, w in zip(got, want))
    return bool(got == want)


# Programs that run a frame eagerly (the stream is then eager's by construction): a Generator made
# in the frame breaks the graph there, and the rest of the frame runs eagerly.
EAGER_FRAMES = {"generator_made_in_frame", "generator_made_in_frame_state", "generator_made_in_frame_returned"}


def check_stream(name: str, backend: str, grad: str = "enable", dynamic: bool | None = None,
                 exact: bool = True, eager_frames: frozenset[str] = frozenset()) -> None:
    """Program `name` eager and compiled, each after the same seeds: equal results, arguments,
    gradients and generator state after each of two calls; no frame run eagerly but those known
    (EAGER_FRAMES and `eager_frames`)."""
    fn, make = PROGRAMS[name]
    torch.manual_seed(0)
    eager_args = make()
    torch.manual_seed(1)
    want = _calls(fn, eager_args, grad)
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    torch.manual_seed(0)
    kiln_args = make()
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # LSTM with projections: no oneDNN (both sides)
        got = _calls(compiled, kiln_args, grad)
    for call, (g, w) in enumerate(zip(got, want)):
        for part, label in enumerate(("result", "arguments", "next draw", "gradients")):
            assert _same(g[part], w[part], exact), f"{name}: call {call}: the {label} differ from eager's"
    known = EAGER_FRAMES | eager_frames
    assert not kiln.stats()["fallbacks"] or name in known, kiln.stats()


@pytest.mark.parametrize("name", _cases(CI_PROGRAMS))
def test_stream_aot_eager(name: str) -> None:
    check_stream(name, "aot_eager")


@pytest.mark.parametrize("name", _cases(CI_EAGER))
def test_stream_eager(name: str) -> None:
    check_stream(name, "eager")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", _cases(CI_NO_GRAD))
def test_stream_under_no_grad(name: str, backend: str) -> None:
    check_stream(name, backend, grad="no_grad")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", _cases(CI_INFERENCE))
def test_stream_under_inference_mode(name: str, backend: str) -> None:
    # Under inference_mode a composite op reaches AOT's tracer whole, below functionalization: the
    # in-place draws of alpha/feature dropout, rrelu and `dropout_` then fail its checks and the
    # frame runs eagerly (one warning). A GRU is decomposed in Python there: h an ulp off eager's.
    below_functionalization = frozenset({
        "alpha_and_feature_dropout", "dropout_inplace_on_input", "dropout_on_view_with_offset",
        "dropout_modules_train", "dropout_modules_eval", "rrelu_train_unused_and_used", "rrelu_grad",
        "alpha_dropout_grad"})
    check_stream(name, backend, grad="inference", exact=backend == "eager", eager_frames=below_functionalization)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", _cases(CI_DYNAMIC))
def test_stream_dynamic(name: str, backend: str) -> None:
    # vmap of dropout with symbolic sizes: numel() refused on the batched fake, the frame runs eagerly
    check_stream(name, backend, dynamic=True,
                 eager_frames=frozenset({"vmap_randomness_same", "unused_vmap_and_func_transforms"}))


def test_stream_dynamic_lstm_without_onednn() -> None:
    check_stream("lstm_proj", "eager", dynamic=True)  # the capture's fake run decomposes it; the rest: -m slow


# ---------------------------------------------------------------------------- the default backend
FALLBACK_RANDOM_CI = ("unused_rand", "random_on_view_with_offset", "dropout_modules_train")


@pytest.mark.cpp
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FALLBACK_RANDOM_CI else pytest.mark.slow)
                                  for n in PROGRAMS if not n.startswith("generator_made_in_frame")])
def test_stream_inductor_fallback_random(name: str) -> None:
    # kernels fuse the arithmetic around a draw: values within rounding, the draws themselves exact
    with config.patch(fallback_random=True):
        check_stream(name, "inductor", exact=False)


@pytest.mark.cpp
def test_default_backend_stream_is_not_eagers() -> None:
    """Without fallback_random, draws come from Kiln's own generator, as torch.compile's default
    draws from Inductor's (neither promises eager's numbers or eager's generator state after the
    call); the program's own arithmetic is still eager's."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.rand(256)
        return x + noise, (noise >= 0) & (noise < 1)

    kiln.reset()
    torch.manual_seed(0)
    want = fn(torch.zeros(256))[0]
    torch.manual_seed(0)
    got, in_range = kiln.compile(fn)(torch.zeros(256))
    assert bool(in_range.all()) and not torch.equal(got, want)


# ---------------------------------------------------------------------------- which ops stay
def _graph_targets(fn: Callable[..., Any], *args: Any) -> list[Any]:
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    kiln.compile(fn, backend=backend)(*args)
    return [n.target for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"]


def test_unused_draws_stay_in_the_graph() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch.rand(3)
        F.dropout(x, 0.5, True)
        F.dropout(x, 0.5, False)  # draws nothing: dead code
        F.dropout(x, 0.0, True)  # nor this
        x.sin()
        return x + 1

    targets = _graph_targets(fn, torch.ones(4))
    assert targets.count(torch.rand) == 1 and targets.count(F.dropout) == 1 and torch.sin not in targets


def test_second_call_and_recompiles_advance_as_eager() -> None:
    """Each call of a compiled frame draws as eager's call: a second call, a recompile for a new
    shape, the first graph reused, and a module switched to eval (no draw) and back to train."""
    def fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        torch.rand(2)
        return m(x) + torch.rand(x.shape[-1])

    def run(f: Callable[..., Any]) -> list[torch.Tensor]:
        torch.manual_seed(3)
        m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
        seen = []
        for shape, train in (((2, 4), True), ((2, 4), True), ((5, 4), True), ((2, 4), False), ((2, 4), True)):
            m.train(train)
            seen += [f(m, torch.ones(shape)).detach(), torch.rand(3)]
        return seen

    want = run(fn)
    kiln.reset()
    got = run(kiln.compile(fn, backend="aot_eager", dynamic=False))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert kiln.stats()["recompiles"] >= 2


def test_graph_counts_match_dynamo() -> None:
    """Draws do not cost graphs: as many as the real Dynamo makes."""
    for name in ("unused_rand", "dropout_modules_train", "draws_across_item_break", "manual_seed_in_frame"):
        fn, make = PROGRAMS[name]
        kiln.reset()
        backend = kiln.backends.CountingBackend()
        kiln.compile(fn, backend=backend)(*make())
        assert backend.frame_count == torch_graph_count(fn, [make()]), name
