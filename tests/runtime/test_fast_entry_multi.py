"""The native fast entry (kiln.capture.fast_entry, boundary.cpp's frame_entry) for frames with several
cache entries, module methods, constants, containers and shape guards: every call still picks the
entry the Python loop would, a failing guard still recompiles as before, and the values are eager's."""
from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

import kiln
from kiln import config
from kiln.capture.entry import frames_of

pytestmark = pytest.mark.cpp


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    from kiln.runtime import boundary

    module = boundary.built()
    if module is None or not hasattr(module, "frame_entry"):
        pytest.skip("the boundary extension is not built")
    kiln.reset()
    yield
    kiln.reset()


def _fast(compiled: Any) -> Any:
    """The native entry a compiled function or module runs, or None (the Python loop)."""
    if isinstance(compiled, torch.nn.Module):
        compiled = compiled._kiln_forward  # type: ignore[assignment]
    fast = getattr(compiled, "__globals__", {}).get("_kiln_fast")
    return fast if type(fast).__name__ == "Entry" else None


def _entries(compiled: Any) -> int:
    if isinstance(compiled, torch.nn.Module):
        compiled = compiled._kiln_forward  # type: ignore[assignment]
    return len(frames_of(compiled).entries)


def _hits() -> int:
    return int(kiln.stats()["cache_hits"])


def _softmax(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * y, -1)


def test_grad_modes_alternating_hit_their_own_entry_natively() -> None:
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16, requires_grad=True)
    for call in range(6):
        hits, compiles = _hits(), kiln.stats()["compiles"]
        if call % 2:
            with torch.no_grad():
                got = compiled(x, y)
            assert not got.requires_grad
        else:
            got = compiled(x, y)
            assert got.requires_grad
            got.sum().backward()
        torch.testing.assert_close(got, _softmax(x, y))
        if call >= 2:  # both entries made: every call one hit, no capture
            assert _hits() == hits + 1 and kiln.stats()["compiles"] == compiles
            assert _fast(compiled) is not None
    assert _entries(compiled) == 2 and kiln.stats()["compiles"] == 2


@pytest.mark.parametrize("other", ["dtype", "shape", "aliasing"])
def test_two_signatures_alternating_each_run_their_graph(other: str) -> None:
    compiled = kiln.compile(_softmax, dynamic=False)
    a = (torch.randn(4, 16), torch.randn(4, 16))
    same = torch.randn(4, 16)
    b = {"dtype": (a[0].double(), a[1].double()), "shape": (torch.randn(2, 8), torch.randn(2, 8)),
         "aliasing": (same, same)}[other]
    for call in range(6):
        args = b if call % 2 else a
        hits = _hits()
        got = compiled(*args)
        assert got.dtype == args[0].dtype and got.shape == args[0].shape
        torch.testing.assert_close(got, _softmax(*args))
        if call >= 2:
            assert _hits() == hits + 1 and _fast(compiled) is not None
    assert kiln.stats()["compiles"] == 2 and _entries(compiled) == 2


def test_a_third_signature_recompiles_and_joins_the_native_entry() -> None:
    compiled = kiln.compile(_softmax, dynamic=False)
    signatures = [(torch.randn(4, 16, dtype=d), torch.randn(4, 16, dtype=d))
                  for d in (torch.float32, torch.float64, torch.bfloat16)]
    for round_ in range(3):
        for k, args in enumerate(signatures):
            torch.testing.assert_close(compiled(*args), _softmax(*args))
            if round_ == 0:
                assert kiln.stats()["compiles"] == k + 1  # a miss in C goes to the loop, which captures
    assert kiln.stats()["compiles"] == 3 and _entries(compiled) == 3 and _fast(compiled) is not None


def test_the_cache_size_limit_still_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "cache_size_limit", 2)
    compiled = kiln.compile(_softmax, dynamic=False)
    dtypes = (torch.float32, torch.float64, torch.bfloat16)
    for _ in range(3):
        for d in dtypes:
            args = (torch.randn(4, 16, dtype=d), torch.randn(4, 16, dtype=d))
            torch.testing.assert_close(compiled(*args), _softmax(*args))
    assert kiln.stats()["compiles"] == 2 and _entries(compiled) == 2  # the third runs eagerly
    assert kiln.stats()["fallbacks"] == 3 and _fast(compiled) is not None


def test_fast_entry_off_keeps_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "fast_entry", False)
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), _softmax(x, y))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, y), _softmax(x, y))
    assert _fast(compiled) is None and _entries(compiled) == 2


def _scale(x: torch.Tensor, n: Any) -> torch.Tensor:
    return x * n + 1


@pytest.mark.parametrize("values", [(2, 3), (True, False), (0.0, -0.0), (1.5, 2.5), ("a", "b")],
                         ids=["int", "bool", "zero-sign", "float", "str"])
def test_constant_arguments_pick_the_entry_of_their_value(values: tuple) -> None:
    def f(x: torch.Tensor, n: Any) -> torch.Tensor:
        if isinstance(n, str):
            return x + len(n) if n == "a" else x - 1
        if type(n) is float and n == 0.0:
            return x * torch.tensor(1.0).copysign(torch.tensor(n))  # the zero's sign is read
        return x * n + 1

    compiled = kiln.compile(f)
    x = torch.randn(8)
    for call in range(6):
        n = values[call % 2]
        torch.testing.assert_close(compiled(x, n), f(x, n))
    torch.testing.assert_close(compiled(x, values[1]), f(x, values[1]))
    assert _fast(compiled) is not None  # specialized or automatic-dynamic: both entries in C


def test_an_automatic_dynamic_int_keeps_its_range_guards() -> None:
    compiled = kiln.compile(_scale)
    x = torch.randn(8)
    for n in (2, 3, 4, 5, 2):
        torch.testing.assert_close(compiled(x, n), _scale(x, n))
    assert _fast(compiled) is not None
    compiles = kiln.stats()["compiles"]
    big = 2 ** 62 + 1  # inside int64: the symbolic int's range guards pass, no capture
    torch.testing.assert_close(compiled(x.double(), big), _scale(x.double(), big))
    torch.testing.assert_close(compiled(x, 7), _scale(x, 7))
    assert kiln.stats()["compiles"] == compiles + 1  # the double tensor only
    torch.testing.assert_close(compiled(x, 3.5), _scale(x, 3.5))  # a float where an int was: type guard
    assert kiln.stats()["compiles"] == compiles + 2


def test_automatic_dynamic_shapes_check_their_shape_guards_natively() -> None:
    compiled = kiln.compile(_softmax)
    for n in (4, 6, 8, 4, 6):
        args = (torch.randn(n, 16), torch.randn(n, 16))
        torch.testing.assert_close(compiled(*args), _softmax(*args))
    assert _fast(compiled) is not None
    compiles = kiln.stats()["compiles"]
    args = (torch.randn(6, 16), torch.randn(5, 16))  # the relation x.size(0) == y.size(0) fails
    with pytest.raises(RuntimeError):
        _softmax(*args)
    with pytest.raises(RuntimeError):
        compiled(*args)
    one = (torch.randn(1, 16), torch.randn(1, 16))  # below the dynamic dim's lower bound 2
    torch.testing.assert_close(compiled(*one), _softmax(*one))
    assert kiln.stats()["compiles"] > compiles


def test_none_and_tensor_arguments_alternate() -> None:
    def f(x: torch.Tensor, b: Any) -> torch.Tensor:
        return x * 2 if b is None else x + b

    compiled = kiln.compile(f)
    x, b = torch.randn(8), torch.randn(8)
    for call in range(6):
        arg = None if call % 2 else b
        torch.testing.assert_close(compiled(x, arg), f(x, arg))
    assert _fast(compiled) is not None


def test_containers_of_tensors_are_checked_item_by_item() -> None:
    def f(xs: Any) -> torch.Tensor:
        return xs[0] * 2 + xs[1]

    compiled = kiln.compile(f)
    a, b = torch.randn(8), torch.randn(8)
    for call in range(6):
        xs = [a, b] if call % 2 else (a, b)
        torch.testing.assert_close(compiled(xs), f(xs))
    assert _fast(compiled) is not None and kiln.stats()["compiles"] == 2
    longer = [a, b, a]
    torch.testing.assert_close(compiled(longer), f(longer))  # len guard: a new entry
    torch.testing.assert_close(compiled([a, b.double()]), f([a, b.double()]))  # an item's dtype
    torch.testing.assert_close(compiled([b, b]), f([b, b]))  # aliasing of items
    assert kiln.stats()["compiles"] == 5


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.scale = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.fc(x))) * self.scale


def _pair() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    mod = _Block()
    ref = _Block()
    ref.load_state_dict(mod.state_dict())
    return mod, ref, kiln.compile(mod)


def _same_modules(mod: torch.nn.Module, ref: torch.nn.Module) -> None:
    for (name, got), (_, want) in zip(mod.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(got, want, msg=name)


def test_a_module_in_train_and_eval_alternating_runs_natively() -> None:
    mod, ref, compiled = _pair()
    for call in range(8):
        x = torch.randn(8, 16)
        train = call % 2 == 0
        mod.train(train)
        ref.train(train)
        with torch.set_grad_enabled(train):
            hits = _hits()
            got, want = compiled(x), ref(x)
        torch.testing.assert_close(got, want)
        _same_modules(mod, ref)  # batch norm's running statistics updated in train mode only
        if call >= 2:
            assert _hits() == hits + 1 and _fast(compiled) is not None
    assert kiln.stats()["compiles"] == 2


def _check(compiled: Any, mod: torch.nn.Module, ref: torch.nn.Module) -> None:
    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))
    _same_modules(mod, ref)


def _warm(compiled: Any, mod: torch.nn.Module, ref: torch.nn.Module) -> None:
    mod.eval()
    ref.eval()
    for _ in range(3):
        _check(compiled, mod, ref)
    assert _fast(compiled) is not None


@pytest.mark.parametrize("change", ["int attribute", "float attribute", "eps", "affine weight dropped", "training flag"])
def test_module_attribute_changes_recompile(change: str) -> None:
    mod, ref, compiled = _pair()
    _warm(compiled, mod, ref)
    compiles = kiln.stats()["compiles"]
    for m in (mod, ref):
        if change == "int attribute":
            m.scale = 3
        elif change == "float attribute":
            m.scale = 0.5  # an int read before: the type guard
        elif change == "eps":
            m.bn.eps = 1e-1
        elif change == "affine weight dropped":
            m.bn.weight = None  # a Parameter read before: the parameter table's guards
        else:
            m.bn.train()
    _check(compiled, mod, ref)
    assert kiln.stats()["compiles"] == compiles + 1
    _check(compiled, mod, ref)
    assert kiln.stats()["compiles"] == compiles + 1 and _fast(compiled) is not None


@pytest.mark.parametrize("shape", [(16, 16), (16, 16, "double")])
def test_a_replaced_parameter_is_read_by_the_native_entry(shape: tuple) -> None:
    mod, ref, compiled = _pair()
    _warm(compiled, mod, ref)
    dtype = torch.float64 if "double" in shape else torch.float32
    weight = torch.randn(16, 16)
    for m in (mod, ref):
        m.fc.weight = torch.nn.Parameter(weight.clone())
        if dtype is torch.float64:
            m.double()
    x = torch.randn(8, 16, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))  # the new weight's values, not the old
        torch.testing.assert_close(compiled(x), ref(x))
    assert _fast(compiled) is not None


@pytest.mark.parametrize("where", ["submodule forward hook", "pre hook", "global hook", "instance forward"])
def test_hooks_added_after_compile_run(where: str) -> None:
    mod, ref, compiled = _pair()
    _warm(compiled, mod, ref)
    handles = []
    for m in (mod, ref):
        if where == "submodule forward hook":
            handles.append(m.fc.register_forward_hook(lambda module, args, out: out * 10))
        elif where == "pre hook":
            handles.append(m.bn.register_forward_pre_hook(lambda module, args: (args[0] + 1,)))
        elif where == "instance forward":
            inner = m.fc
            m.fc.forward = lambda x, inner=inner: torch.nn.functional.linear(x, inner.weight) * 3  # type: ignore[method-assign]
    if where == "global hook":
        handles.append(torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: out + 5 if isinstance(module, torch.nn.Linear) else out))
    try:
        x = torch.randn(8, 16)
        with torch.no_grad():
            got = compiled(x)
            want = ref(x)
        if where == "global hook":  # ref's hook already ran once per module call above
            pass
        torch.testing.assert_close(got, want)
    finally:
        for h in handles:
            h.remove()


def test_a_replaced_activation_function_recompiles() -> None:
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    compiled = kiln.compile(layer)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), layer(x))
        assert _fast(compiled) is not None
        layer.activation = torch.nn.functional.gelu
        torch.testing.assert_close(compiled(x), layer(x))


def test_a_dropped_compiled_module_is_freed() -> None:
    refs = []
    for _ in range(3):
        mod = _Block()
        compiled = kiln.compile(mod)
        for train in (True, False):
            mod.train(train)
            for _ in range(2):
                compiled(torch.randn(8, 16))
        assert _fast(compiled) is not None
        refs.append((weakref.ref(mod), weakref.ref(compiled)))
        del mod, compiled
    gc.collect()
    # the native entry holds the module as the method's self, in a cycle with the Python entry: freed
    # with it. (The first module stays while the code's cache holds the entries traced on it.)
    assert [(a() is None, b() is None) for a, b in refs][1:] == [(True, True)] * 2
    assert refs[0][1]() is None


def test_a_frame_the_native_entry_refuses_says_why_and_stays_correct(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from kiln import log

    scale = torch.tensor(2.0)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * scale  # a closure cell: its guard reads F, which only the Python loop checks

    compiled = kiln.compile(f)
    log.configure("perf_hints")
    try:
        with caplog.at_level(logging.INFO, logger="kiln"):
            x = torch.randn(8)
            for _ in range(3):
                torch.testing.assert_close(compiled(x), f(x))
    finally:
        log.configure(None)
    assert _fast(compiled) is None
    assert any("calls take the Python entry" in r.getMessage() and "F." in r.getMessage() for r in caplog.records)
    scale = torch.tensor(3.0)  # noqa: F841  # the cell changes: the loop's guard sees it
    torch.testing.assert_close(compiled(x), f(x))
