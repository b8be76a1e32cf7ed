"""Dynamic shapes in capture, checked against the real torch.compile as an oracle.

Each case compiles the same function with kiln.compile and torch.compile, both with a recording
backend, runs the same calls, and compares: how many graphs each compiled (Kiln's must be no higher),
the outputs (equal to eager on every call), what the backend was handed (SymInt placeholders,
symbolic example inputs), the guards (ShapeEnv decisions in the user's words) and the logs
(KILN_LOGS=dynamic, recompiles, guards). The backends that lower (aot_eager, inductor) must accept
the symbolic sizes too. torch.compile is only an oracle here (tests may use it; kiln never does).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import re
import shutil
import warnings
from typing import Any, Callable, Iterator, Sequence

import pytest
import torch
import torch._dynamo

import kiln
from kiln import log
from kiln.symbolic import expr_of, is_symbolic

# ---------------------------------------------------------------------------------------- harness


class Recorder:
    """A backend that records each graph and its example inputs, then runs the graph as it is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return gm.forward

    @property
    def count(self) -> int:
        return len(self.graphs)


KILN = {"compile": kiln.compile, "reset": kiln.reset, "mark_dynamic": kiln.mark_dynamic,
        "mark_static": kiln.mark_static, "maybe_mark_dynamic": kiln.maybe_mark_dynamic}
TORCH = {"compile": torch.compile, "reset": torch._dynamo.reset, "mark_dynamic": torch._dynamo.mark_dynamic,
         "mark_static": torch._dynamo.mark_static, "maybe_mark_dynamic": torch._dynamo.maybe_mark_dynamic}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


def run(tool: dict, fn: Callable[..., Any], calls: Sequence[Callable[[], tuple]], *,
        marks: Sequence[tuple[str, int]] = (), **compile_kwargs: Any) -> Recorder:
    """Compile fn with `tool` (KILN or TORCH) and a Recorder, make each call (fresh arguments from
    each factory; `marks` applied to the first one), and check every output against eager."""
    tool["reset"]()
    recorder = Recorder()
    compiled = tool["compile"](fn, backend=recorder, **compile_kwargs)
    for make in calls:
        args = make()
        for kind, dim in marks:
            tool[kind](args[0], dim)
        expected = fn(*args)
        with torch.no_grad() if isinstance(fn, torch.nn.Module) else contextlib.nullcontext():
            got = compiled(*args)
        torch.testing.assert_close(got, expected)
    return recorder


def both(fn: Callable[..., Any], calls: Sequence[Callable[[], tuple]], **kwargs: Any) -> tuple[Recorder, Recorder]:
    """(kiln's recorder, torch's recorder) for the same calls; Kiln never compiles more often."""
    theirs = run(TORCH, fn, calls, **kwargs)
    ours = run(KILN, fn, calls, **kwargs)
    assert ours.count <= theirs.count, f"kiln compiled {ours.count} graphs, torch.compile {theirs.count}"
    return ours, theirs


def batches(sizes: Sequence[int], *rest: int) -> list[Callable[[], tuple]]:
    return [lambda b=b: (torch.randn(b, *rest),) for b in sizes]


def symints(example_inputs: Sequence[Any]) -> list[Any]:
    return [e for e in example_inputs if isinstance(e, torch.SymInt)]


def tensors(example_inputs: Sequence[Any]) -> list[torch.Tensor]:
    return [e for e in example_inputs if isinstance(e, torch.Tensor)]


def line_of(fn: Callable[..., Any], text: str) -> int:
    """The line number of the first line of fn's source containing `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@contextlib.contextmanager
def kiln_logs(caplog: pytest.LogCaptureFixture, names: str) -> Iterator[None]:
    log.configure(names)
    try:
        with caplog.at_level("INFO", logger="kiln"):
            yield
    finally:
        log.configure(None)  # back to what the environment asked for


def scale(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2 + x.shape[0]


# ------------------------------------------------------------------------- dynamic=False / None / True


def test_dynamic_false_recompiles_each_size_until_the_cache_limit_then_runs_eagerly():
    calls = batches(range(8, 21), 3)
    theirs = run(TORCH, scale, calls, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = run(KILN, scale, calls, dynamic=False)
    assert ours.count == theirs.count == kiln.config.cache_size_limit == 8
    assert all(not symints(ex) for ex in ours.example_inputs)  # every size static
    limit = [w for w in caught if "cache_size_limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]  # one warning, however many eager calls
    assert "x.size()[0] changed" in str(limit[0].message)
    assert kiln.stats()["fallbacks"] == 13 - 8


def test_default_compiles_static_first_then_only_the_changed_dim_becomes_a_symbol():
    ours, theirs = both(scale, batches(range(8, 21), 3))
    assert ours.count <= 2
    assert not symints(ours.example_inputs[0])  # static first
    (x,) = tensors(ours.example_inputs[1])
    assert is_symbolic(x.shape[0]) and x.shape[1] == 3 and not is_symbolic(x.shape[1])
    assert len(symints(ours.example_inputs[1])) == len(symints(theirs.example_inputs[1])) == 1


def test_dynamic_true_compiles_once_with_0_and_1_specialized():
    sizes = [8, 9, 10, 17, 1, 12, 0, 1]
    ours, theirs = both(scale, batches(sizes, 3), dynamic=True)
    assert ours.count == theirs.count == 3  # the symbolic graph, then size 1 and size 0 on their own
    first = ours.example_inputs[0]
    assert len(symints(first)) == 2 and all(is_symbolic(s) for s in tensors(first)[0].shape)
    assert [tuple(tensors(ex)[0].shape)[0] for ex in ours.example_inputs[1:]] == [1, 0]


def test_size_one_under_the_default_is_static_then_the_symbolic_graph_is_reused():
    ours, theirs = both(scale, batches([8, 9, 1, 10, 0, 11], 3))
    assert ours.count == theirs.count == 4


# ---------------------------------------------------------------------------------------- the marks


def test_mark_dynamic_compiles_once_from_the_first_call():
    ours, theirs = both(scale, batches(range(8, 21), 3), marks=[("mark_dynamic", 0)])
    assert ours.count == theirs.count == 1
    (x,) = tensors(ours.example_inputs[0])
    assert is_symbolic(x.shape[0]) and not is_symbolic(x.shape[1])


def test_mark_dynamic_on_a_size_1_dim_is_specialized_quietly():
    # as torch.compile: a size-1 example cannot stand for sizes >= 2, and that is no user error
    ours, theirs = both(scale, batches([1, 1], 3), marks=[("mark_dynamic", 0)])
    assert ours.count == theirs.count == 1
    assert tensors(ours.example_inputs[0])[0].shape[0] == 1


def test_marks_count_under_dynamic_false_as_in_torch_compile():
    for mark in ("mark_dynamic", "maybe_mark_dynamic"):
        ours, theirs = both(scale, batches([8, 9, 10], 3), marks=[(mark, 0)], dynamic=False)
        assert ours.count == theirs.count == 1, mark


def test_mark_static_keeps_a_dim_static_under_dynamic_true():
    ours, theirs = both(scale, batches([8, 9, 10], 3), marks=[("mark_static", 0)], dynamic=True)
    assert ours.count == theirs.count == 3
    (x,) = tensors(ours.example_inputs[-1])
    assert x.shape[0] == 10 and is_symbolic(x.shape[1])


def test_mark_static_wins_over_automatic_dynamic():
    ours, theirs = both(scale, batches([8, 9, 10], 3), marks=[("mark_static", 0)])
    assert ours.count == theirs.count == 3


def pad_to_eight(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    return y + torch.ones(8, 3)  # broadcasting needs x.size(0) == 8


def branch_on_size(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 8:
        return x + 1
    return x - 1


def test_maybe_mark_dynamic_may_be_specialized_quietly():
    ours, theirs = both(pad_to_eight, batches([8, 8], 3), marks=[("maybe_mark_dynamic", 0)])
    assert ours.count == theirs.count == 1


def test_maybe_mark_dynamic_is_symbolic_from_the_first_call():
    ours, theirs = both(scale, batches([8, 9, 10], 3), marks=[("maybe_mark_dynamic", 0)])
    assert ours.count == theirs.count == 1


@pytest.mark.parametrize("fn, text", [(pad_to_eight, "torch.ones(8, 3)"), (branch_on_size, "== 8")],
                         ids=["broadcast", "branch"])
def test_torch_compile_refuses_to_specialize_a_marked_dim(fn, text):
    # The oracle for the next test: torch.compile raises ConstraintViolationError, naming the line.
    compiled = torch.compile(fn, backend=Recorder())
    x = torch.randn(8, 3)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception, match="marked L\\['x'\\].size\\(\\)\\[0\\] as dynamic") as info:
        compiled(x)
    assert f"line {line_of(fn, text)}" in str(info.value)


@pytest.mark.parametrize("fn, text", [(pad_to_eight, "torch.ones(8, 3)"), (branch_on_size, "== 8")],
                         ids=["broadcast", "branch"])
def test_specializing_a_marked_dim_raises_naming_the_line(fn, text):
    compiled = kiln.compile(fn, backend=Recorder())
    x = torch.randn(8, 3)
    kiln.mark_dynamic(x, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a warning and an eager run: the error itself
        with pytest.raises(kiln.symbolic.ConstraintViolation) as info:
            compiled(x)
    message = str(info.value)
    assert "x.size()[0] was marked dynamic" in message and "specialized it to 8" in message
    assert f"{__file__}:{line_of(fn, text)}" in message
    assert info.value.location == f"{__file__}:{line_of(fn, text)}"


# ------------------------------------------------------------------------------ python int arguments


def times_n(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n + n


def int_calls(values: Sequence[int]) -> list[Callable[[], tuple]]:
    return [lambda n=n: (torch.ones(3), n) for n in values]


def test_int_arguments_are_static_first_then_dynamic():
    ours, theirs = both(times_n, int_calls([2, 3, 4, 5, 6, 7]))
    assert ours.count == theirs.count == 2
    assert not symints(ours.example_inputs[0])
    (n,) = symints(ours.example_inputs[1])
    assert is_symbolic(n)
    placeholders = [p for p in ours.graphs[1].graph.nodes if p.op == "placeholder"]
    assert [type(p.meta["example_value"]) for p in placeholders].count(torch.SymInt) == 1


def test_int_arguments_0_and_1_reuse_the_symbolic_graph():
    # Unlike sizes, an int symbol is not assumed >= 2: once n is dynamic, 1 and 0 reuse its graph.
    ours, theirs = both(times_n, int_calls([2, 3, 1, 0, 4, 1]))
    assert ours.count == theirs.count == 2


def test_int_arguments_under_dynamic_true_and_false():
    ours, theirs = both(times_n, int_calls([2, 3, 4]), dynamic=True)
    assert ours.count == theirs.count == 1
    ours, theirs = both(times_n, int_calls([2, 3, 4]), dynamic=False)
    assert ours.count == theirs.count == 3


def test_specialize_int_burns_ints_in():
    with kiln.config.patch(specialize_int=True), torch._dynamo.config.patch(specialize_int=True):
        ours, theirs = both(times_n, int_calls([2, 3, 4, 5]))
    assert ours.count == theirs.count == 4
    assert all(not symints(ex) for ex in ours.example_inputs)


# ---------------------------------------------------------------- what the backend is handed (seam)


def add_columns(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y.shape[1] + y[:, :1]


def test_symbolic_graphs_take_symint_placeholders_and_symbolic_example_inputs():
    calls = [lambda: (torch.randn(8, 3), torch.randn(8, 4))]
    ours, theirs = both(add_columns, calls, dynamic=True)
    gm, examples = ours.graphs[0], ours.example_inputs[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(examples)
    for node, example in zip(placeholders, examples):
        assert node.meta["example_value"] is example  # example inputs are the placeholders' fakes
    sym_nodes = [(n, e) for n, e in zip(placeholders, examples) if isinstance(e, torch.SymInt)]
    assert sym_nodes and all(is_symbolic(e) for _, e in sym_nodes)
    exprs = {expr_of(e) for _, e in sym_nodes}
    for fake in tensors(examples):
        assert any(is_symbolic(size) for size in fake.shape)
        for size in fake.shape:
            # every symbolic size is that of a SymInt placeholder (y's rows became x's: s2 = s0)
            assert not is_symbolic(size) or expr_of(size) in exprs
    # the graph reads y.shape[1] as its SymInt placeholder, not a burnt-in 4
    (mul,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__ == "mul"]
    assert any(arg.op == "placeholder" and isinstance(arg.meta["example_value"], torch.SymInt)
               for arg in mul.args), gm.code
    assert len(tensors(examples)) == len(tensors(theirs.example_inputs[0])) == 2
    assert symints(theirs.example_inputs[0])  # torch hands SymInts to backends too


def test_graph_output_is_right_for_sizes_the_capture_never_saw():
    calls = [lambda b=b: (torch.randn(b, 3), torch.randn(b, 5)) for b in (8, 9, 31)]
    ours, _ = both(add_columns, calls, dynamic=True)
    assert ours.count == 1


# --------------------------------------------------------------------------------------------- guards


def same_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == y.shape[0]:  # a relation between two sizes becomes a guard
        return x + y[:, :1]
    return x.sum() + y.sum()


def rows_of_eight(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 8).sum(1)  # needs x.numel() % 8 == 0


def test_guards_hold_the_shape_env_decisions_in_the_users_words():
    out = kiln.explain(same_rows, backend="eager", dynamic=True)(torch.randn(8, 3), torch.randn(8, 4))
    shape = {g.name: g.expected for g in out.guards if g.kind == "check_shape"}
    assert "x.size()[0] >= 2" in shape and shape["x.size()[0] >= 2"] is None  # from wrapping the input
    relation = "x.size()[0] == y.size()[0]"
    assert relation in shape, sorted(shape)
    assert shape[relation] == f"{__file__}:{line_of(same_rows, 'if x.shape[0] == y.shape[0]')}"

    out = kiln.explain(rows_of_eight, backend="eager", dynamic=True)(torch.randn(8, 3))
    names = [g.name for g in out.guards if g.kind == "check_shape"]
    assert "(x.size()[0] * x.size()[1]) % 8 == 0" in names, names


def test_a_relation_guard_that_fails_recompiles_instead_of_reusing_a_stale_graph():
    calls = [lambda: (torch.randn(8, 3), torch.randn(8, 4)), lambda: (torch.randn(9, 3), torch.randn(9, 4)),
             lambda: (torch.randn(9, 3), torch.randn(7, 4)), lambda: (torch.randn(5, 3), torch.randn(6, 4))]
    ours, theirs = both(same_rows, calls, dynamic=True)
    assert ours.count == theirs.count == 2


def test_a_modulo_guard_keeps_reshape_graphs_correct():
    shapes = [(8, 3), (6, 4), (16, 3), (2, 4), (3, 8)]
    ours, theirs = both(rows_of_eight, [lambda s=s: (torch.randn(*s),) for s in shapes], dynamic=True)
    assert ours.count <= theirs.count


def test_guards_log_shows_the_shape_guards(caplog):
    with kiln_logs(caplog, "guards"):
        kiln.compile(same_rows, backend="eager", dynamic=True)(torch.randn(8, 3), torch.randn(8, 4))
    assert "check_shape(x.size()[0] == y.size()[0])" in caplog.text  # the listing, in the user's words
    # the generated check function tests the same relation on the live tensors
    assert re.search(r"if not \(___v\d+\.size\(\)\[0\] == ___v\d+\.size\(\)\[0\]\)", caplog.text)


def test_guards_log_and_explain_text_render_shape_guards_in_the_users_words(caplog):
    with kiln_logs(caplog, "guards"):
        out = kiln.explain(same_rows, backend="eager", dynamic=True)(torch.randn(8, 3), torch.randn(8, 4))
    assert "x.size()[0] == y.size()[0]" in caplog.text
    assert "x.size()[0] == y.size()[0]" in str(out)


# ----------------------------------------------------------------------------------------------- logs


def test_recompiles_log_says_which_dim_changed_and_what_kiln_did(caplog):
    with kiln_logs(caplog, "recompiles"):
        run(KILN, scale, batches([8, 9, 10], 3))
    assert "x dim 0: 8 -> 9, now dynamic" in caplog.text
    assert caplog.text.count("Recompiling scale") == 1  # 10 reuses the symbolic graph


def test_recompiles_log_under_dynamic_false_does_not_promise_a_symbol(caplog):
    with kiln_logs(caplog, "recompiles"):
        run(KILN, scale, batches([8, 9], 3), dynamic=False)
    assert "x dim 0: 8 -> 9, recompiled with a static size (dynamic=False)" in caplog.text
    assert "now dynamic" not in caplog.text


def test_recompiles_log_for_int_arguments(caplog):
    with kiln_logs(caplog, "recompiles"):
        run(KILN, times_n, int_calls([2, 3, 4]))
    assert "n: 2 -> 3, now dynamic" in caplog.text


def plus_its_offset(x):
    return x * 2 + x.storage_offset()


def test_recompiles_log_for_a_views_storage_offset_says_it_is_now_dynamic(caplog):
    """The trace reads the offset: guarded by value at the first capture, read as a symbolic int
    once it changed (as torch.compile's automatic dynamic does with the int it passes across its
    graph break there), and the log says so; no capture after that."""
    base = torch.randn(40)
    with kiln_logs(caplog, "recompiles"):
        recorder = run(KILN, plus_its_offset, [lambda n=n: (base[n: n + 6].view(3, 2),) for n in (2, 3, 4, 5)])
    assert len(recorder.graphs) == 2
    assert "x.storage_offset(): 2 -> 3, now dynamic (unless another input shares its storage)" in caplog.text
    assert "3 -> 4" not in caplog.text


def size_as_text(x):
    text = str(x.size(0))
    return x + len(text), text  # the trace reads the text (its length): only then is it made


def shape_in_an_fstring(x):
    text = f"{tuple(x.shape)}"
    return x * len(text), text


@pytest.mark.parametrize("fn, why", [
    (size_as_text, "str() of a size needs its value (one graph per value)"),
    (shape_in_an_fstring, "a string formatted from the size needs its value (one graph per value)")],
    ids=["str", "fstring"])
def test_recompiles_log_says_a_size_made_text_is_guarded_by_value(caplog, fn, why):
    """A text the trace reads is made in the trace (one only returned is formatted by the glue,
    tests/capture/test_size_text_graph_counts.py): each new size recompiles, and the log says why
    instead of a bare guard."""
    compiled = kiln.compile(fn, backend="eager")
    with kiln_logs(caplog, "recompiles"):
        for n in (4, 6, 8):
            x = torch.randn(n, 3)
            got, want = compiled(x), fn(x)
            assert got[1] == want[1] and torch.equal(got[0], want[0])
    line = line_of(fn, "return")
    assert f"x.size()[0] == 6 no longer holds; now x.size()[0] = 8 (guard added at {__file__}:{line}: {why})" \
        in caplog.text


def test_dynamic_log_says_which_input_which_dim_why_and_the_guards_lines(caplog):
    with kiln_logs(caplog, "dynamic"):
        run(KILN, same_rows, [lambda: (torch.randn(8, 3), torch.randn(8, 4)),
                              lambda: (torch.randn(9, 3), torch.randn(9, 4))])
    text = caplog.text
    assert "x dim 0 is dynamic: its size changed since an earlier capture" in text
    assert "create_symbol s0 = 9 for L['x'].size()[0] (x dim 0)" in text
    assert "x dim 1" not in text  # only the dim that changed
    where = f"{__file__}:{line_of(same_rows, 'if x.shape[0] == y.shape[0]')}"
    assert f"guard x.size()[0] == y.size()[0]  [{where}]" in text


def test_dynamic_log_names_the_marks(caplog):
    with kiln_logs(caplog, "dynamic"):
        run(KILN, scale, batches([8], 3), marks=[("maybe_mark_dynamic", 0)])
    assert "x dim 0 is dynamic: maybe_mark_dynamic" in caplog.text


# ------------------------------------------------------------------- a model with varying lengths


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP over (batch, time, channels)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


# default: static, then time becomes a symbol (9 reuses it), then a length of 1 is its own graph
SEQUENCES = {None: [(2, 5), (2, 7), (2, 9), (2, 1)], True: [(2, 5), (3, 7), (2, 1)], False: [(2, 5), (2, 7)]}
EXPECTED_MODEL_COMPILES = {None: 3, True: 2, False: 2}


@pytest.mark.parametrize("dynamic", [None, True, False], ids=["default", "dynamic", "static"])
def test_attention_block_over_variable_length_sequences(dynamic):
    torch.manual_seed(0)
    block = Block().eval()
    calls = [lambda b=b, t=t: (torch.randn(b, t, 16),) for b, t in SEQUENCES[dynamic]]
    ours, theirs = both(block, calls, dynamic=dynamic)
    assert ours.count == theirs.count == EXPECTED_MODEL_COMPILES[dynamic]
    if dynamic is not False:
        (x,) = [t for t in tensors(ours.example_inputs[-2 if dynamic is None else 0]) if t.dim() == 3]
        assert is_symbolic(x.shape[1]) and x.shape[2] == 16  # time is a symbol, channels stay 16


# ------------------------------------------------------------- symbolic sizes through the backends


def _has(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


needs_aot = pytest.mark.skipif(not _has("kiln.autograd", "aot_eager"), reason="kiln.autograd.aot_eager has not landed")
needs_lower = pytest.mark.skipif(
    not (_has("kiln.autograd", "aot_autograd") and _has("kiln.lower", "compile_graph")
         and (shutil.which("c++") or shutil.which("g++"))),
    reason="kiln.autograd.aot_autograd / kiln.lower.compile_graph or a C++ compiler is missing")


def mlp_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w) + x.shape[0]
    return h.sum(-1) / x.shape[1]


def mlp_calls(sizes: Sequence[int], requires_grad: bool = False) -> list[Callable[[], tuple]]:
    return [lambda b=b: (torch.randn(b, 5, requires_grad=requires_grad), torch.randn(5, 4, requires_grad=requires_grad))
            for b in sizes]


def through(backend_name: str, calls: Sequence[Callable[[], tuple]], **kwargs: Any) -> kiln.backends.CountingBackend:
    counting = kiln.backends.CountingBackend(kiln.backends.lookup(backend_name))
    compiled = kiln.compile(mlp_step, backend=counting, **kwargs)
    with warnings.catch_warnings():
        # no silent fallback (to backend "eager", or to running the frame eagerly after an error)
        warnings.simplefilter("error", log.KilnWarning)
        for make in calls:
            args = make()
            torch.testing.assert_close(compiled(*args), mlp_step(*args))
    return counting


@needs_aot
def test_symbolic_sizes_flow_through_aot_eager():
    counting = through("aot_eager", mlp_calls([8, 9, 10, 11]), dynamic=True)
    assert counting.frame_count == 1 and symints(counting.example_inputs[0])


@needs_aot
def test_symbolic_sizes_flow_through_aot_eager_training():
    counting = kiln.backends.CountingBackend(kiln.backends.lookup("aot_eager"))
    compiled = kiln.compile(mlp_step, backend=counting)
    with warnings.catch_warnings():
        warnings.simplefilter("error", log.KilnWarning)
        for args in (f() for f in mlp_calls([8, 9, 10], requires_grad=True)):
            clones = [a.detach().clone().requires_grad_() for a in args]
            compiled(*args).sum().backward()
            mlp_step(*clones).sum().backward()
            for a, c in zip(args, clones):
                torch.testing.assert_close(a.grad, c.grad)
    assert counting.frame_count == 2 and symints(counting.example_inputs[1])


@needs_lower
@pytest.mark.cpp
def test_symbolic_sizes_flow_through_inductor():
    counting = through("inductor", mlp_calls([8, 9, 10, 11]), dynamic=True)
    assert counting.frame_count == 1 and symints(counting.example_inputs[0])
    counting = through("inductor", mlp_calls([8, 9, 10, 11]))
    assert counting.frame_count == 2 and symints(counting.example_inputs[1])


@needs_lower
@pytest.mark.cpp
def test_kiln_inductor_backend_takes_the_real_dynamos_symbolic_graphs():
    compiled = torch.compile(mlp_step, backend=kiln.inductor_backend, dynamic=True)
    for args in (f() for f in mlp_calls([8, 9, 10])):
        torch.testing.assert_close(compiled(*args), mlp_step(*args))


def test_an_int_in_a_dict_that_changes_becomes_a_symbol_as_in_torch_compile() -> None:
    """`config["scale"]` read from a closed-over dict that a script changes between calls: one
    recompile, then one graph for every value (torch.compile(backend="eager") makes 2 graphs for 3
    values); a value the trace uses as a size works too."""
    config = {"scale": 2, "rows": 2}

    def f(x):
        return (x * config["scale"]).reshape(config["rows"], -1)

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(12)
    for scale, rows in ((2, 2), (3, 3), (5, 4), (7, 6)):
        config.update(scale=scale, rows=rows)
        torch.testing.assert_close(compiled(x), f(x))
    assert kiln.stats()["compiles"] == 2
    kiln.reset()
