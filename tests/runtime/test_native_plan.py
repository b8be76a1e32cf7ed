"""Native plans (kiln.lower.codegen.plan, the boundary extension's plan runner): a graph runs
natively with no C++ compiled for it, and computes, raises and aliases exactly as its Python wrapper
and its compiled C++ wrapper do."""
from __future__ import annotations

import array
import dataclasses
import functools
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.log import KilnWarning
from kiln.lower.codegen import plan as plan_codegen
from kiln.capture import persist
from kiln.lower import compile_graph
from kiln.runtime import artifact, boundary, build, native
from tests.lower.conftest import aten_graph

pytestmark = pytest.mark.cpp

WRAPPERS = {  # how each variant is asked for
    "python": {"cpu_wrapper": "python"},
    "compiled": {"cpu_wrapper": "native", "native_plan": False},
    "plan": {"cpu_wrapper": "native", "native_plan": True},
    "plan_tier_up": {"cpu_wrapper": "auto", "native_plan": True},
}


def _facts(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad)
    return t


def _run(fn: Callable[..., Any], calls: list[tuple], wrapper: str, dynamic: bool | None = None) -> tuple[list, int]:
    """Outputs of `fn` compiled with `wrapper` on each call's arguments, and how many plans were bound."""
    kiln.reset()
    bound: list[int] = []
    real = native.bind_plan

    def spy(*args: Any, **kwargs: Any) -> Any:
        bound.append(1)
        return real(*args, **kwargs)

    native.bind_plan = spy  # type: ignore[assignment]
    try:
        with config.patch(**WRAPPERS[wrapper]), warnings.catch_warnings():
            warnings.simplefilter("error", KilnWarning)
            compiled = kiln.compile(fn, dynamic=dynamic)
            outs = []
            for args in calls:
                try:
                    outs.append(compiled(*args))
                except Exception as exc:  # compared as type and message
                    outs.append((type(exc), str(exc)))
    finally:
        native.bind_plan = real  # type: ignore[assignment]
        kiln.reset()
    return outs, len(bound)


def _same(a: Any, b: Any) -> None:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert _facts(a) == _facts(b)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        assert a == b


def _equivalent(fn: Callable[..., Any], calls: list[tuple], dynamic: bool | None = None,
                wrappers: tuple[str, ...] = ("compiled", "plan", "plan_tier_up")) -> None:
    boundary.load()  # built once per torch and Python: plans run from the first call
    expected, _ = _run(fn, calls, "python", dynamic)
    for wrapper in wrappers:
        got, bound = _run(fn, calls, wrapper, dynamic)
        if wrapper.startswith("plan"):
            assert bound, f"{wrapper}: no graph ran a plan"
        _same(got, expected)


def test_externs_and_kernels_match_every_wrapper() -> None:
    w = torch.randn(6, 8)
    b = torch.randn(6)

    def fn(x: torch.Tensor) -> Any:
        h = F.linear(x, w, b).relu()
        return h @ h.t(), torch.bmm(h.unsqueeze(0), h.t().unsqueeze(0)).sum(-1) * 2

    _equivalent(fn, [(torch.randn(4, 8),) for _ in range(3)])


def test_convolution_and_views_of_inputs() -> None:
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return conv(x).sigmoid() + y[..., 1:].mean(), x.transpose(2, 3)[:, :, 1:], y.t()

    base = torch.randn(2, 3, 6, 7)
    calls = [(base, torch.randn(9, 5)), (base.transpose(2, 3).contiguous().transpose(2, 3), torch.randn(9, 5)),
             (torch.randn(2, 3, 6, 8)[..., 1:], torch.randn(5, 9).t())]  # strided and offset inputs
    _equivalent(lambda x, y: fn(x, y), calls)


def test_dynamic_shapes_evaluate_size_programs() -> None:
    def fn(x: torch.Tensor, n: int) -> Any:
        y = x.reshape(-1, x.shape[-1] // 2, 2).sum(1) * n
        return y[: (x.shape[0] + 1) // 2], y.shape[0] % 3, x.shape[0] * 2 - 7

    calls = [(torch.randn(s, 6), n) for s, n in ((5, 1), (7, 2), (9, 3), (4, -1))]
    _equivalent(fn, calls, dynamic=True)


def test_a_returned_size_symbol_is_an_int_not_a_bool() -> None:
    """A graph that returns a bare size symbol (a forward handing its backward a weight's size under
    dynamic=True, or a user's x.shape[0]): sympy's Symbol is also a sympy Boolean, so the compiled
    wrapper returned static_cast<bool>(s0) (True) and the plan refused the graph (probe round 10)."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        return x * 2, x.shape[0], w.shape[0] + 0

    calls = [(torch.randn(s, 4), torch.randn(w)) for s, w in ((5, 3), (7, 6), (9, 2))]
    _equivalent(fn, calls, dynamic=True, wrappers=("compiled", "plan"))  # one kernel: "auto" keeps Python
    got, _ = _run(fn, calls, "compiled", dynamic=True)
    assert [type(v) for v in got[0][1:]] == [int, int]


TRAINED_DYNAMIC: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], int]] = {
    # (program, float input shapes, high of an int index input or 0 for none)
    "conv1d_bias": (lambda x, w, b: F.conv1d(x, w, b, padding=1) * 2 + 1, ((2, 3, 8), (4, 3, 3), (4,)), 0),
    # the weight's gradient sized by a returned symbol read as 1: heap corruption ("munmap_chunk():
    # invalid pointer") killed the process
    "embedding_bag": (lambda w, i: F.embedding_bag(i, w, torch.tensor([0, 3, 5]), mode="mean") * 2 + 1,
                      ((10, 4),), 10),
}


@pytest.mark.parametrize("name", list(TRAINED_DYNAMIC))
def test_dynamic_training_sized_by_returned_symbols(name: str) -> None:
    """A gradient sized by a symbol the backward reads from the forward's returned sizes (a bias's,
    an embedding table's): returned as True by the compiled wrapper, the gradient came back of size
    1 ("the extern aten::convolution_backward returned ... sizes [4] where its fake tensor ... sizes
    [1]"), or an ATen kernel wrote past a buffer sized by it (probe round 10)."""
    boundary.load()
    fn, shapes, high = TRAINED_DYNAMIC[name]

    def train(wrapper: str) -> list[torch.Tensor]:
        kiln.reset()
        grads = []
        with config.patch(**WRAPPERS[wrapper]):
            step = kiln.compile(fn, dynamic=True)
            for k in range(3):
                g = torch.Generator().manual_seed(k)
                leaves = [torch.randn(*s, generator=g, requires_grad=True) for s in shapes]
                index = [torch.randint(0, high, (8,), generator=g)] if high else []
                step(*leaves, *index).square().sum().backward()
                grads += [t.grad for t in leaves]
        kiln.reset()
        return grads

    expected = train("python")
    for wrapper in ("compiled", "plan", "plan_tier_up"):
        for e, g in zip(expected, train(wrapper)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_a_failed_index_check_raises_what_eager_raises() -> None:
    def fn(a: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return a[i] * 2 + a.sum()

    a = torch.randn(5, 3)
    calls = [(a, torch.tensor([1, 2])), (a, torch.tensor([7])), (a, torch.tensor([-6])), (a, torch.tensor([4]))]
    _equivalent(fn, calls)
    got, _ = _run(fn, calls, "plan")
    assert got[1][0] is IndexError and "out of bounds" in got[1][1]


def test_no_grad_inside_with_parameters_that_require_grad() -> None:
    lin = torch.nn.Linear(5, 3)

    def fn(x: torch.Tensor) -> Any:
        with torch.no_grad():
            y = lin(x).tanh()
        return y, lin(x) * 2

    _equivalent(fn, [(torch.randn(4, 5, requires_grad=True),) for _ in range(3)])


def test_training_forward_and_backward() -> None:
    boundary.load()

    def train(wrapper: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                    torch.nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kiln.reset()
        with config.patch(**WRAPPERS[wrapper]):
            step = kiln.compile(model)
            for k in range(4):
                loss = step(torch.randn(6, 8, generator=torch.Generator().manual_seed(k))).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        kiln.reset()
        return [p.detach().clone() for p in model.parameters()]

    expected = train("python")
    for wrapper in ("compiled", "plan", "plan_tier_up"):
        for e, g in zip(expected, train(wrapper)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_a_graph_runs_its_plan_with_no_compiler_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the boundary extension and the graph's kernel library are built, the native tier needs
    no compile: the compiler is made to fail and the graph still runs natively from its first call."""
    boundary.load()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() @ x.t()).relu() + 1

    x = torch.randn(5, 5)
    expected, _ = _run(fn, [(x,)], "python")
    _run(fn, [(x,)], "plan_tier_up")  # the kernel library, built once into the cache

    def no_compiler(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the compiler ran")

    monkeypatch.setattr(build, "compile_shared", no_compiler)
    monkeypatch.setattr(build, "run_compiler", no_compiler)
    got, bound = _run(fn, [(x,), (x,)], "plan_tier_up")
    assert bound == 1
    _same(got[0], expected[0])
    _same(got[1], expected[0])


def test_a_plan_runs_from_the_first_call_once_the_extension_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    boundary.load()
    ran: list[int] = []
    real = native.bind_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        call = real(*args, **kwargs)
        return lambda *a: (ran.append(1), call(*a))[1]

    monkeypatch.setattr(native, "bind_plan", counting)
    kiln.reset()
    with config.patch(**WRAPPERS["plan_tier_up"]):
        compiled = kiln.compile(lambda x: (x.cos() @ x.t()).relu() + 1)  # two steps: a kernel, a matmul
        x = torch.randn(4, 4)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), (x.cos() @ x.t()).relu() + 1)
    kiln.reset()
    assert len(ran) == 3  # the first call too


@pytest.mark.parametrize("graph", ["kernel", "extern"])
def test_a_graph_of_one_step_runs_its_plan_too(graph: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-kernel graph (a softmax's forward, its backward) or a lone matmul has no compiled native
    wrapper to tier up to, but its plan costs nothing to build: it runs from the first call, not
    the Python wrapper's thread check, stride checks, allocation and ctypes call (it stayed on the
    Python wrapper before); forward and backward of a training graph alike."""
    boundary.load()
    ran: list[int] = []
    real = native.bind_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        call = real(*args, **kwargs)
        counted = lambda *a: (ran.append(1), call(*a))[1]  # noqa: E731
        counted.steal = lambda items: (ran.append(1), call.steal(items))[1]  # type: ignore[attr-defined]
        return counted

    monkeypatch.setattr(native, "bind_plan", counting)
    kiln.reset()
    fn = (lambda x: torch.softmax(x, -1)) if graph == "kernel" else (lambda x: x @ x.t())
    with config.patch(**WRAPPERS["plan_tier_up"]):
        compiled = kiln.compile(fn)
        x = torch.randn(4, 8, requires_grad=graph == "kernel")
        for _ in range(2):
            out = compiled(x)
            torch.testing.assert_close(out, fn(x))
            if graph == "kernel":
                out.backward(torch.ones_like(out))
    kiln.reset()
    assert len(ran) == (4 if graph == "kernel" else 2)  # each call of each graph, the first too


def test_a_malformed_plan_raises_instead_of_reading_outside_it() -> None:
    module = boundary.load()
    good = native.Plan(bytes(), (), (), (), (), (), (0, 0, 0), ())
    call = native.bind_plan(module, good, None, None)
    assert call() == ()
    for words in ([plan_codegen.TAKE, 5, 0], [plan_codegen.OUT, plan_codegen.V_TENSOR, 3, 0], [99],
                  [plan_codegen.SET, 0, 1, plan_codegen.T_ADD], [plan_codegen.NARGS]):
        bad = native.Plan(array.array("q", words).tobytes(), (), (), (), (), (), (1, 1, 0), ())
        with pytest.raises(RuntimeError, match="kiln plan"):
            native.bind_plan(module, bad, None, None)(torch.randn(2))


def test_inputs_mutated_in_place_and_outputs_that_alias_inputs() -> None:
    boundary.load()

    def fn(x: torch.Tensor, s: torch.Tensor) -> Any:
        s.mul_(0.5).add_(x.sum(0))  # an input's new value, computed in its storage
        return x.t(), x[1:].view(-1), (x * 2).relu()

    results = {}
    for wrapper in ("python", "compiled", "plan", "plan_tier_up"):
        torch.manual_seed(0)
        x, s = torch.randn(4, 3), torch.randn(3)
        outs, _ = _run(fn, [(x, s), (x, s), (x, s)], wrapper)
        for got in outs:
            assert got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert got[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        results[wrapper] = (outs, s.clone())
    for wrapper in ("compiled", "plan", "plan_tier_up"):
        _same(results[wrapper][0], results["python"][0])
        torch.testing.assert_close(results[wrapper][1], results["python"][1])


def _stored_plan_recipe(rows: int) -> tuple[Any, list[torch.Tensor]]:
    """A graph's recipe as the frame cache stores it (round-tripped through its record format)."""
    torch.manual_seed(rows)
    args = [torch.randn(rows, 5), torch.randn(5, 5), torch.randn(5)]
    gm, examples = aten_graph(_block, *args)
    with config.patch(**WRAPPERS["plan_tier_up"]):
        compiled = compile_graph(gm, examples)
    recipe = artifact.describe(compiled.fn)
    assert recipe is not None and recipe.kind == "tiered"
    return persist.loads(persist.dumps(recipe)), args


def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    h = torch.addmm(b, x, w).relu()
    return torch.softmax(h @ w.t(), -1) * 2, h.sum(0)


def _on_plan(fn: Any) -> bool:
    current = getattr(fn, "current", fn)
    return isinstance(current, functools.partial) and current.func is boundary.load().call


def test_a_stored_graph_runs_its_plan_in_a_later_process_without_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    boundary.load()
    recipe, args = _stored_plan_recipe(777)
    ref = recipe.fields["native"]
    # no per-graph C++ was built: the later process has no graph library to load
    assert isinstance(ref, native.NativeRef) and not any(build.load_cached(r) for r in ref.graph_libraries)

    def no_compiler(*a: Any, **k: Any) -> None:
        raise AssertionError("the compiler ran")

    monkeypatch.setattr(build, "compile_shared", no_compiler)
    with config.patch(native_plan=True):
        loaded = artifact.rebuild(recipe)  # the plan, written anew from the checked stored program
    assert isinstance(loaded, native.TieredWrapper) and _on_plan(loaded)
    for g, w in zip(loaded(*args), _block(*args)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_stored_program_that_is_not_the_recorded_one_runs_no_plan() -> None:
    boundary.load()
    recipe, args = _stored_plan_recipe(778)
    ref = recipe.fields["native"]
    forged = dataclasses.replace(ref, program=(ref.program[0], "0" * 64))
    python = artifact.rebuild(recipe.fields["python"])
    with config.patch(native_plan=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = native.load_tiered(python, forged)
        got = loaded(*args)
    assert any("not the stored one" in str(w.message) for w in caught)
    assert isinstance(loaded, native.TieredWrapper) and loaded.current is python and loaded.after is None
    for g, w in zip(got, _block(*args)):
        torch.testing.assert_close(g, w)
