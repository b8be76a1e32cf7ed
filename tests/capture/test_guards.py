"""Guard kinds and compiled check functions: each kind passes on the value it was made from and
fails, with a message in the user's words, when that value changes."""
from __future__ import annotations

import math

import pytest
import torch

import kiln
from kiln.capture.guards import compile as guards_module  # where compile_guards looks up native_checks
from kiln.capture.guards import GUARD_KINDS, Guard, TensorSpec, compile_guards, tensor_guard, user_name


@pytest.fixture(params=["python", pytest.param("native", marks=pytest.mark.cpp)], autouse=True)
def checks_variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the generated Python checks and on the boundary extension's tensor and
    keys checks (kiln.runtime.native, built once per cache)."""
    if request.param == "native":
        from kiln.runtime import native

        module = native.boundary()
        monkeypatch.setattr(guards_module, "native_checks", lambda: module)
    else:
        monkeypatch.setattr(kiln.config, "native_guards", False)
    return request.param


def check(guards, L, shape_guards=(), G=None, F=None):
    fn = compile_guards(guards, shape_guards)
    G = G or {}
    ok = fn(L, G, F)
    assert ok == (fn.first_failure(L, G, F) is None), "fast check and explanation disagree"
    return ok, fn.explain_failure(L, G, F)


def test_every_kind_is_a_verb():
    assert set(GUARD_KINDS) >= {"check_type", "check_id", "check_value", "check_tensor", "check_len",
                                "check_grad_mode", "check_shape", "check_none", "check_not_none", "check_keys"}
    assert all(name.startswith("check_") for name in GUARD_KINDS)
    with pytest.raises(ValueError, match="unknown guard kind"):
        Guard("L['x']", "type_match", int)


def test_check_type():
    g = [Guard("L['x']", "check_type", list)]
    assert check(g, {"x": [1]}) == (True, "all guards pass")
    ok, why = check(g, {"x": (1,)})
    assert not ok and why == "x changed type from list to tuple"


def test_check_id():
    a, b = object(), object()
    g = [Guard("G['helper']", "check_id", a)]
    assert check(g, {}, G={"helper": a})[0]
    ok, why = check(g, {}, G={"helper": b})
    assert not ok and why.startswith("helper is a different object")


@pytest.mark.parametrize("old,new", [(3, 4), (3, 3.0), (True, 1), (1, True), ("relu", "gelu"), (None, 0),
                                     (2.5, 2.25), ((1, 2), (1, 3)), (torch.float32, torch.float16)])
def test_check_value_fails_on_change(old, new):
    g = [Guard("L['c']", "check_value", old)]
    assert check(g, {"c": old})[0]
    ok, why = check(g, {"c": new})
    assert not ok
    assert why.startswith(f"c changed from {old!r}")


def test_check_value_nan_and_inf():
    assert check([Guard("L['c']", "check_value", math.nan)], {"c": math.nan})[0]
    assert not check([Guard("L['c']", "check_value", math.nan)], {"c": 1.0})[0]
    assert check([Guard("L['c']", "check_value", math.inf)], {"c": math.inf})[0]
    assert not check([Guard("L['c']", "check_value", math.inf)], {"c": -math.inf})[0]


def test_check_none_and_not_none():
    assert check([Guard("L['m']", "check_none")], {"m": None})[0]
    ok, why = check([Guard("L['m']", "check_none")], {"m": 3})
    assert not ok and why == "m was None and is now 3"
    assert check([Guard("L['m']", "check_not_none")], {"m": 3})[0]
    assert check([Guard("L['m']", "check_not_none")], {"m": None}) == (False, "m was not None and is now None")


def test_check_len_and_keys():
    assert check([Guard("L['xs']", "check_len", 2)], {"xs": [1, 2]})[0]
    assert check([Guard("L['xs']", "check_len", 2)], {"xs": [1, 2, 3]}) == (False, "len(xs) changed from 2 to 3")
    g = [Guard("L['d']", "check_keys", ("a", "b"))]
    assert check(g, {"d": {"a": 1, "b": 2}})[0]
    ok, why = check(g, {"d": {"b": 2, "a": 1}})
    assert not ok and "keys of d changed" in why


def test_check_grad_mode():
    g = [Guard("", "check_grad_mode", True)]
    assert check(g, {})[0]
    with torch.no_grad():
        ok, why = check(g, {})
    assert not ok and why.startswith("grad mode changed")


def test_check_tensor_each_property():
    x = torch.randn(8, 4)
    g = [tensor_guard("L['x']", x)]
    assert check(g, {"x": torch.randn(8, 4)})[0]
    cases = {
        "x.size()[0] changed from 8 to 16": torch.randn(16, 4),
        "x.dim() changed from 2 to 3": torch.randn(8, 4, 1),
        "x.dtype changed from torch.float32 to torch.float64": torch.randn(8, 4, dtype=torch.float64),
        "x.stride() changed from (4, 1) to (1, 8)": torch.randn(4, 8).t(),
        "x.requires_grad changed from False to True": torch.randn(8, 4, requires_grad=True),
        "x changed type from torch.Tensor to torch.nn.Parameter": torch.nn.Parameter(torch.randn(8, 4)),
        "x changed type from torch.Tensor to int": 3,
    }
    for expected, value in cases.items():
        assert check(g, {"x": value}) == (False, expected)
    with torch.inference_mode():
        inference = torch.randn(8, 4)
    assert check(g, {"x": inference}) == (False, "x is now an inference tensor")
    assert check(g, {"x": torch.randn(8, 4).to_sparse()})[0] is False


def test_check_tensor_device_with_meta():
    g = [tensor_guard("L['x']", torch.randn(2))]
    assert check(g, {"x": torch.empty(2, device="meta")}) == (False, "x.device changed from cpu to meta")


def test_check_tensor_complex_conj_bit():
    z = torch.randn(3, dtype=torch.complex64)
    g = [tensor_guard("L['z']", z)]
    assert check(g, {"z": torch.randn(3, dtype=torch.complex64)})[0]
    assert not check(g, {"z": torch.randn(3, dtype=torch.complex64).conj()})[0]


def test_dynamic_dims_free_sizes_and_strides():
    x = torch.randn(8, 4, 3)
    g = [tensor_guard("L['x']", x, dynamic_dims=[0, 1])]
    spec = g[0].expected
    assert spec.sizes == (None, None, 3)
    assert spec.strides == (None, 3, 1)  # stride 0 = size 1 * stride 1 depends on dynamic dim 1
    assert check(g, {"x": torch.randn(9, 5, 3)})[0]
    assert check(g, {"x": torch.randn(9, 5, 4)}) == (False, "x.size()[2] changed from 3 to 4")
    # same sizes, but not dense any more: the free stride's relation fails
    assert not check(g, {"x": torch.randn(9, 10, 3)[:, ::2]})[0]


def test_check_shape_guard_in_user_words():
    x, y = torch.randn(8, 4), torch.randn(4, 8)
    g = [tensor_guard("L['x']", x, [0]), tensor_guard("L['y']", y, [1])]
    shape = ["L['x'].size()[0] == L['y'].size()[1]", "L['x'].size()[0] >= 2"]
    assert check(g, {"x": torch.randn(5, 4), "y": torch.randn(4, 5)}, shape)[0]
    ok, why = check(g, {"x": torch.randn(5, 4), "y": torch.randn(4, 6)}, shape)
    assert not ok
    assert why == "x.size()[0] == y.size()[1] no longer holds; now x.size()[0] = 5, y.size()[1] = 6"


def test_missing_attribute_fails_the_guard():
    class Obj:
        pass

    o = Obj()
    o.flag = True
    g = [Guard("L['o']", "check_type", Obj), Guard("L['o'].flag", "check_value", True)]
    assert check(g, {"o": o})[0]
    del o.flag
    ok, why = check(g, {"o": o})
    assert not ok and why.startswith("o.flag could not be read (AttributeError")


def test_module_training_flag_in_user_words():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    g = [Guard("L['self']", "check_id", m), Guard("L['self']._modules['0'].training", "check_value", True)]
    assert check(g, {"self": m})[0]
    m.eval()
    assert check(g, {"self": m}) == (False, "self[0].training changed from True to False")


def test_source_is_hoisted_and_deduplicated():
    x = torch.randn(2)
    guards = [Guard("L['self']", "check_type", dict), Guard("L['self']['w']", "check_type", torch.Tensor),
              tensor_guard("L['x']", x), tensor_guard("L['x']", x)]
    fn = compile_guards(guards)
    assert len(fn.guards) == 3
    assert fn.source.count("L['self']") == 1  # read once, then through its local
    assert "___check_guards" in fn.source
    assert fn({"self": {"w": x}, "x": x}, {}, None)


def test_user_name():
    assert user_name("L['self']._modules['fc']._parameters['weight']") == "self.fc.weight"
    assert user_name("G['CONFIG'].depth") == "CONFIG.depth"
    assert user_name("L['x'].size()[0] >= 2") == "x.size()[0] >= 2"


def test_tensor_spec_str():
    assert str(TensorSpec.of(torch.randn(2, 3), [0])) == "Tensor[?, 3] torch.float32 cpu"


def test_check_aliasing():
    from kiln.capture.guards import aliasing_guard

    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    two = [tensor_guard("L['x']", a), tensor_guard("L['y']", b)]
    distinct = two + [aliasing_guard(["L['x']", "L['y']"], [a, b])]
    assert check(distinct, {"x": a, "y": b})[0]
    assert check(distinct, {"x": a, "y": a}) == (False, "x and y are now the same tensor")
    same = two + [aliasing_guard(["L['x']", "L['y']"], [a, a])]
    assert check(same, {"x": a, "y": a})[0]
    assert check(same, {"x": a, "y": b}) == (False, "x and y are no longer the same tensor")
    three = two + [tensor_guard("L['z']", c), aliasing_guard(["L['x']", "L['y']", "L['z']"], [a, b, c])]
    assert check(three, {"x": a, "y": b, "z": c})[0]
    assert check(three, {"x": a, "y": b, "z": a}) == (False, "x and z are now the same tensor")
    assert "___v0 is not ___v1" in compile_guards(distinct).source


def test_size_one_in_a_dynamic_dim_stays_guarded():
    g = [tensor_guard("L['x']", torch.randn(1, 3), dynamic_dims=[0])]
    assert g[0].expected.sizes == (1, 3)
    assert check(g, {"x": torch.randn(5, 3)}) == (False, "x.size()[0] changed from 1 to 5")


def test_check_global_state():
    from kiln.capture.guards import GlobalState

    g = [Guard("", "check_global_state", GlobalState.now())]
    assert check(g, {})[0]
    try:
        torch.set_default_dtype(torch.float64)
        assert check(g, {}) == (False, "the default dtype changed from torch.float32 to torch.float64")
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.autocast("cpu"):
        assert check(g, {}) == (False, "autocast was turned on")


class _Base:
    K = 3

    def method(self):
        return 1


class _Child(_Base):
    pass


def test_check_class_attr_follows_the_mro():
    from kiln.capture.guards import ClassAttribute

    value = Guard("", "check_class_attr", ClassAttribute(_Child.__mro__, "K", 3))
    method = Guard("", "check_class_attr", ClassAttribute(_Child.__mro__, "method", _Base.__dict__["method"]))
    assert check([value, method], {})[0]
    saved = _Base.method
    try:
        _Base.K = 4
        assert check([value], {}) == (False, "class attribute _Child.K changed from 3 to 4")
        _Child.K = 3  # found earlier in the MRO with the value the trace read: still valid
        assert check([value], {})[0]
        compiled = compile_guards([method])  # binds the code and defaults it was made with
        _Base.method.__defaults__ = (1,)
        assert not compiled.fn({}, {}, None)
        assert compiled.explain_failure({}, {}, None) == "the code or defaults of _Child.method changed"
        _Child.method = lambda self: 2
        ok, why = check([method], {})
        assert not ok and why.startswith("class attribute _Child.method changed")
    finally:
        _Base.K = 3
        for name in ("K", "method"):
            if name in _Child.__dict__:
                delattr(_Child, name)
        _Base.method = saved
        saved.__defaults__ = None


def test_check_id_on_a_function_checks_code_and_defaults():
    def helper(x, *, s=1):
        return x

    compiled = compile_guards([Guard("G['helper']", "check_id", helper)])
    G = {"helper": helper}
    assert compiled.fn({}, G, None)
    helper.__kwdefaults__["s"] = 2  # changed in place
    assert not compiled.fn({}, G, None)
    assert compiled.explain_failure({}, G, None) == "helper.__kwdefaults__ changed from {'s': 1} to {'s': 2}"


def test_new_mark_dynamic_on_a_static_dim_fails_the_tensor_guard():
    from kiln.symbolic.marks import mark_dynamic

    x = torch.randn(4, 3)
    g = [tensor_guard("L['x']", x)]
    assert check(g, {"x": x})[0]
    y = torch.randn(4, 3)
    mark_dynamic(y, 1)
    assert check(g, {"x": y}) == (False, "x has dims newly marked dynamic: [1]")
    dynamic = [tensor_guard("L['x']", x, dynamic_dims=[1])]
    assert check(dynamic, {"x": y})[0]  # the dim is symbolic in this entry already
    param = [tensor_guard("L['self']._parameters['w']", x)]
    assert check(param, {"self": type("M", (), {"_parameters": {"w": y}})()})[0]  # marks unchecked


def test_sources_read_once_are_rewritten_longest_first_and_only_as_whole_names() -> None:
    # `_rewrite` keeps its hoisted sources longest first without a sort per guard (hundreds of
    # sources per model, compiled again for each entry a warm start reads)
    class Obj:
        def __init__(self) -> None:
            self.b, self.bc = 2, 3

    guards = [Guard("L['a'].b", "check_value", 2), Guard("L['a'].bc", "check_value", 3),
              Guard("L['a'].b + L['a'].bc == 5", "check_shape")]
    check = compile_guards(guards)
    assert "___v0 = L['a'].b\n" in check.source and "___v1 = L['a'].bc\n" in check.source
    assert "if not (___v0 + ___v1 == 5)" in check.source
    assert check.fn({"a": Obj()}, {}, None)


def test_other_modules_globals_read_sys_modules_once_per_check():
    """Globals of other modules are read through sys.modules: the check reads it once, and each
    guard still sees the module's current value."""
    import types

    one, two = types.ModuleType("kiln_test_mod_one"), types.ModuleType("kiln_test_mod_two")
    one.flag, two.size = True, 3
    import sys
    sys.modules[one.__name__], sys.modules[two.__name__] = one, two
    try:
        guards = [Guard(f"__import__('sys').modules['{one.__name__}'].__dict__['flag']", "check_value", True),
                  Guard(f"__import__('sys').modules['{two.__name__}'].__dict__['size']", "check_value", 3)]
        fn = compile_guards(guards)
        code = [line.split("  # ")[0] for line in fn.source.splitlines()]  # the comments name each source
        assert sum(line.count("__import__('sys')") for line in code) == 1, fn.source
        assert fn.fn({}, {}, None)
        two.size = 4
        assert not fn.fn({}, {}, None)
    finally:
        del sys.modules[one.__name__], sys.modules[two.__name__]


def test_read_source_walks_chains_as_eval_reads_them() -> None:
    from kiln.capture.guards import read_source

    class Obj:
        pass

    o = Obj()
    o.items = {"a": [10, 20, {"k": "v"}], "x.y": 3}
    o.t = (1, 2)
    env = {"L": {"self": o, "it's": 5}, "G": {"g": o}, "F": None, "__builtins__": __builtins__}
    sources = ["L['self']", "L['self'].items['a'][2]['k']", "L['self'].items['a'][-1]", "G['g'].t[0]",
               "L['self'].items['x.y']", "len(L['self'].t)", "L[\"it's\"]", "F", "G['g'].__class__.__name__",
               "type(L['self']).__name__", "L['self'].items['a'][1] * 2"]
    for src in sources:
        assert read_source(src, env) == eval(src, env), src
    with pytest.raises(KeyError):
        read_source("L['missing']", env)
    with pytest.raises(AttributeError):
        read_source("L['self'].nope", env)


@pytest.mark.parametrize("names", [("weight",), ("a", "b", "c"), tuple(f"n{i}" for i in range(12)), ("has {v} brace",)])
def test_absent_names_and_empty_hook_dicts(names: tuple, checks_variant: str) -> None:
    # a few identifier names are tested inline, more (or odd ones) through one call; a module's
    # hook dicts in one statement (Python) or one native call: the same verdicts either way
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    guards = [Guard("L['m']", "check_type", torch.nn.Linear),
              Guard("L['m'].__dict__", "check_absent", frozenset(names))]
    guards += [Guard(f"L['m'].{name}", "check_len", 0) for name in hooks]
    fn = compile_guards(guards)
    source = fn.source
    if checks_variant == "python":
        assert source.count("len(___v0._forward_hooks) or len(") == 1
    inline = len(names) <= 8 and all(n.isidentifier() for n in names)
    assert ("___absent(" in source) != inline
    plain = torch.nn.Linear(2, 2)
    assert fn({"m": plain}, {}, None)
    for name in names:
        shadowed = torch.nn.Linear(2, 2)
        shadowed.__dict__[name] = 1
        assert not fn({"m": shadowed}, {}, None)
        assert "shadow" in fn.explain_failure({"m": shadowed}, {}, None)
    for hook in hooks:
        hooked = torch.nn.Linear(2, 2)
        getattr(hooked, hook)[0] = lambda *a: None
        assert not fn({"m": hooked}, {}, None)
        assert fn.explain_failure({"m": hooked}, {}, None) == f"len(m.{hook}) changed from 0 to 1"
    gone = torch.nn.Linear(2, 2)
    del gone._backward_pre_hooks
    assert not fn({"m": gone}, {}, None)
