"""The boundary extension's guard checks (kiln.runtime.boundary `tensor_ok`, `same_keys`) against the
generated Python checks they replace: the same verdict and the same explanation on every value, the
switch of a check function made before the extension loaded, and recompiles end to end."""
from __future__ import annotations

import collections
import gc
import types
from typing import Any

import pytest
import torch

import kiln
from kiln.capture.guards import compile as guards_module  # where compile_guards looks up native_checks
from kiln.capture.guards import native as native_guards
from kiln.capture.guards import Guard, compile_guards, tensor_guard
from kiln.runtime import boundary as boundary_module
from kiln.runtime import native

pytestmark = pytest.mark.cpp  # the boundary extension is compiled once per cache

@pytest.fixture(scope="module")
def boundary() -> Any:
    return native.boundary()


def _verdicts(guards: list[Guard], values: list[Any], boundary: Any) -> list[tuple[bool, str]]:
    python = compile_guards(guards, native=None)
    fast = compile_guards(guards, native=boundary)
    assert not python.native and "___tensor_ok" not in python.source and "___same_keys" not in python.source
    assert fast.native
    out = []
    for value in values:
        L = {"x": value}
        verdict = python(L, {}, None)
        assert fast(L, {}, None) == verdict, (guards, value)
        why = python.explain_failure(L, {}, None)
        assert fast.explain_failure(L, {}, None) == why
        out.append((verdict, why))
    return out


def _tensors() -> list[torch.Tensor]:
    base = torch.randn(4, 6)
    with torch.inference_mode():
        inference = torch.randn(4, 6)
    complex_ = torch.randn(4, 6, dtype=torch.complex64)
    return [
        base, torch.randn(4, 6), torch.randn(6, 4).t(), torch.randn(4, 12)[:, ::2], torch.randn(4, 7)[:, :6],
        torch.randn(5, 6), torch.randn(4, 6, 1), torch.randn(4), torch.randn(4, 6, dtype=torch.float64),
        torch.randn(4, 6, dtype=torch.float16), torch.zeros(4, 6, dtype=torch.int64), torch.randn(4, 6, requires_grad=True),
        torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(4, 6), requires_grad=False),
        inference, torch.empty(4, 6, device="meta"), base.to_sparse(), complex_, complex_.conj(),
        torch.randn(2, 4, 6)[0], torch.randn(8, 6)[::2], torch.randn(4, 6).contiguous(memory_format=torch.contiguous_format),
        torch.randn(2, 3, 4, 6).contiguous(memory_format=torch.channels_last), torch.randn(2, 3, 4, 6),
        torch.randn(9, 5, 3), torch.randn(9, 10, 3)[:, ::2], torch.randn(1, 6), torch.randn(0, 6),
    ]


CANDIDATES = _tensors() + [3, None, "x", [torch.randn(4, 6)], torch.Size([4, 6])]


@pytest.mark.parametrize("index", range(len(_tensors())))
@pytest.mark.parametrize("dynamic", [(), (0,), (0, 1), (1,)])
def test_tensor_check_agrees_with_python(boundary: Any, index: int, dynamic: tuple[int, ...]) -> None:
    captured = _tensors()[index]
    if captured.dim() < 2 or captured.layout != torch.strided:
        dynamic = ()
    guard = tensor_guard("L['x']", captured, dynamic_dims=[d for d in dynamic if d < captured.dim()])
    verdicts = _verdicts([guard], CANDIDATES, boundary)
    if captured.device.type != "meta" and type(captured) in (torch.Tensor, torch.nn.Parameter):
        assert "___tensor_ok" in compile_guards([guard], native=boundary).source
    # the tensor captured passes; some other candidate fails (the checks decide something)
    assert verdicts[index] == (True, "all guards pass")
    assert any(not ok for ok, _ in verdicts)


def test_parameters_and_marks(boundary: Any) -> None:
    from kiln.symbolic.marks import mark_dynamic

    x = torch.randn(4, 3)
    marked = torch.randn(4, 3)
    mark_dynamic(marked, 1)
    verdicts = _verdicts([tensor_guard("L['x']", x)], [x, marked], boundary)
    assert verdicts == [(True, "all guards pass"), (False, "x has dims newly marked dynamic: [1]")]
    param = torch.nn.Parameter(torch.randn(4, 3))
    verdicts = _verdicts([tensor_guard("L['x']", param)], [param, param.detach(), torch.nn.Parameter(x.double())],
                         boundary)
    assert verdicts[1] == (False, "x changed type from torch.nn.Parameter to torch.Tensor")
    assert verdicts[2] == (False, "x.dtype changed from torch.float32 to torch.float64")


@pytest.mark.parametrize("dynamic", [(), (0,), (1,), (0, 1)])
def test_marks_are_checked_inside_the_one_native_call(boundary: Any, dynamic: tuple[int, ...]) -> None:
    # tensor_ok reads the tensor's kiln.mark_dynamic marks itself (no getattr per tensor and call),
    # with the Python check's verdicts and reasons: marks within the dims already dynamic pass
    from kiln.symbolic.marks import DYNAMIC_ATTR, mark_dynamic

    captured = torch.randn(4, 3)
    guard = tensor_guard("L['x']", captured, dynamic_dims=list(dynamic))
    source = compile_guards([guard], native=boundary).source
    assert "___tensor_ok" in source and "getattr(" not in source
    candidates: list[Any] = [captured]
    for dims in ((0,), (1,), (0, 1)):
        for make in (lambda: torch.randn(4, 3), lambda: torch.nn.Parameter(torch.randn(4, 3))):
            t = make()
            mark_dynamic(t, dims)
            candidates.append(t)
    odd = torch.randn(4, 3)
    setattr(odd, DYNAMIC_ATTR, {1})  # a plain set, as a user might set it: compared as Python compares it
    candidates.append(odd)
    verdicts = _verdicts([guard], candidates, boundary)
    for value, (ok, why) in zip(candidates, verdicts):
        marks = getattr(value, DYNAMIC_ATTR, frozenset())
        if type(value) is torch.Tensor:
            assert ok == (marks <= set(dynamic)), (dynamic, marks, why)


def test_a_tensor_subclass_keeps_the_python_checks(boundary: Any) -> None:
    class Tagged(torch.Tensor):
        pass

    t = torch.randn(3).as_subclass(Tagged)
    source = compile_guards([tensor_guard("L['x']", t)], native=boundary).source
    assert "___tensor_ok" not in source and ".dtype is" in source
    assert _verdicts([tensor_guard("L['x']", t)], [t, torch.randn(3), torch.randn(4).as_subclass(Tagged)],
                     boundary) == [(True, "all guards pass"),
                                   (False, f"x changed type from {Tagged.__qualname__} to torch.Tensor"),
                                   (False, "x.size()[0] changed from 3 to 4")]


class _Key:
    """A key equal to a string by __eq__ (and hashed as it), not the same object."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return other == self.text or isinstance(other, _Key) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def test_keys_check_agrees_with_python(boundary: Any) -> None:
    ordered = collections.OrderedDict(a=1, b=2)
    moved = collections.OrderedDict(a=1, b=2)
    moved.move_to_end("a")  # the dict's own storage keeps a, b: only the OrderedDict's order changed

    class Sub(dict):
        pass

    values = [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1}, {"a": 1, "b": 2, "c": 3}, {}, ordered, moved,
              Sub(a=1, b=2), Sub(b=1, a=2), types.MappingProxyType({"a": 1, "b": 2}), {_Key("a"): 1, "b": 2},
              {1: 1, 2: 2}, 3, None]
    verdicts = _verdicts([Guard("L['x']", "check_keys", ("a", "b"))], values, boundary)
    assert [ok for ok, _ in verdicts] == [True, False, False, False, False, True, False, True, False, True, True,
                                          False, False, False]
    assert verdicts[1][1] == "keys of x changed from ['a', 'b'] to ['b', 'a']"
    assert _verdicts([Guard("L['x']", "check_keys", (1, 2))], [{1: 0, 2: 0}, {1.0: 0, True: 0}, {2: 0, 1: 0}],
                     boundary) == [(True, "all guards pass"), (False, "keys of x changed from [1, 2] to [1.0]"),
                                   (False, "keys of x changed from [1, 2] to [2, 1]")]


def test_a_check_made_before_the_extension_switches_when_it_loads(boundary: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A process whose boundary is not loaded yet: the check is made in Python and waits for it.
    monkeypatch.setattr(boundary_module, "_loaded", [])
    monkeypatch.setattr(boundary_module, "_when_loaded", [])
    monkeypatch.setattr(native_guards, "_waiting_for_boundary", [False])
    monkeypatch.setattr(guards_module, "native_checks", lambda: None)
    x = torch.randn(4, 6)
    guards = [tensor_guard("L['x']", x), Guard("L['d']", "check_keys", ("a",))]
    check = compile_guards(guards)
    fn, code = check.fn, check.fn.__code__
    assert not check.native and "___tensor_ok" not in check.source
    kept = compile_guards(guards, native=None)  # asked for Python: it stays Python
    L = {"x": torch.randn(4, 6), "d": {"a": 1}}
    assert fn(L, {}, None) and kept(L, {}, None)

    loaded = native.boundary()  # what the tier-up thread does: the library is in the cache already
    assert check.native and check.fn is fn and fn.__code__ is not code and "___tensor_ok" in check.source
    assert not kept.native and "___tensor_ok" not in kept.source
    assert loaded.tensor_ok is fn.__globals__["___tensor_ok"]
    assert fn(L, {}, None)
    for changed, why in [({"x": torch.randn(4, 6, requires_grad=True)}, "x.requires_grad changed from False to True"),
                         ({"x": torch.randn(6, 4).t()}, "x.stride() changed from (6, 1) to (1, 4)"),
                         ({"d": {"b": 1}}, "keys of d changed from ['a'] to ['b']")]:
        assert not fn({**L, **changed}, {}, None)
        assert check.explain_failure({**L, **changed}, {}, None) == why


def test_native_guards_off_keeps_python(boundary: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.config, "native_guards", False)
    assert guards_module.native_checks() is None
    assert not compile_guards([tensor_guard("L['x']", torch.randn(2))]).native


def test_recompiles_end_to_end_like_torch_compile(boundary: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Functions guarded natively recompile on the same calls as the real torch.compile (graph
    counts of a counting backend), and their outputs are eager's."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    from kiln.backends import CountingBackend

    monkeypatch.setattr(guards_module, "native_checks", lambda: boundary)

    def f(x: torch.Tensor, d: dict) -> torch.Tensor:
        out = x * 2
        for key in d:
            out = out + d[key] * (2 if key == "a" else 3)
        return out

    calls = [
        (torch.randn(4, 6), {"a": torch.ones(6), "b": torch.ones(6)}),
        (torch.randn(4, 6), {"a": torch.zeros(6), "b": torch.ones(6)}),  # hit
        (torch.randn(4, 6, dtype=torch.float64), {"a": torch.ones(6), "b": torch.ones(6)}),
        (torch.randn(6, 4).t(), {"a": torch.ones(6), "b": torch.ones(6)}),
        (torch.randn(4, 6, requires_grad=True), {"a": torch.ones(6), "b": torch.ones(6)}),
        (torch.randn(4, 6), {"b": torch.ones(6), "a": torch.ones(6)}),  # another key order
        (torch.randn(4, 6), {"a": torch.ones(6)}),
        (torch.randn(4, 6), {"b": torch.ones(6), "a": torch.ones(6)}),  # hit
    ]
    kiln.reset()
    torch._dynamo.reset()
    ours, theirs = CountingBackend(), CompileCounter()
    k = kiln.compile(f, backend=ours)
    t = torch.compile(f, backend=theirs)
    with kiln.config.patch(cache_size_limit=16), torch._dynamo.config.patch(cache_size_limit=16):
        for x, d in calls:
            torch.testing.assert_close(k(x, d), f(x, d))
            t(x, d)
    assert ours.frame_count == theirs.frame_count >= 6
    kiln.reset()
    torch._dynamo.reset()


def test_a_spec_the_extension_refuses_keeps_the_python_checks(boundary: Any) -> None:
    class Refusing:
        """The boundary, except that it cannot make this tensor's spec (a device c10 cannot name)."""

        tensor_ok = boundary.tensor_ok
        same_keys = boundary.same_keys
        empty_attrs = boundary.empty_attrs

        @staticmethod
        def tensor_spec(*args: Any) -> Any:
            raise ValueError("Invalid device string")

    x = torch.randn(3)
    check = compile_guards([tensor_guard("L['x']", x)], native=Refusing())
    assert "___tensor_ok" not in check.source and check({"x": x}, {}, None)
    assert check.explain_failure({"x": torch.randn(4)}, {}, None) == "x.size()[0] changed from 3 to 4"


def test_empty_hook_dicts_of_a_module_checked_in_one_call(boundary: Any) -> None:
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
    guards = [Guard("L['x']", "check_type", torch.nn.Linear)]
    guards += [Guard(f"L['x'].{name}", "check_len", 0) for name in hooks]
    guards += [Guard("L['x']._forward_hooks", "check_type", collections.OrderedDict),  # read again by itself
               Guard("L['x'].training", "check_value", True)]
    fast = compile_guards(guards, native=boundary)
    assert fast.source.count("___empty_attrs(") == 1 and "._forward_hooks" in fast.source
    plain = torch.nn.Linear(2, 2)
    hooked = torch.nn.Linear(2, 2)
    hooked.register_forward_pre_hook(lambda m, a: None)
    no_hooks = torch.nn.Linear(2, 2)
    del no_hooks._backward_hooks  # an attribute that cannot be read is a failed guard
    verdicts = _verdicts(guards, [plain, hooked, no_hooks, torch.nn.Linear(2, 2).eval(), torch.nn.ReLU()], boundary)
    assert verdicts[0] == (True, "all guards pass")
    assert verdicts[1] == (False, "len(x._forward_pre_hooks) changed from 0 to 1")
    assert not verdicts[2][0] and "x._backward_hooks could not be read" in verdicts[2][1]
    assert verdicts[3] == (False, "x.training changed from True to False")
    assert not verdicts[4][0]


def test_a_hook_registered_after_compile_recompiles(boundary: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.backends import CountingBackend

    monkeypatch.setattr(guards_module, "native_checks", lambda: boundary)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    counting = CountingBackend()
    compiled = kiln.compile(model, backend=counting)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        sources = [o.source for o in gc.get_objects() if type(o) is guards_module.CheckFn]
        assert any("___empty_attrs(" in source for source in sources)
        model[1].register_forward_hook(lambda m, args, out: out * 2)
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    assert counting.frame_count == 2
    kiln.reset()


def test_tensor_spec_refuses_malformed_specs(boundary: Any) -> None:
    def spec(sizes: tuple, strides: Any, links: tuple = ()) -> Any:
        return boundary.tensor_spec(torch.Tensor, torch.float32, "cpu", -1, torch.strided, False, sizes, strides,
                                    links, False, False, False, False)

    assert boundary.tensor_ok(torch.randn(2, 3), spec((2, 3), (3, 1)))
    for sizes, strides, links in [((2, 3), (1,), ()), ((2, 3), (3, 1), ((0, 2),)), ((2, 3), (3, 1), ((-1, 0),))]:
        with pytest.raises(ValueError):
            spec(sizes, strides, links)
    with pytest.raises(TypeError):
        boundary.tensor_spec(torch.Tensor, "float32", "cpu", -1, torch.strided, False, (2,), (1,), (), False,
                             False, False, False)
    with pytest.raises(ValueError):  # CPython's capsule check
        boundary.tensor_ok(torch.randn(2), "not a spec")
