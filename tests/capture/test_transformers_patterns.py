"""More patterns from real `transformers` model code (the wider corpus of tests/e2e/real_models.py:
DeBERTa-v2, CLIP, SegFormer, Mixtral, BERT-style losses), each reduced to plain PyTorch, as in
test_real_model_patterns.py: every test here failed before the Kiln fix its comment names (a
graph break torch.compile does not take, a frame that ran eagerly, or a wrong answer)."""
from __future__ import annotations

import collections.abc
import functools
import threading
import typing

import pytest
import torch

import kiln
from tests.capture.test_real_model_patterns import _explain


def _scale_list(x, args):
    return x * len(args)


def _scale_union(x, args):
    return x + 1.0


# huggingface_hub's dataclass validation (run by `config.problem_type = ...` in BERT-style loss
# code) looks the validator up in a module-level dict keyed by classes and typing special forms.
_VALIDATORS = {typing.Union: _scale_union, list: _scale_list, collections.abc.Sequence: _scale_list}


def _validate(x, expected):
    validator = _VALIDATORS.get(typing.get_origin(expected))
    if validator is not None:
        x = validator(x, typing.get_args(expected))
    by_type = {int: 2.0, float: 3.0}
    return x * by_type[type(1.5)] + (list in _VALIDATORS)


def test_dict_keyed_by_classes_is_traced():
    # The builder wrapped only dicts whose keys are Python literals; `.get` on the class-keyed dict
    # was a graph break (one extra graph in BERT/DistilBERT/ViT training vs torch.compile).
    x = torch.randn(3)
    for expected in (typing.Optional[int], list[int], int):
        want = _validate(x, expected)
        kiln.reset()
        torch.testing.assert_close(kiln.compile(_validate, backend="eager")(x, expected), want)
        out = _explain(_validate, x, expected)
        assert out.graph_count == 1 and out.graph_break_count == 0, out


def test_dict_keyed_by_classes_guards_its_values():
    # The values of a class-keyed global dict are read through their position: replacing one
    # must invalidate the graph, not run the old validator.
    x = torch.randn(3)
    kiln.reset()
    compiled = kiln.compile(_validate, backend="eager")
    torch.testing.assert_close(compiled(x, list[int]), _validate(x, list[int]))
    old = _VALIDATORS[list]
    _VALIDATORS[list] = _scale_union
    try:
        torch.testing.assert_close(compiled(x, list[int]), _validate(x, list[int]))
    finally:
        _VALIDATORS[list] = old
        kiln.reset()


def _labeled_loss(logits, labels):
    # DeBERTa-v2's classification loss: keep the rows whose label is >= 0, if there are any.
    label_index = (labels >= 0).nonzero()
    labels = labels.long()
    if label_index.size(0) > 0:
        picked = torch.gather(logits, 0, label_index.expand(label_index.size(0), logits.size(1)))
        return torch.nn.functional.cross_entropy(picked, torch.gather(labels, 0, label_index.view(-1)))
    return logits.sum() * 0


def test_branch_on_a_nonzero_length_breaks_at_the_nonzero():
    # The branch on nonzero's unbacked length could not be decided and the comparison is no place
    # for a break: the whole frame ran eagerly. Now the capture breaks at nonzero, as torch.compile
    # does by default, and the resume function sees a real size.
    logits, labels = torch.randn(2, 3), torch.tensor([0, 2])
    out = _explain(_labeled_loss, logits, labels)
    assert not out.fallbacks, out
    assert out.graph_count == 2 and out.graph_break_count == 1, out
    assert "nonzero" in out.break_reasons[0].reason, out
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        leaf = logits.clone().requires_grad_()
        got = kiln.compile(_labeled_loss, backend=backend)(leaf, labels)
        got.backward()
        want_leaf = logits.clone().requires_grad_()
        want = _labeled_loss(want_leaf, labels)
        want.backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(leaf.grad, want_leaf.grad)
    kiln.reset()


def _pooled_record():
    import dataclasses

    import pytest
    generic = pytest.importorskip("transformers.utils.generic")

    @dataclasses.dataclass
    class Pooled(generic.ModelOutput):
        last_hidden_state: torch.Tensor | None = None
        pooler_output: torch.Tensor | None = None

    return Pooled


def test_model_output_field_assignment_is_traced():
    # CLIP's get_text_features: `out.pooler_output = self.text_projection(out.pooler_output)` was
    # an unsupported setattr (a break per tower).
    Pooled = _pooled_record()
    lin = torch.nn.Linear(4, 3)

    def features(x):
        out = Pooled(last_hidden_state=x * 2, pooler_output=x.sum(0))
        out.pooler_output = lin(out.pooler_output)
        return out

    def head(x):
        out = features(x)
        return out.pooler_output * 3, out[1], out["last_hidden_state"] + 1

    x = torch.randn(2, 4)
    out = _explain(head, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    for got, want in zip(kiln.compile(head, backend="eager")(x), head(x)):
        torch.testing.assert_close(got, want)
    kiln.reset()


def test_model_output_rebuilt_at_a_break_is_one_object():
    # The glue rebuilt a record with one constructor call per place holding it: the native
    # store after the break went to a copy, and the caller read the old field (a wrong answer).
    Pooled = _pooled_record()

    def features(x):
        out = Pooled(last_hidden_state=x * 2, pooler_output=x.sum(0))
        out.extra = x + 1  # not a field: a break at the store, with `out` on the stack and in a local
        return out, out.extra * 2

    x = torch.randn(2, 4)
    kiln.reset()
    (got, got_extra), (want, want_extra) = kiln.compile(features, backend="eager")(x), features(x)
    torch.testing.assert_close(got_extra, want_extra)
    torch.testing.assert_close(got.extra, want.extra)
    torch.testing.assert_close(got["pooler_output"], want["pooler_output"])
    kiln.reset()


def _by_device(x):
    # transformers' MoE experts: `histc` wants float input on CPU, int elsewhere.
    kind = x.device.type
    if kind in ("cpu", "mps") and kind != "cuda":
        return x.float() + 1
    return x.int() + 2


def test_in_compares_equal_strings_that_are_not_the_same_object():
    # `in` on a tuple compared by identity first and, identity being known (False), never by
    # value: device.type ("cpu", a fresh string) was not found in ("cpu", "mps"): a wrong branch.
    x = torch.randn(3)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_by_device, backend="eager")(x), _by_device(x))
    kiln.reset()


class _Gelu(torch.nn.Module):
    def __init__(self, use_tanh: bool = False):
        super().__init__()
        self.approximate = "tanh" if use_tanh else "none"

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate=self.approximate)


_BUILT = []


class _Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _BUILT.append(1)  # a side effect: constructing it at trace time would skip it at run time

    def forward(self, x):
        return x * len(_BUILT)


class _Instantier(collections.OrderedDict):
    """transformers' ACT2FN: `ACT2FN[name]` builds a fresh activation module in __getitem__."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


_ACTS = _Instantier({"gelu": _Gelu, "gelu_tanh": (_Gelu, {"use_tanh": True}), "counted": _Counted})


def _pool(x, act):
    return _ACTS[act](x.sum(0)) + 1


def test_python_module_built_in_forward_from_a_dict_subclass_is_traced():
    # DeBERTa-v2's pooler calls ACT2FN[...] in forward. The value read through super().__getitem__
    # was guarded through `ACT2FN[key]`, which builds a new instance (the guards of a fresh capture
    # failed, and the frame ran eagerly), and constructing a Python nn.Module was a break.
    x = torch.randn(2, 3)
    for act in ("gelu", "gelu_tanh"):
        out = _explain(_pool, x, act)
        assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
        kiln.reset()
        torch.testing.assert_close(kiln.compile(_pool, backend="eager")(x, act), _pool(x, act))
    kiln.reset()


def test_python_module_whose_init_has_side_effects_is_not_built_at_trace_time():
    x = torch.randn(2, 3)
    _BUILT.clear()
    kiln.reset()
    compiled = kiln.compile(_pool, backend="eager")
    for _ in range(3):
        got = compiled(x, "counted")
    torch.testing.assert_close(got, x.sum(0) * 3 + 1)
    assert len(_BUILT) == 3
    kiln.reset()


class _Collector:
    """transformers' CompileableContextVar: while compiling, a plain attribute holds the dict
    that the output-capturing hooks append to."""

    def __init__(self):
        self.value = None


_COLLECTOR = _Collector()


def _capture_hook(module, args, output):
    collected = _COLLECTOR.value
    if collected is None:
        return None
    collected["hidden_states"].append(output)
    return None


def _scale_pre_hook(module, args):
    return (args[0] * 2,)


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        for layer in self.layers:
            layer.register_forward_hook(_capture_hook)
        self.layers[0].register_forward_pre_hook(_scale_pre_hook)

    def forward(self, x):
        collected = {"hidden_states": []}
        _COLLECTOR.value = collected
        for layer in self.layers:
            x = layer(x).relu()
        _COLLECTOR.value = None
        return x, tuple(collected["hidden_states"])


def test_forward_hooks_and_pre_hooks_are_inlined():
    # transformers installs forward hooks to collect hidden states (output_hidden_states=True, and
    # always for backbones such as SegFormer's); calling a module with hooks was a break per layer.
    model, x = _Stack(), torch.randn(2, 4)
    out = _explain(model, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    got, want = kiln.compile(model, backend="eager")(x), model(x)
    torch.testing.assert_close(got, want)
    handle = model.layers[1].register_forward_hook(lambda m, a, o: o * 0)  # a new hook: guards fail
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x), model(x))
    handle.remove()
    kiln.reset()


_INSTALL_LOCK = threading.Lock()
_REENTRANT = threading.RLock()
_HELD: list[tuple[bool, bool]] = []


@kiln.disable
def _note_held(x):
    _HELD.append((_INSTALL_LOCK.locked(), _REENTRANT._is_owned()))
    if x.sum() > 1e6:
        raise ValueError("too large")


class _Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)


def _install_once(model, x):
    # transformers' maybe_install_capturing_hooks: a double-checked flag under a module-level lock
    if not getattr(model, "_installed", False):
        with _INSTALL_LOCK:
            if not getattr(model, "_installed", False):
                model._installed = True
    with _REENTRANT:
        with _REENTRANT:
            y = model.lin(x) * 2
    return y


def _break_inside(x):
    y = x + 1
    with _INSTALL_LOCK:
        y = y * 2
        with _REENTRANT:
            _note_held(y)
            y = y - 1
        y = y + 3
    return y


def test_with_lock_is_a_context_manager_in_the_trace():
    # `with lock:` on a threading lock was no context manager the tracer knew: the frame ran eagerly
    # (BERT with output_attentions and SegFormer install their hooks under one). torch.compile's
    # Dynamo models the lock as a manager that does nothing in the compiled code; so does Kiln.
    model, x = _Flagged(), torch.randn(2, 4)
    out = _explain(_install_once, model, x)
    assert not out.fallbacks and out.graph_count == 1 and out.graph_break_count == 0, out
    assert model._installed is True  # the side effect under the lock happened
    kiln.reset()
    fresh = _Flagged()
    got = kiln.compile(_install_once, backend="eager")(fresh, x)
    torch.testing.assert_close(got, fresh.lin(x) * 2)
    assert fresh._installed is True
    assert not _INSTALL_LOCK.locked() and not _REENTRANT._is_owned()
    kiln.reset()


def test_a_break_inside_with_lock_runs_natively_holding_the_lock():
    # What a graph break runs natively inside the block holds the real lock (the glue takes it, the
    # resume function releases it at the block's end), also when that code raises.
    x = torch.randn(3)
    _HELD.clear()
    kiln.reset()
    try:
        compiled = kiln.compile(_break_inside, backend="eager")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), _break_inside(x))
            assert not _INSTALL_LOCK.locked() and not _REENTRANT._is_owned()
        assert _HELD == [(True, True)] * 6  # three compiled calls and three eager ones
        with pytest.raises(ValueError, match="too large"):
            compiled(torch.full((3,), 1e7))
        assert not _INSTALL_LOCK.locked() and not _REENTRANT._is_owned()
        assert kiln.stats()["fallbacks"] == 0
    finally:
        kiln.reset()
    out = _explain(_break_inside, x)
    assert not out.fallbacks, out
    assert any("with lock" in b.reason for b in out.break_reasons), out


_PROBES: list[str] = []


def _constant_result(fn):
    # transformers' _make_compile_constant: torch._dynamo.assume_constant_result without torch
    fn._dynamo_marked_constant = True
    return fn


@functools.lru_cache
@_constant_result
def _backend_available(name="dist"):
    _PROBES.append(name)  # a probe with a side effect: eager runs it once per process
    return len(name) == 4


@functools.lru_cache(maxsize=None)
def _scale_for(kind):
    return {"half": 0.5, "double": 2.0}[kind]


class _Cached:
    @functools.lru_cache
    def factor(self, k):
        return k + 1


def _probe_then_scale(x, cached):
    if not _backend_available():
        x = x + 1
    if _backend_available("tcp"):
        x = x - 1
    return x * _scale_for("half") * cached.factor(2)


def test_lru_cache_wrappers_are_stepped_past():
    # A call to a functools.lru_cache wrapper (transformers' is_torch_distributed_available, asked by
    # Wav2Vec2's encoder) was a graph break: 4 graphs where torch.compile has 1. As Dynamo does, the
    # wrapped function is traced; one marked as having a constant result is called for real.
    import torch._dynamo

    x, cached = torch.randn(3), _Cached()
    torch._dynamo.reset()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns once about tracing past the cache
        want = torch._dynamo.explain(_probe_then_scale)(x, cached)
    torch._dynamo.reset()
    out = _explain(_probe_then_scale, x, cached)
    assert not out.fallbacks and out.graph_count == want.graph_count == 1 and out.graph_break_count == 0, out
    _PROBES.clear()
    _backend_available.cache_clear()
    kiln.reset()
    try:
        compiled = kiln.compile(_probe_then_scale, backend="eager")
        for _ in range(3):
            torch.testing.assert_close(compiled(x, cached), _probe_then_scale(x, cached))
        assert _PROBES == ["dist", "tcp"]  # the probes ran once each, as eager's cache has it
    finally:
        kiln.reset()


@_constant_result
def _marked_size(t):
    return t.shape[0]


def _marked_with_a_tensor(x):
    return x * _marked_size(x)


def test_constant_result_function_with_a_tensor_argument_breaks():
    # The mark promises a constant answer for constant arguments; a tensor argument is not one.
    x = torch.randn(3)
    out = _explain(_marked_with_a_tensor, x)
    assert any("constant result" in b.reason for b in out.break_reasons), out
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_marked_with_a_tensor, backend="eager")(x), x * 3)
    kiln.reset()


class _ChunkConfig:
    lengths = (4, 8)


def _padded_length(x, config):
    # Reformer: np.lcm gives a numpy int64; `%` with an int and `!=` give numpy scalars
    import numpy as np

    multiple = np.lcm(*config.lengths)
    if x.shape[-1] % multiple != 0:
        pad = int(multiple - x.shape[-1] % multiple)
        x = torch.nn.functional.pad(x, (0, pad))
    return x * 2, multiple


def test_numpy_scalars_are_constants():
    # `constant 8 % int64 object` broke the graph and the resumed frame ran eagerly ('truth value
    # of bool object', a numpy bool): Reformer captured 2 ops in 1 graph where torch.compile has 148.
    config = _ChunkConfig()
    for x in (torch.randn(2, 8), torch.randn(2, 6)):
        out = _explain(_padded_length, x, config)
        assert not out.fallbacks and out.graph_count == 1 and out.graph_break_count == 0, out
        kiln.reset()
        got, want = kiln.compile(_padded_length, backend="eager")(x, config), _padded_length(x, config)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is type(want[1])
    kiln.reset()


_Output = collections.namedtuple("_Output", ["hidden", "probs"])


class _Cache:
    def __init__(self):
        self.states = []

    def __len__(self):
        return len(self.states)


def _layer_outputs(x, layer_id):
    import os

    out = _Output(x * 2, None)
    cache = _Cache()
    if hasattr(out, "buckets"):  # a namedtuple without that field: False, as in eager
        x = x + out.buckets
    if len(cache) <= layer_id and not cache:
        x = x + 1
    if os.getenv("KILN_TEST_UNSET_FLAG", "0") == "1":
        x = x - 1
    return out.hidden + x


def test_namedtuple_hasattr_len_of_a_new_object_and_getenv():
    # hasattr on a namedtuple answered True for any name (a bound method stood in); len() and the
    # truth value of an object built in the frame with a Python __len__ broke; os.getenv was a call
    # to a stdlib function (Reformer's layers, transformers' torch_check).
    x = torch.randn(3)
    out = _explain(_layer_outputs, x, 0)
    assert not out.fallbacks and out.graph_count == 1 and out.graph_break_count == 0, out
    kiln.reset()
    try:
        torch.testing.assert_close(kiln.compile(_layer_outputs, backend="eager")(x, 0), _layer_outputs(x, 0))
    finally:
        kiln.reset()


class _Reversible(torch.autograd.Function):
    # Reformer's _ReversibleFunction: a forward that cannot be traced whole (it reseeds the RNG)
    @staticmethod
    def forward(ctx, x, layers):
        for scale in layers:
            torch.manual_seed(0)
            x = x * scale + torch.rand(x.shape)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _reversible_layers(x, layers, cache):
    if len(cache) > 0 and cache:  # a cache object passed in, with a Python __len__
        x = x + 1
    return _Reversible.apply(x.sin(), layers).cos()


def test_autograd_function_applied_without_grad_is_captured_frame_by_frame():
    # An autograd.Function whose forward breaks ran natively as a whole, uncompiled (Reformer: 27 ops
    # captured where torch.compile has 148). With grad mode off, apply is its forward on a fresh ctx:
    # the glue calls the forward as a frame of its own, which is captured up to its breaks.
    x, layers, cache = torch.randn(3), (2.0, 3.0), _Cache()
    cache.states.append(1)
    with torch.no_grad():
        want = _reversible_layers(x, layers, cache)
        out = _explain(_reversible_layers, x, layers, cache)
        assert not out.fallbacks, out
        assert out.op_count >= 4 and any("manual_seed" in b.reason for b in out.break_reasons), out
        kiln.reset()
        try:
            compiled = kiln.compile(_reversible_layers, backend="eager")
            torch.testing.assert_close(compiled(x, layers, cache), want)
            torch.testing.assert_close(compiled(x, layers, cache), want)
        finally:
            kiln.reset()
    # with grad on, apply is called as it is, and its backward is eager's
    leaf = x.clone().requires_grad_()
    kiln.reset()
    try:
        got = kiln.compile(_reversible_layers, backend="eager")(leaf, layers, cache)
        got.sum().backward()
        ref = x.clone().requires_grad_()
        _reversible_layers(ref, layers, cache).sum().backward()
        torch.testing.assert_close(leaf.grad, ref.grad)
    finally:
        kiln.reset()


_CUDNN_SEEN: list[bool] = []


@kiln.disable
def _note_cudnn_enabled() -> None:
    _CUDNN_SEEN.append(torch.backends.cudnn.enabled)


def _ctc_style_loss(x):
    # transformers' ForCTCLoss: the loss runs under torch.backends.cudnn.flags(enabled=False)
    y = x.log_softmax(-1)
    with torch.backends.cudnn.flags(enabled=False):
        _note_cudnn_enabled()
        return (y * 2).sum()


def test_with_a_manager_whose_entry_cannot_be_traced_breaks_at_the_with():
    # Entering cudnn.flags writes a global of torch.backends, whose sys.modules entry is a wrapper
    # module: the failure was at BEFORE_WITH, no place for a break, and the frame ran eagerly as a
    # whole. Now the glue enters the real manager, and the block is captured in a resume function
    # that runs under it (torch.compile breaks at the flags() call instead).
    x = torch.randn(2, 5)
    before = torch.backends.cudnn.enabled
    out = _explain(_ctc_style_loss, x)
    assert not out.fallbacks, out
    assert any("log_softmax" in str(g.code) for g in out.graphs), out
    assert any("mul" in str(g.code) for g in out.graphs), out  # the block's body is in a graph
    _CUDNN_SEEN.clear()
    kiln.reset()
    try:
        compiled = kiln.compile(_ctc_style_loss, backend="eager")
        for _ in range(2):
            torch.testing.assert_close(compiled(x), _ctc_style_loss(x))
        assert _CUDNN_SEEN == [False] * 4  # under the real manager, compiled and eager
        assert torch.backends.cudnn.enabled == before  # and left as it was
        assert kiln.stats()["fallbacks"] == 0
    finally:
        kiln.reset()


_LOOP_CALLS: list[int] = []


@kiln.disable
def _native_step(i: int) -> None:
    _LOOP_CALLS.append(i)


class _Step(torch.nn.Module):
    def __init__(self, breaks: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.breaks = breaks

    def forward(self, x):
        x = self.lin(x).relu()
        if self.breaks:
            _native_step(len(_LOOP_CALLS))
        return x * 2


def _run_layers(x, layers):
    for layer in layers:
        x = layer(x)
    return x + 1


def test_a_break_in_a_later_loop_iteration_keeps_the_earlier_ones_in_the_graph():
    # Reformer's reversible forward loops over its layers and only the LSH layer breaks (it reseeds):
    # the break used to be taken at the first arrival at the call, so the layer before it ran as a
    # frame of its own; now the break is at the iteration whose call failed.
    layers = torch.nn.ModuleList([_Step(False), _Step(False), _Step(True), _Step(False)])
    x = torch.randn(2, 4)
    _LOOP_CALLS.clear()
    out = _explain(_run_layers, x, layers)
    assert not out.fallbacks, out
    first = [n for n in out.graphs[0].graph.nodes if n.op == "call_module" or "linear" in str(n.target)]
    assert len(first) == 2, out  # the first two layers' linears, before the break at the third call
    _LOOP_CALLS.clear()
    kiln.reset()
    try:
        compiled = kiln.compile(_run_layers, backend="eager")
        for _ in range(2):
            torch.testing.assert_close(compiled(x, layers), _run_layers(x, layers))
        assert _LOOP_CALLS == [0, 1, 2, 3]
    finally:
        kiln.reset()


class _SeededScale(torch.autograd.Function):
    # Reformer's _ReversibleFunction: a forward that reseeds (a break) and a hand-written backward
    @staticmethod
    def forward(ctx, x):
        y = x.sin() * 2
        torch.manual_seed(0)
        ctx.save_for_backward(x)
        return y.cos() + 1

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * -torch.sin(x.sin() * 2) * 2 * x.cos()


def _seeded_apply(x):
    return _SeededScale.apply(x.exp()).sum()


def test_a_function_forward_that_breaks_is_captured_under_its_backward_in_training():
    # With grad mode on, an apply whose forward breaks ran natively as a whole: its forward was no
    # graph. Now apply runs on a subclass whose forward is the captured frame (torch.compile too
    # traces that frame), and autograd records the Function's own backward.
    x = torch.randn(5, requires_grad=True)
    out = _explain(_seeded_apply, x)
    assert not out.fallbacks, out
    assert any("sin" in str(g.code) for g in out.graphs), out  # the forward's ops are in a graph
    kiln.reset()
    try:
        compiled = kiln.compile(_seeded_apply, backend="eager")
        for _ in range(2):
            got_x = x.detach().clone().requires_grad_()
            got = compiled(got_x)
            got.backward()
            ref_x = x.detach().clone().requires_grad_()
            ref = _seeded_apply(ref_x)
            ref.backward()
            torch.testing.assert_close(got, ref)
            torch.testing.assert_close(got_x.grad, ref_x.grad)
        assert kiln.stats()["fallbacks"] == 0
    finally:
        kiln.reset()


def _feature_maps_record():
    import dataclasses

    generic = pytest.importorskip("transformers.utils.generic")

    @dataclasses.dataclass
    class Features(generic.ModelOutput):  # transformers' BackboneOutput
        feature_maps: tuple | None = None
        hidden_states: tuple | None = None

    return Features


@pytest.mark.parametrize("first", ["tuple_of_tensors", "list_of_tensors", "tuple_of_numbers"])
def test_model_output_with_only_a_sequence_first_field_is_traced(first):
    # DETR's backbone rebuilds `type(output)(**kept_fields)` with only feature_maps, a tuple of
    # tensors: "BackboneOutput() with only a non-tensor first field", a break per stage (5 graphs
    # where torch.compile makes 1). A sequence whose first element cannot be a (key, value) pair
    # stays the field's value and item, as ModelOutput.__post_init__ leaves it.
    Features = _feature_maps_record()
    make = {"tuple_of_tensors": lambda x: (x + 1, x * 2), "list_of_tensors": lambda x: [x + 1, x * 2],
            "tuple_of_numbers": lambda x: (3, 4)}[first]

    def backbone(x):
        out = Features(feature_maps=make(x))
        kept = {k: v for k, v in out.items() if k == "feature_maps"}
        again = type(out)(**kept)
        return again.feature_maps, again[0], list(again.keys()), again.to_tuple(), x.sum()

    x = torch.randn(2, 3)
    out = _explain(backbone, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    got, want = kiln.compile(backbone, backend="eager")(x), backbone(x)
    kiln.reset()
    assert got[2] == want[2] and len(got[3]) == len(want[3])
    torch.testing.assert_close((got[0], got[1], got[4]), (want[0], want[1], want[4]))
