"""The generated Python guard check (the Python tier: no boundary extension) still fails when it must.

Two halves: the guards left out of the generated function because others fix their outcome
(kiln.capture.guards.static), checked on hand-made guard sets, each with the change that must make
the set fail; and compiled functions run on the Python checks only (native_guards and fast_entry
off), each kind of guarded value changed between calls: the next call matches eager's result and
recompiles where the change is one the graph relied on.
"""
from __future__ import annotations

import types

import pytest
import torch

import kiln
from kiln.backends import CountingBackend
from kiln.capture.guards import Guard, compile_guards, static
from kiln.capture.guards.global_kinds import aliasing_guard  # noqa: F401  (kind registered)


@pytest.fixture(autouse=True)
def python_tier():
    kiln.reset()
    with kiln.config.patch(native_guards=False, fast_entry=False):
        yield
    kiln.reset()


# ---------------------------------------------------------------------------------------------------
# Guards left out: only where fixed by a kept guard


def _f(a, b=1):
    return a + b


def _g(z, y=1):
    return z - y


def _left_out(check) -> set[int]:
    recorded = static.recorded(check.source)
    assert recorded is not None
    return recorded[0]


def test_code_object_reads_left_out_and_identity_still_guards_them():
    f = types.FunctionType(_f.__code__, globals(), "f", (1,))
    guards = [Guard("L['f']", "check_id", f),
              Guard("L['f'].__code__.co_varnames[0]", "check_value", "a"),
              Guard("L['f'].__code__.co_varnames", "check_len", 2),
              Guard("L['f'].__code__", "check_type", types.CodeType),
              Guard("L['f'].__defaults__[0]", "check_value", 1)]
    check = compile_guards(guards, native=None)
    assert _left_out(check) == {1, 2, 3, 4}
    assert "co_varnames" not in check.source.split("\n", 1)[1]
    assert check.fn({"f": f}, {}, None)
    assert not check.fn({"f": _g}, {}, None)  # another function
    f.__code__ = _g.__code__  # its varnames now ('z', 'y'): the identity of __code__ fails
    assert not check.fn({"f": f}, {}, None)
    assert "code of" in check.explain_failure({"f": f}, {}, None)
    f.__code__ = _f.__code__
    f.__defaults__ = (2,)  # the left-out default: the identity of __defaults__ fails
    assert not check.fn({"f": f}, {}, None)
    f.__defaults__ = tuple([1])  # an equal new tuple: a new object, a miss (and a recompile) as before
    assert not check.fn({"f": f}, {}, None)


def test_reads_that_can_change_are_kept():
    def make(k):
        def inner(x):
            return x + k
        return inner

    fn = make(3)
    box = ([1, 2], "s")
    guards = [Guard("L['f']", "check_id", fn),
              Guard("L['f'].__name__", "check_value", "inner"),  # a function's name can be assigned
              Guard("L['f'].__closure__[0].cell_contents", "check_value", 3),  # a cell can be written
              Guard("L['t']", "check_id", box),
              Guard("L['t'][0]", "check_len", 2),  # a list inside a tuple can grow
              Guard("L['t'][1]", "check_value", "s")]  # a str inside a tuple cannot change
    check = compile_guards(guards, native=None)
    assert _left_out(check) == {5}
    L = {"f": fn, "t": box}
    assert check.fn(L, {}, None)
    fn.__name__ = "renamed"
    assert not check.fn(L, {}, None)
    fn.__name__ = "inner"
    fn.__closure__[0].cell_contents = 4
    assert not check.fn(L, {}, None)
    fn.__closure__[0].cell_contents = 3
    box[0].append(3)
    assert not check.fn(L, {}, None)
    box[0].pop()
    assert check.fn(L, {}, None)


def test_a_fixed_guard_that_fails_is_kept_and_fails():
    guards = [Guard("L['f']", "check_id", _f), Guard("L['f'].__code__.co_varnames[0]", "check_value", "zzz")]
    check = compile_guards(guards, native=None)
    assert _left_out(check) == set()
    assert not check.fn({"f": _f}, {}, None)


def test_closure_cells_of_one_proven_function_alias_without_a_check():
    def make():
        k = 1

        def inner(x):
            return x + k
        return inner

    fn, other = make(), make()
    groups = (("L['f'].__closure__[0]", "L['g'].__closure__[0]"),)
    guards = [Guard("L['f']", "check_id", fn), Guard("L['g']", "check_id", fn), Guard("", "check_aliasing", groups)]
    check = compile_guards(guards, native=None)
    assert _left_out(check) == {2}
    assert check.fn({"f": fn, "g": fn}, {}, None)
    assert not check.fn({"f": fn, "g": other}, {}, None)  # the cells differ: the identity guard says so
    # where a source is not proven, the aliasing check stays
    check = compile_guards(guards[:1] + guards[2:], native=None)
    assert _left_out(check) == set()
    assert not check.fn({"f": fn, "g": other}, {}, None)
    assert check.fn({"f": fn, "g": fn}, {}, None)


def test_a_function_at_two_sources_has_its_contents_checked_once_and_still_checked():
    f = types.FunctionType(_f.__code__, globals(), "f", (1,))
    guards = [Guard("L['a']", "check_id", f), Guard("L['b']", "check_id", f)]
    check = compile_guards(guards, native=None)
    assert static.recorded(check.source)[1] == {1}
    assert check.source.count("__code__") == 1
    assert check.fn({"a": f, "b": f}, {}, None)
    assert not check.fn({"a": f, "b": _g}, {}, None)
    assert not check.fn({"a": _g, "b": f}, {}, None)
    f.__code__ = _g.__code__
    assert not check.fn({"a": f, "b": f}, {}, None)
    f.__code__ = _f.__code__
    f.__kwdefaults__ = {"k": 1}
    assert not check.fn({"a": f, "b": f}, {}, None)


def test_source_from_another_process_is_regenerated_where_its_left_out_guards_do_not_hold():
    def guards(fn):
        return [Guard("L['f']", "check_id", fn), Guard("L['f'].__code__.co_varnames[0]", "check_value", "a")]

    made = compile_guards(guards(_f), native=None)
    assert _left_out(made) == {1}
    # the same guard texts over another function (the persisted source's process found _f there)
    reused = compile_guards(guards(_g), compiled=(made.source, made.code), native=None)
    assert not reused.fn({"f": _g}, {}, None)  # 'z' != 'a': the guard is checked, not left out
    assert _left_out(reused) == set()
    same = compile_guards(guards(_f), compiled=(made.source, made.code), native=None)
    assert same.code is made.code and same.fn({"f": _f}, {}, None)


# ---------------------------------------------------------------------------------------------------
# Each kind of guarded value changed between calls, on the Python checks


def _calls(fn, before, change, after=None, *, recompiles=True):
    """Call the compiled `fn` on `before()`'s arguments, `change()`, call on `after()`'s (or
    `before()`'s again): each result equal to eager's; the second call recompiled when `recompiles`."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    args = before()
    torch.testing.assert_close(compiled(*args), fn(*args))
    torch.testing.assert_close(compiled(*args), fn(*args))  # a hit
    graphs = backend.frame_count
    change()
    args = (after or before)()
    torch.testing.assert_close(compiled(*args), fn(*args))
    if recompiles:
        assert backend.frame_count > graphs, "the change did not recompile"
    torch.testing.assert_close(compiled(*args), fn(*args))
    return compiled


X = torch.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("after", [
    lambda: (X.double(),), lambda: (torch.ones(3, 3),), lambda: (X.t().contiguous().t(),),
    lambda: (X.clone().requires_grad_(),), lambda: (X[:, 1:],),
], ids=["dtype", "shape", "stride", "requires_grad", "view_offset"])
def test_tensor_metadata_changes(after):
    _calls(lambda x: x * 2 + 1, lambda: (X,), lambda: None, after)


def test_tensor_inference_and_negative_bit_change():
    with torch.inference_mode():
        inference = X.clone()
    _calls(lambda x: x.sum(0), lambda: (X,), lambda: None, lambda: (inference,))
    z = torch.complex(X, X)
    _calls(lambda x: x * 2, lambda: (z.imag,), lambda: None, lambda: (z.conj().imag,))
    _calls(lambda x: x * 2, lambda: (z,), lambda: None, lambda: (z.conj(),))  # the conjugate bit of a complex tensor


def test_a_real_tensors_check_leaves_out_only_the_conjugate_bit():
    from kiln.capture.guards import tensor_guard

    check = compile_guards([tensor_guard("L['x']", X)], native=None)
    assert "is_conj" not in check.source and "is_neg" in check.source
    z = torch.complex(X, X)
    check = compile_guards([tensor_guard("L['x']", z)], native=None)
    assert "is_conj" in check.source
    assert check.fn({"x": z}, {}, None) and not check.fn({"x": z.conj()}, {}, None)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale, self.flag, self.name = 2, True, "a"

    def forward(self, x):
        y = self.lin(x) * self.scale
        if self.flag and self.name == "a":
            y = y + 1
        return y


@pytest.mark.parametrize("change", [
    lambda m: setattr(m, "scale", 3), lambda m: setattr(m, "scale", 2.0), lambda m: setattr(m, "flag", False),
    lambda m: setattr(m, "name", "b"), lambda m: setattr(m, "lin", torch.nn.Sequential(torch.nn.Linear(3, 3))),
    lambda m: setattr(m.lin, "weight", torch.nn.Parameter(torch.ones(3, 3))),
    lambda m: setattr(m.lin, "bias", None),
    lambda m: m.lin.weight.requires_grad_(False),
    lambda m: m.lin.register_forward_hook(lambda mod, i, o: o * 10),
    lambda m: setattr(m.lin, "forward", lambda x: x - 5),
], ids=["int", "int_to_float", "bool", "str", "submodule_type", "parameter", "bias_none", "param_requires_grad", "hook",
        "instance_forward"])
def test_module_state_changes(change):
    torch.manual_seed(0)
    m = _Block()
    compiled = _calls(m, lambda: (X,), lambda: change(m), recompiles=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), m(X))


OFFSET = 1.0


def _reads_global(x):
    return x + OFFSET


def test_global_and_closure_and_function_changes():
    global OFFSET
    try:
        _calls(_reads_global, lambda: (X,), lambda: globals().__setitem__("OFFSET", 5.0))
    finally:
        OFFSET = 1.0

    def make(k):
        def inner(x):
            return x * k
        return inner

    fn = make(2.0)
    _calls(fn, lambda: (X,), lambda: setattr(fn.__closure__[0], "cell_contents", 3.0))

    def helper(x, k=2.0):
        return x * k

    def uses_helper(x):
        return helper(x) + 1

    _calls(uses_helper, lambda: (X,), lambda: setattr(helper, "__defaults__", (4.0,)))
    _calls(uses_helper, lambda: (X,), lambda: setattr(helper, "__code__", (lambda x, k=2.0: x - k).__code__))


def test_a_read_of_a_helpers_code_object_follows_its_code():
    def helper(a, b):
        return a

    def f(x):
        return x * helper.__code__.co_argcount + len(helper.__code__.co_varnames[0])

    _calls(f, lambda: (X,), lambda: setattr(helper, "__code__", (lambda aaa, b, c: aaa).__code__))


def test_containers_grad_mode_and_aliasing_change():
    d = {"a": 1.0}
    _calls(lambda x, d: x + sum(d.values()), lambda: (X, d), lambda: d.__setitem__("b", 2.0))
    items = [1.0, 2.0]
    _calls(lambda x, l: x * len(l), lambda: (X, items), lambda: items.append(3.0))
    state = {"on": True}

    def under_mode():
        return (X.clone().requires_grad_(),)

    def f(w):
        return (w * 2).sum()

    backend = CountingBackend()
    compiled = kiln.compile(f, backend=backend)
    w = under_mode()[0]
    assert compiled(w).requires_grad
    with torch.no_grad():
        out = compiled(w)
    assert not out.requires_grad and state["on"]
    assert backend.frame_count == 2

    def add_into(x, y):
        return x.add_(1) + y

    backend = CountingBackend()
    compiled = kiln.compile(add_into, backend=backend)
    for _ in range(2):
        torch.testing.assert_close(compiled(X.clone(), X.clone()), add_into(X.clone(), X.clone()))
    graphs = backend.frame_count
    t, u = X.clone(), X.clone()
    torch.testing.assert_close(compiled(t, t), add_into(u, u))  # one tensor twice: x + 1 + (x + 1)
    torch.testing.assert_close(t, u)
    assert backend.frame_count > graphs


def test_values_by_position_list_the_dict_once_and_still_fail_on_each_change():
    # A registry keyed by classes (torch.distributions.kl's) is guarded value by value through
    # list(d.values())[i]: the check lists the dict once, and a change at any position still fails.
    registry = {type(f"K{i}", (), {}): types.FunctionType(_f.__code__, globals(), f"f{i}") for i in range(12)}
    source = "G['registry']"
    guards = [Guard(source, "check_type", dict), Guard(source, "check_len", len(registry))]
    guards += [Guard(f"list({source}.values())[{i}]", "check_id", fn) for i, fn in enumerate(registry.values())]
    for check in (compile_guards(guards, native=None), compile_guards(guards[::-1], native=None)):
        body = check.source.split("def ___check_guards", 1)[1]
        assert body.count("= list(") == 1 and "= list(" in body.split("[0]")[0], body
        assert check.fn({}, {"registry": registry}, None)
        for key in registry:
            changed = dict(registry)
            changed[key] = _g
            assert not check.fn({}, {"registry": changed}, None)
        assert not check.fn({}, {"registry": list(registry.values())}, None)
