"""Float arguments follow automatic dynamic, as in torch.compile 2.13 (specialize_float=False).

The first call keeps a float argument as a constant guarded by value; once its value changes, the
next capture takes it as a SymFloat graph input, so every later value reuses that graph. Graph
counts are compared with the real torch.compile (eager backend) on the same call sequences; values
and gradients with eager on Kiln's three backends. A graph that baked in the first value it saw (in
its forward, its backward or a C++ kernel) fails the value tests here, since they call the reused
graph with values it was not captured with.
"""
from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import contextlib

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter

import kiln
from kiln import log
from kiln.backends import CountingBackend
from kiln.symbolic.policy import DynamicPolicy

REPO = Path(__file__).resolve().parents[2]
VALUES = [0.5, 0.25, 0.75, 0.125]
BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


@contextlib.contextmanager
def kiln_logs(caplog: pytest.LogCaptureFixture, names: str) -> Iterator[None]:
    log.configure(names)
    try:
        with caplog.at_level(logging.INFO, logger="kiln"):
            yield
    finally:
        log.configure(None)


def scaled(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * f


def branch(x: torch.Tensor, f: float) -> torch.Tensor:
    if f > 0.5:
        return x * f
    return x - f


def sqrt_scale(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * math.sqrt(f)


def full(x: torch.Tensor, f: float) -> torch.Tensor:
    return torch.full((3,), f) + x


def clamp(x: torch.Tensor, f: float) -> torch.Tensor:
    return x.clamp(max=f)


def power(x: torch.Tensor, f: float) -> torch.Tensor:
    return x.abs().pow(f) + f ** x


def temperature(x: torch.Tensor, f: float) -> torch.Tensor:
    return torch.softmax(x / f, -1)


def dropout(x: torch.Tensor, f: float) -> torch.Tensor:
    return F.dropout(x, f)


def leaky(x: torch.Tensor, f: float) -> torch.Tensor:
    return F.leaky_relu(x, f) + torch.lerp(x, x * 2, f)


def derived(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * (f * 2 + 1) - f / 3 + 1 / f


def arange_step(x: torch.Tensor, f: float) -> torch.Tensor:
    return torch.arange(0, 1, f) * x.sum()  # a length of ceil(1 / f): a size computed from the float


def int_of(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * int(f * 10)


def slice_by(x: torch.Tensor, f: float) -> torch.Tensor:
    return x[: int(x.shape[0] * f)]  # a view output whose size is computed from the float


def zeros_of(x: torch.Tensor, f: float) -> torch.Tensor:
    return torch.zeros(int(f * 8)) + x.sum()


def rounded(x: torch.Tensor, f: float) -> torch.Tensor:
    return torch.arange(16.0)[: math.floor(16 * f)].sum() * x * math.ceil(f * 3) + math.trunc(f * 7)


def float_mod(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * (f % 0.3) + x * (f // 0.1) + x * abs(f - 0.4)


COUNT_CASES: dict[str, tuple[Callable[..., Any], bool | None]] = {
    "scaled": (scaled, None),
    "scaled, dynamic=True": (scaled, True),
    "scaled, dynamic=False": (scaled, False),
    "branch": (branch, None),
    "branch, dynamic=True": (branch, True),
    "math.sqrt": (sqrt_scale, None),
    "torch.full": (full, None),
    "clamp": (clamp, None),
    "pow": (power, None),
    "softmax temperature": (temperature, None),
    "dropout p": (dropout, None),  # torch.compile recompiles for each p too
    "leaky_relu slope, lerp weight": (leaky, None),
    "derived arithmetic": (derived, None),
    "arange step": (arange_step, None),
    "int(f)": (int_of, None),
    "slice to int(n * f)": (slice_by, None),
    "torch.zeros(int(f * 8))": (zeros_of, None),  # a new size, 1 -> 2 -> 6: torch.compile recompiles too
    "math.floor, ceil, trunc": (rounded, None),
}


@pytest.mark.parametrize("name", list(COUNT_CASES))
def test_graph_counts_match_torch_compile(name: str) -> None:
    fn, dynamic = COUNT_CASES[name]
    ours, theirs = CountingBackend(), CompileCounter()
    k = kiln.compile(fn, backend=ours, dynamic=dynamic)
    t = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for v in VALUES:
        x = torch.randn(3)
        torch.manual_seed(0)
        got = k(x, v)
        torch.manual_seed(0)
        torch.testing.assert_close(got, fn(x, v), equal_nan=True)
        t(x, v)
    assert len(ours.graphs) == theirs.frame_count, f"{name}: kiln {len(ours.graphs)}, torch.compile {theirs.frame_count}"


def test_the_dynamic_graph_takes_the_float_as_an_input() -> None:
    ours = CountingBackend()
    k = kiln.compile(scaled, backend=ours)
    for v in VALUES:
        k(torch.ones(3), v)
    assert len(ours.graphs) == 2
    placeholders = [n for n in ours.graphs[1].graph.nodes if n.op == "placeholder"]
    assert [type(n.meta["example_value"]) for n in placeholders if n.meta["source"] == "L['f']"] == [torch.SymFloat]
    # the static first graph holds the first value as a constant
    assert 0.5 in [a for n in ours.graphs[0].graph.nodes for a in n.args]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [scaled, branch, sqrt_scale, full, clamp, power, temperature, leaky, derived,
                                arange_step, int_of, slice_by, zeros_of, rounded, float_mod],
                         ids=lambda f: f.__name__)
def test_values_match_eager_on_every_backend(backend: str, fn: Callable[..., Any]) -> None:
    k = kiln.compile(fn, backend=backend)
    for v in VALUES + [0.375, 2.0]:
        x = torch.randn(3)
        torch.testing.assert_close(k(x, v), fn(x, v), equal_nan=True)
    assert kiln.stats()["fallbacks"] == 0
    if fn is not float_mod:  # Python's float // and % have no exact symbolic form: guarded by value
        assert kiln.stats()["graphs"] <= 3  # one static, then the dynamic one (two for the branch)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.float64], ids=str)
def test_type_promotion_is_a_python_floats(backend: str, dtype: torch.dtype) -> None:
    """int * f is the default float dtype, half * f stays half: the float is never a 0-d float64
    tensor that promotion would see."""
    k = kiln.compile(derived, backend=backend)
    for v in VALUES:
        x = (torch.arange(6) - 2).to(dtype)
        got, expected = k(x, v), derived(x, v)
        assert got.dtype == expected.dtype
        # a fused kernel rounds half once at the end where eager rounds after every op
        tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.float16 else {}
        torch.testing.assert_close(got, expected, **tol)
    assert kiln.stats()["graphs"] == 2


def int_and_float(x: torch.Tensor, n: int, f: float) -> torch.Tensor:
    return x * (n + 1) + x * (f * 2 + 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
def test_an_expression_of_symbols_is_one_operand(backend: str, dtype: torch.dtype) -> None:
    """`x * (n + 1)` with n and f symbolic: the kernel must read `(s0 + 1)` as one operand (its C
    text once spliced into `t0 * s0 + 1`, which for int64 and float64 tensors had no cast around it)."""
    k = kiln.compile(int_and_float, backend=backend)
    for n, f in [(2, 0.5), (3, 0.25), (4, 0.75)]:
        x = (torch.arange(6) - 2).to(dtype)
        torch.testing.assert_close(k(x, n, f), int_and_float(x, n, f))
    assert kiln.stats()["graphs"] == 2


def train(x: torch.Tensor, w: torch.Tensor, f: float) -> torch.Tensor:
    y = torch.tanh(x @ w) * f
    return (y * y / math.sqrt(f)).sum() + (x * f).sum()


def _leaves(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, generator=g).requires_grad_(), torch.randn(3, 5, generator=g).requires_grad_()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_eager(backend: str) -> None:
    k = kiln.compile(train, backend=backend)
    for i, v in enumerate(VALUES):
        x, w = _leaves(i)
        x2, w2 = _leaves(i)
        k(x, w, v).backward()
        train(x2, w2, v).backward()
        torch.testing.assert_close((x.grad, w.grad), (x2.grad, w2.grad))
    assert kiln.stats()["graphs"] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backward_uses_its_own_calls_value(backend: str) -> None:
    """Two forwards of the one dynamic graph with different floats, then their backwards in the
    other order: each gradient is the one of its own call (a backward that read the float from the
    first capture, or from the latest call, fails)."""
    k = kiln.compile(train, backend=backend)
    x, w = _leaves(0)
    k(x, w, 0.5).backward()  # the static capture
    calls = [(0.25, *_leaves(1)), (0.75, *_leaves(2))]
    losses = [k(x, w, v) for v, x, w in calls]
    for loss in reversed(losses):
        loss.backward()
    for v, x, w in calls:
        x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
        train(x2, w2, v).backward()
        torch.testing.assert_close((x.grad, w.grad), (x2.grad, w2.grad))
    assert kiln.stats()["graphs"] == 2


@pytest.mark.cpp
def test_inductor_kernels_take_the_float_as_a_double(caplog: pytest.LogCaptureFixture) -> None:
    k = kiln.compile(derived)
    with kiln_logs(caplog, "output_code"):
        for v in VALUES:
            x = torch.randn(3)
            torch.testing.assert_close(k(x, v), derived(x, v))
    assert "double zf" in caplog.text
    assert kiln.stats()["graphs"] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_branch_guard_is_symbolic_and_a_new_side_recompiles(backend: str) -> None:
    k = kiln.compile(branch, backend=backend)
    for v in [0.5, 0.25, 0.375, 0.125]:  # static 0.5, then one graph guarded by f <= 0.5
        torch.testing.assert_close(k(torch.ones(3), v), branch(torch.ones(3), v))
    assert kiln.stats()["graphs"] == 2
    for v in [0.75, 0.875]:  # f > 0.5 fails that guard: one more graph for this side
        torch.testing.assert_close(k(torch.ones(3), v), branch(torch.ones(3), v))
    assert kiln.stats()["graphs"] == 3


def test_guards_and_logs_are_in_the_users_words(caplog: pytest.LogCaptureFixture) -> None:
    out = kiln.explain(branch, backend="eager", dynamic=True)(torch.ones(3), 0.75)
    assert "f > 0.5" in str(out)
    assert "check_type(L['f'], float)" in str(out)
    with kiln_logs(caplog, "recompiles,dynamic"):
        k = kiln.compile(branch, backend="eager")
        for v in VALUES:
            k(torch.ones(3), v)
    assert "f: 0.5 -> 0.25, now dynamic" in caplog.text
    assert "guard f <= 0.5" in caplog.text


def test_policy_words_for_floats() -> None:
    p = DynamicPolicy()
    assert not p.float_is_dynamic("L['f']", 0.5, None)
    p.note_float("L['f']", 0.5)
    assert p.float_is_dynamic("L['f']", 0.25, None)
    assert not p.float_is_dynamic("L['h']", 0.5, None)
    p.note_float("L['h']", 0.5, symbolic=True)  # a symbol in an entry read from disk
    assert p.float_is_dynamic("L['h']", 0.5, None)
    assert p.explain_change("L['f']", 0.5, 0.25) == "f: 0.5 -> 0.25, now dynamic"
    assert p.float_is_dynamic("L['g']", 0.5, True)
    assert not p.float_is_dynamic("L['f']", 0.25, False)
    assert p.explain_change("L['f']", 0.5, 0.25) == "f: 0.5 -> 0.25, recompiled with the new constant (dynamic=False)"
    assert not p.float_is_dynamic("L['f']", math.inf, None)
    assert not p.float_is_dynamic("L['f']", math.nan, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sqrt_of_a_negative_value_raises_as_in_eager(backend: str) -> None:
    k = kiln.compile(sqrt_scale, backend=backend)
    for v in VALUES:
        k(torch.ones(3), v)
    with pytest.raises(ValueError, match="math domain error"):
        k(torch.ones(3), -1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_floordiv_is_pythons(backend: str) -> None:
    """1.0 // 0.1 is 9.0 in Python (floor(1.0 / 0.1) is 10): the value reaching a kernel or a guard
    must be Python's."""
    k = kiln.compile(float_mod, backend=backend)
    for v in [0.5, 0.25, 1.0, 0.7]:
        torch.testing.assert_close(k(torch.ones(3), v), float_mod(torch.ones(3), v))


def cancels(x: torch.Tensor, f: float) -> torch.Tensor:
    return x * (f - f) + x * max(f, 0.3) + branch(x, f)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -0.0])
def test_special_values_after_the_float_became_dynamic(backend: str, value: float) -> None:
    """inf and nan never reach a symbolic graph (its arithmetic comes back from sympy, where f - f
    is 0): the dynamic entry is guarded finite, and they are constants of their own captures."""
    k = kiln.compile(cancels, backend=backend)
    for v in VALUES[:2] + [value, 0.375]:
        torch.testing.assert_close(k(torch.ones(3), v), cancels(torch.ones(3), v), equal_nan=True)


def test_specialize_float_keeps_every_value_a_constant() -> None:
    with kiln.config.patch(specialize_float=True):
        ours = CountingBackend()
        k = kiln.compile(scaled, backend=ours)
        for v in VALUES:
            torch.testing.assert_close(k(torch.ones(3), v), scaled(torch.ones(3), v))
    assert len(ours.graphs) == len(VALUES)


def test_module_float_attribute_becomes_symbolic_once_it_changes() -> None:
    # torch.compile(m, backend=CompileCounter()) over these values compiles 2 frames: a float
    # attribute of a module is automatic dynamic like an argument (only its ints stay constants)
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = 0.5

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.f

    m = Scale()
    ours = CountingBackend()
    k = kiln.compile(m, backend=ours)
    for v in VALUES:
        m.f = v
        torch.testing.assert_close(k(torch.ones(3)), torch.ones(3) * v)
    assert len(ours.graphs) == 2


_PERSIST_SCRIPT = textwrap.dedent("""
    import json, sys, torch, kiln

    def f(x, s):
        if s > 0.5:
            return torch.sin(x) * s
        return torch.cos(x) - s

    compiled = kiln.compile(f, options={"opt_level": "-O1"})
    report = []
    for v in json.loads(sys.argv[1]):
        x = torch.randn(8, 16)
        before = kiln.stats()
        out = compiled(x, v)
        after = kiln.stats()
        report.append([after["disk_hits"] - before["disk_hits"], after["frames"] - before["frames"],
                       (out - f(x, v)).abs().max().item()])
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": report, "kiln": environment_digest()}))
""")


@pytest.mark.cpp
def test_a_stored_dynamic_entry_takes_new_values_and_keeps_its_guards(tmp_path: Path) -> None:
    script = tmp_path / "f.py"
    script.write_text(_PERSIST_SCRIPT)
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "KILN_PERSISTENT_CACHE": "1"}
    env.pop("KILN_LOGS", None)

    digests: set[str] = set()

    def run(values: list[float]) -> list[list[float]]:
        proc = subprocess.run([sys.executable, str(script), json.dumps(values)], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        digests.add(out["kiln"])
        if len(digests) > 1:  # Kiln's sources are part of every key: edited between the runs, all miss
            pytest.skip("Kiln's sources changed between the runs of this test")
        return out["report"]

    first = run([0.5, 0.25])  # static, then dynamic under `s <= 0.5`: both stored
    assert [r[:2] for r in first] == [[0, 1], [0, 1]]
    second = run([0.375, 0.75, 0.875])
    # 0.375 passes the stored dynamic entry's guards: its graph computes with 0.375, not 0.25;
    # 0.75 fails `s <= 0.5` and is captured anew, already symbolic (the loaded entry had s as a
    # symbol), so 0.875 reuses that capture
    assert [r[:2] for r in second] == [[1, 0], [0, 1], [0, 0]]
    assert all(r[2] < 1e-5 for r in first + second)


_TRITON_SCRIPT = textwrap.dedent("""
    import json, math, torch, kiln
    from kiln import config

    def fn(x, f):
        return torch.softmax(x / math.sqrt(f), -1) * (f * 2 + 1) + 1 / f

    def train(x, f):
        return (torch.tanh(x) * f / math.sqrt(f)).sum()

    errors = []
    with config.patch(cpu_backend="triton"):
        k, t = kiln.compile(fn), kiln.compile(train)
        for v in (0.5, 0.25, 0.75, 0.125):
            x = torch.randn(7, 33)
            errors.append((k(x, v) - fn(x, v)).abs().max().item())
            x1 = torch.randn(5, requires_grad=True)
            x2 = x1.detach().clone().requires_grad_()
            t(x1, v).backward()
            train(x2, v).backward()
            errors.append((x1.grad - x2.grad).abs().max().item())
    print(json.dumps({"errors": errors, "graphs": kiln.stats()["graphs"], "fallbacks": kiln.stats()["fallbacks"]}))
""")


@pytest.mark.triton
def test_triton_kernels_take_the_float_as_an_argument(tmp_path: Path) -> None:
    """The Triton code generator under Triton's interpreter (a fresh process: the interpreter is
    chosen per process): float quotients divide as floats and sqrt goes through libdevice."""
    pytest.importorskip("triton")
    script = tmp_path / "t.py"
    script.write_text(_TRITON_SCRIPT)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO), "KILN_PERSISTENT_CACHE": "0"}
    env.pop("KILN_LOGS", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(out["errors"]) < 1e-5 and out["fallbacks"] == 0
    assert out["graphs"] == 4  # each function: one static graph, then the dynamic one


def powers(x: torch.Tensor, n: int, f: float) -> torch.Tensor:
    return x * (f ** f) + x * (n ** f) + x * f ** -2 + x / n


@pytest.mark.parametrize("backend", BACKENDS)
def test_powers_of_symbols(backend: str) -> None:
    k = kiln.compile(powers, backend=backend)
    for n, f in [(2, 0.5), (3, 0.25), (4, 0.75), (5, 1.5)]:
        x = torch.randn(3)
        torch.testing.assert_close(k(x, n, f), powers(x, n, f))
    assert kiln.stats()["graphs"] == 2 and kiln.stats()["fallbacks"] == 0


def slice_of_arange(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(16.0)[:n].sum() * x


@pytest.mark.cpp
def test_a_graph_with_the_same_code_and_other_traced_sizes_is_compiled_anew() -> None:
    """`arange(16)[:n]` with n symbolic is the same ATen code for n = 4 (size n, guarded n <= 16) and
    n = 32 (clamped to 16, guarded n >= 17); the compiled-graph cache keyed only on code and input
    metadata gave the second capture the first one's kernel, which summed 32 elements of 16. The
    float form is `floor(16 * f)` past the end."""
    k = kiln.compile(slice_of_arange)
    for n in [8, 4, 32, 40]:
        torch.testing.assert_close(k(torch.ones(3), n), slice_of_arange(torch.ones(3), n))
    k = kiln.compile(rounded)
    for v in [0.5, 0.25, 2.0, 3.0]:
        torch.testing.assert_close(k(torch.ones(3), v), rounded(torch.ones(3), v))


def saved_derived(x: torch.Tensor, f: float) -> torch.Tensor:
    y = torch.relu(x)
    z = torch.softmax(torch.where(y > f / 3, y, (f / 3) * y) * -f, -1) + math.sqrt(f)
    return z - x.sum(-1, keepdim=True) ** 2 * int(f * 10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_reads_a_value_computed_from_the_float(backend: str) -> None:
    """The backward needs f / 3 and int(f * 10): the partitioner weighs a SymFloat like a SymInt (it
    was unsaveable, so the cut saved f / 3 itself and the backward's kernel read a zf0 it was not
    given), and prefers saving f to saving a number computed from it."""
    k = kiln.compile(saved_derived, backend=backend)
    for i, v in enumerate(VALUES):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, 5, generator=g).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        k(x, v).pow(2).sum().backward()
        saved_derived(x2, v).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert kiln.stats()["graphs"] == 2 and kiln.stats()["fallbacks"] == 0


@pytest.mark.cpp
def test_lowering_binds_a_derived_float_input_to_its_own_symbol() -> None:
    """An ATen graph whose input is a value computed from a float argument (f / 3), as a backward's
    saved scalar can be: the kernel takes that input as its own double."""
    import torch.fx as fx

    from kiln.lower import compile_graph
    from kiln.symbolic import ShapeEnv

    f = ShapeEnv().create_symbolic_float(0.5, "L['f']")
    g = fx.Graph()
    a = g.placeholder("a")
    a.meta["val"] = torch.empty(4)
    s = g.placeholder("s")
    s.meta["val"] = f / 3
    m = g.call_function(torch.ops.aten.mul.Tensor, (a, s))
    m.meta["val"] = torch.empty(4)
    g.output((m,))
    compiled = compile_graph(fx.GraphModule(torch.nn.Module(), g), [torch.empty(4), f / 3])
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, 0.25 / 3)[0], x * (0.25 / 3))


GLOBAL_SCALE = 2.0


def _scaled_by_global(x):
    return x * GLOBAL_SCALE


def _doubles_global(x):
    global GLOBAL_SCALE
    GLOBAL_SCALE = GLOBAL_SCALE * 2
    return x + GLOBAL_SCALE


def test_a_global_float_that_changes_becomes_a_symbol_as_in_torch_compile() -> None:
    """A module-level float a script changes between calls: one recompile, then one graph for every
    value (torch.compile(backend="eager") makes 2 graphs for 3 values), values as eager's."""
    global GLOBAL_SCALE
    import kiln

    x = torch.ones(3)
    try:
        kiln.reset()
        compiled = kiln.compile(_scaled_by_global, backend="eager")
        for value in (2.0, 3.0, 4.5, 7.25):
            GLOBAL_SCALE = value
            torch.testing.assert_close(compiled(x), x * value)
        assert kiln.stats()["compiles"] == 2
        kiln.reset()
        GLOBAL_SCALE = 1.5
        compiled = kiln.compile(_doubles_global, backend="eager")
        for want in (3.0, 6.0, 12.0):
            torch.testing.assert_close(compiled(x), x + want)
            assert GLOBAL_SCALE == want
    finally:
        GLOBAL_SCALE = 2.0
        kiln.reset()


def _signed(x: torch.Tensor, f: float) -> tuple:
    return x * math.copysign(1.0, f), str(f)


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_zero_float_argument_keeps_its_sign(dynamic: bool | None) -> None:
    """0.0 == -0.0: a float zero is a constant guarded with its sign (as a symbol, a trace that
    specialized it was guarded equal to 0.0, which -0.0 passed: a wrong answer)."""
    kiln.reset()
    k = kiln.compile(_signed, backend="eager", dynamic=dynamic)
    for v in (1.5, 2.5, 0.0, -0.0, 0.0, -2.5):
        x = torch.ones(2)
        got, expected = k(x, v), _signed(x, v)
        assert torch.equal(got[0], expected[0]) and got[1] == expected[1], v
