"""Patterns from real `transformers` model code, each reduced to plain PyTorch: every test here
failed (a wrong binding, an internal error that made the frame run eagerly, or a graph break that
torch.compile does not take) before the Kiln fix it names. Compared with eager and, for graph
counts, with the numbers torch.compile gives on the same function."""
from __future__ import annotations

import functools

import pytest
import torch

import kiln


def _explain(fn, *args, **kwargs):
    kiln.reset()
    try:
        return kiln.explain(fn)(*args, **kwargs)
    finally:
        kiln.reset()


def _can_return_tuple(forward):
    """Like transformers' output decorators: `functools.wraps` sets __wrapped__, so
    inspect.signature(wrapper) reports the wrapped function's parameters."""
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    @_can_return_tuple
    def forward(self, x, scale=2.0, bias=None):
        return self.lin(x) * scale


def test_decorated_forward_binds_the_wrappers_own_parameters():
    # entry.make_binder bound the wrapper's (*args, **kwargs) by the wrapped signature: 'kwargs'
    # was unset and the whole frame ran eagerly.
    model = Decorated()
    x = torch.randn(2, 4)
    want = model(x, scale=3.0)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x, scale=3.0), want)
    out = _explain(model, x, scale=3.0)
    assert out.graph_count == 1 and out.graph_break_count == 0, out
    assert not out.fallbacks, out


def _long_loop(x, layers):
    # A loop body over 255 code units: FOR_ITER's exit jump needs an EXTENDED_ARG, and the loop's
    # backward jump targets that prefix's offset, not FOR_ITER's.
    for w in layers:
        x = x + w
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
        x = x * 1.0 + 0.0 - 0.0 + x * 0.0 + 1.0 - 1.0
    return x


def test_jump_to_an_instruction_with_an_extended_arg_prefix():
    # Tracer.jump looked the prefix's offset up in a table without EXTENDED_ARG: KeyError, and the
    # whole frame ran eagerly.
    import dis
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(_long_loop))
    x, layers = torch.randn(3), [torch.randn(3), torch.randn(3)]
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_long_loop, backend="eager")(x, layers), _long_loop(x, layers))
    out = _explain(_long_loop, x, layers)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out


class _Registry(dict):
    """transformers' _CanRecordRegistry: a dict subclass read through super().get(str(cls))."""

    def get(self, model):
        return super().get(str(model.__class__)) or {}


_REGISTRY = _Registry()


class _Registered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        flags = _REGISTRY.get(self)
        return self.lin(x).relu() + len(flags)


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Registered()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x))


def test_super_get_on_a_dict_subclass_and_str_of_a_class_stay_in_the_graph():
    # SuperVariable refused dict's method descriptors and str(cls) was an unsupported call: two
    # frames ran with a break where torch.compile captures one graph.
    model, x = _Outer(), torch.randn(2, 4)
    out = _explain(model, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    compiled = kiln.compile(model, backend="eager")
    torch.testing.assert_close(compiled(x), model(x))
    # The read is guarded: registering the class changes the answer, and the compiled call follows.
    _REGISTRY[str(_Registered)] = {"a": 1, "b": 2}
    try:
        torch.testing.assert_close(compiled(x), model(x))
    finally:
        _REGISTRY.clear()
    torch.testing.assert_close(compiled(x), model(x))


def _is_torchdynamo_compiling():
    # transformers.utils.import_utils.is_torchdynamo_compiling
    try:
        import torch
        return torch.compiler.is_compiling()
    except Exception:
        return False


def _compile_aware(x):
    if _is_torchdynamo_compiling():
        return x + 1
    return x - 1


def test_is_compiling_is_true_while_capturing():
    # torch.compiler.is_compiling (module torch.compiler) was inlined and read torch.compile's own
    # flag: capture took the eager branch. torch.compile takes the compiling branch.
    x = torch.randn(3)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_compile_aware, backend="eager")(x), x + 1)
    out = _explain(_compile_aware, x)
    ops = [n.target for g in out.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert out.graph_count == 1 and ops == [__import__("operator").add], out


class _Interface(__import__("collections").abc.MutableMapping):
    """transformers' AttentionInterface: a MutableMapping whose `in` is Mapping.__contains__."""

    _global = {"sdpa": torch.nn.functional.scaled_dot_product_attention}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


_INTERFACE = _Interface()


def _dispatch(q):
    # `in` on the mapping, and an environment flag read (transformers' sdpa_attention_forward).
    if "sdpa" not in _INTERFACE:
        raise KeyError("sdpa")
    if __import__("os").environ.get("KILN_TEST_FORCE_FLAG", "0") == "1":
        return q * 2
    return _INTERFACE["sdpa"](q, q, q)


def test_in_on_a_mapping_class_and_environment_flags_stay_in_the_graph(monkeypatch):
    # `in` iterated the object (unsupported), and os.environ.get was a call into `os`: both breaks.
    q = torch.randn(1, 2, 4, 8)
    monkeypatch.delenv("KILN_TEST_FORCE_FLAG", raising=False)
    out = _explain(_dispatch, q)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    compiled = kiln.compile(_dispatch, backend="eager")
    torch.testing.assert_close(compiled(q), _dispatch(q))
    monkeypatch.setenv("KILN_TEST_FORCE_FLAG", "1")  # guarded by value: the flag flips the branch
    torch.testing.assert_close(compiled(q), q * 2)


def test_model_output_records_are_built_in_the_graph_frame():
    # Constructing a ModelOutput (a dataclass that is an OrderedDict) was an unsupported call: every
    # transformers model broke at its `return XOutput(...)`, and the callers with it.
    import dataclasses

    import pytest
    generic = pytest.importorskip("transformers.utils.generic")

    @dataclasses.dataclass
    class Out(generic.ModelOutput):
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None
        hidden: torch.Tensor | None = None

    def body(x):
        return Out(logits=x.relu(), hidden=x * 2)

    def head(x):
        out = body(x)
        first = out[0] + out["hidden"] + out.logits
        return Out(loss=first.sum(), logits=out.to_tuple()[1])

    x = torch.randn(3)
    out = _explain(head, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    got, want = kiln.compile(head, backend="eager")(x), head(x)
    assert type(got) is Out and list(got.keys()) == list(want.keys()) == ["loss", "logits"]
    assert got.hidden is None
    torch.testing.assert_close(got.to_tuple(), want.to_tuple())


class _Chunked(torch.nn.Module):
    """transformers.pytorch_utils.apply_chunking_to_forward counts the chunk function's parameters."""

    def chunk(self, h):
        return h * 2

    def forward(self, x):
        import inspect
        n = len(inspect.signature(self.chunk).parameters)
        return self.chunk(x) + n


def test_inspect_signature_of_a_traced_function_folds():
    # inspect.signature was inlined into the inspect module until sys.getrecursionlimit broke it.
    model, x = _Chunked(), torch.randn(3)
    out = _explain(model, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    assert not out.break_reasons, out
    kiln.reset()
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x), x * 2 + 1)


class _Head(torch.nn.Module):
    """Classification heads build activation and loss modules inside forward."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, labels):
        h = torch.nn.ReLU()(self.lin(x))
        return torch.nn.CrossEntropyLoss()(h.view(-1, 3), labels.view(-1)), h


def test_torch_nn_modules_without_tensors_built_in_forward_are_traced():
    # Constructing nn.ReLU()/CrossEntropyLoss() was an unsupported call: a break per head.
    model, x, y = _Head(), torch.randn(2, 4), torch.tensor([0, 2])
    out = _explain(model, x, y)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    kiln.reset()
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x, y), model(x, y))


class _AliasConfig:
    """transformers' PreTrainedConfig: __setattr__ and __getattribute__ map attribute aliases."""

    attribute_map = {"kind": "problem_type"}

    def __init__(self):
        self.problem_type = None

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class _Configured(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = _AliasConfig()

    def forward(self, x):
        if self.config.kind is None:
            self.config.kind = "single_label"
        return x * 2 if self.config.problem_type == "single_label" else x


def test_config_with_python_getattribute_and_setattr_is_inlined():
    # Reads broke ("defines __getattr__/__getattribute__") and the write broke ("custom __setattr__").
    model, x = _Configured(), torch.randn(3)
    out = _explain(model, x)
    assert out.graph_count == 1 and out.graph_break_count == 0 and not out.fallbacks, out
    model.config.problem_type = None
    kiln.reset()
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x), x * 2)
    assert vars(model.config) == {"problem_type": "single_label"}


def _fresh_linear(x):
    torch.manual_seed(0)
    return torch.nn.Linear(3, 3)(x)


def test_torch_nn_modules_with_parameters_built_in_forward_still_break():
    # Only modules without tensors of their own are built at trace time: a fresh Linear's weights
    # come from the RNG at run time, so it stays outside the graph and the answer stays eager's.
    x = torch.randn(2, 3)
    out = _explain(_fresh_linear, x)
    assert any("Linear" in str(r) for r in out.break_reasons), out
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_fresh_linear, backend="eager")(x), _fresh_linear(x))



def _global_attention_indices(mask):
    # Longformer's _get_global_attn_indices: the columns of a nonzero are views of one hidden base
    # whose length is an unbacked size (u), and `nonzero` itself is both returned and viewed.
    counts = mask.long().sum(dim=1)
    columns = mask.nonzero(as_tuple=True)
    full = (mask == 0).nonzero()
    return counts, columns, full, full[:, 1]


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_views_of_an_unbacked_size_base_are_rebuilt_from_the_returned_base(backend):
    # AotRuntime rebuilt each view output from its traced size with the symbols bound to inputs
    # only: the nonzero count u1 was in no input (KeyError: u1 in _rebuild_view, aot_eager and
    # inductor). The count is read from the base the graph returns.
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, 0] = True
    kiln.reset()
    try:
        compiled = kiln.compile(_global_attention_indices, backend=backend)
        for m in (mask, torch.ones(2, 8, dtype=torch.bool), torch.zeros(2, 8, dtype=torch.bool), torch.rand(2, 8) > 0.5):
            got = compiled(m)
            torch.testing.assert_close(got, _global_attention_indices(m))
            # eager's aliasing: both columns share the nonzero's storage, full[:, 1] is a view of full
            assert got[1][0].untyped_storage().data_ptr() == got[1][1].untyped_storage().data_ptr()
            assert got[3]._base is got[2]
        assert kiln.stats()["fallbacks"] == 0
    finally:
        kiln.reset()


def _chunk(hidden, window):
    # Longformer's _chunk: sizes computed as 0-d tensors from Python ints
    chunks = torch.div(hidden.size(1), window * 2, rounding_mode="trunc")
    count = torch.div(hidden.size(1), window, rounding_mode="trunc") - 1
    half = torch.div(7, 2)  # true division of ints: a float32 tensor, as in eager
    return hidden.view(hidden.size(0), chunks, window * 2, hidden.size(2)) * count, count, half


def test_division_of_python_ints_is_folded_where_it_is_read_as_a_size():
    # torch.div(int, int, rounding_mode='trunc') made a 0-d tensor in the graph that the view then
    # read back as a size (aten._local_scalar_dense): a break at every such size, 35 graphs in
    # Longformer where torch.compile has 17. Its value is now known while tracing, as torch.compile's
    # fake tensors know it.
    import torch._dynamo

    hidden = torch.randn(2, 8, 3)
    torch._dynamo.reset()
    want = torch._dynamo.explain(_chunk)(hidden, 2)
    torch._dynamo.reset()
    out = _explain(_chunk, hidden, 2)
    assert not out.fallbacks and out.graph_count == want.graph_count == 1 and out.graph_break_count == 0, out
    kiln.reset()
    try:
        compiled = kiln.compile(_chunk, backend="eager")
        for window in (2, 4, 2):
            got, expect = compiled(hidden, window), _chunk(hidden, window)
            torch.testing.assert_close(got, expect)
            assert [t.dtype for t in got] == [t.dtype for t in expect]
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            _chunk(hidden, 0)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(hidden, 0)
    finally:
        kiln.reset()


def _global_count(hidden, count):
    # Longformer passes the global-attention count (a 0-d tensor) from one graph to the next,
    # where it is used as a size: torch.compile makes a symbol of it
    keys = hidden.new_zeros(hidden.size(0), count, hidden.size(2))
    return torch.cat([keys, hidden], dim=1), torch.arange(count) * 2, int(count)


def test_a_zero_dim_int_tensor_input_read_as_a_size_is_known():
    hidden = torch.randn(2, 4, 3)
    out = _explain(_global_count, hidden, torch.tensor(1))
    assert not out.fallbacks and out.graph_count == 1 and out.graph_break_count == 0, out
    kiln.reset()
    try:
        compiled = kiln.compile(_global_count, backend="eager")
        for n in (1, 1, 3, 0):
            got, want = compiled(hidden, torch.tensor(n)), _global_count(hidden, torch.tensor(n))
            torch.testing.assert_close(got, want)
        assert kiln.stats()["fallbacks"] == 0
    finally:
        kiln.reset()


def _mutated_size(x, count):
    size = torch.div(x.size(0), 2, rounding_mode="trunc")
    size.add_(1)
    count.add_(1)
    return x.new_zeros(size), x.new_ones(count), int(size) + int(count)


def test_a_known_tensor_written_in_place_is_read_again():
    # an in-place op on a known tensor (folded, or an input's) makes its value unknown again
    x = torch.randn(4)
    kiln.reset()
    try:
        compiled = kiln.compile(_mutated_size, backend="eager")
        for n in (1, 2):
            got, want = compiled(x, torch.tensor(n)), _mutated_size(x, torch.tensor(n))
            torch.testing.assert_close(got, want)
    finally:
        kiln.reset()
