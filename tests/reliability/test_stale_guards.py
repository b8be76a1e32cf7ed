"""Stale guards: whatever a trace read from a class or a function object must be re-checked.

Each test compiles, changes something the trace read
(a class attribute, inherited or not; a method; a function's `__code__`, `__defaults__` or
`__kwdefaults__`; a mark_dynamic on a dim the entry specialized), calls again and compares with
eager. The disk-cache case runs two processes sharing one KILN_CACHE_DIR with the source edited
between them (tests/conftest.py turns the persistent cache off in this process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def compiled(fn):
    return kiln.compile(fn, backend="eager")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------
# Class attributes read through an instance built inside the frame


class Base:
    K = 3

    def scale(self):
        return 2


class Child(Base):
    def apply(self, x):
        return x * self.K + self.scale()


class Direct:
    K = 2

    def apply(self, x):
        return x * self.K


def make_child(x):
    return Child().apply(x)


def make_direct(x):
    return Direct().apply(x)


@pytest.fixture
def restore_classes():
    saved = {cls: dict(cls.__dict__) for cls in (Base, Child, Direct)}
    yield
    for cls, attrs in saved.items():
        for name in [n for n in cls.__dict__ if n not in attrs]:
            delattr(cls, name)
        for name, value in attrs.items():
            if name not in ("__dict__", "__weakref__", "__doc__") and cls.__dict__.get(name) is not value:
                setattr(cls, name, value)


def test_class_attribute_of_an_instance_made_in_the_frame(restore_classes):
    f = compiled(make_direct)
    x = torch.ones(3)
    assert same(f(x), make_direct(x))
    Direct.K = 11
    assert same(f(x), make_direct(x)) and f(x)[0].item() == 11
    assert kiln.stats()["recompiles"] == 1


def test_inherited_class_attribute_changed_on_the_base(restore_classes):
    f = compiled(make_child)
    x = torch.ones(3)
    assert f(x)[0].item() == 5
    Base.K = 11
    assert same(f(x), make_child(x)) and f(x)[0].item() == 13


def test_inherited_class_attribute_shadowed_on_the_subclass(restore_classes):
    f = compiled(make_child)
    x = torch.ones(3)
    f(x)
    Child.K = 7  # now found on Child, before Base in the MRO
    assert same(f(x), make_child(x)) and f(x)[0].item() == 9
    del Child.K  # and back to the base's
    assert same(f(x), make_child(x)) and f(x)[0].item() == 5


def test_inherited_method_replaced(restore_classes):
    f = compiled(make_child)
    x = torch.ones(3)
    f(x)
    Base.scale = lambda self: 100
    assert same(f(x), make_child(x)) and f(x)[0].item() == 103
    Child.scale = lambda self: 1000  # a subclass override appears
    assert same(f(x), make_child(x)) and f(x)[0].item() == 1003


class Kinds:
    C = 4

    @staticmethod
    def plus_one(x):
        return x + 1

    @classmethod
    def times_c(cls, x):
        return x * cls.C

    @property
    def five(self):
        return 5


class KindsChild(Kinds):
    def total(self, x):
        return super().times_c(x)


def use_kinds(x):
    k = Kinds()
    return k.plus_one(x) + k.times_c(x) + k.five + KindsChild().total(x)


def test_staticmethod_classmethod_property_and_super():
    saved = dict(Kinds.__dict__)
    try:
        f = compiled(use_kinds)
        x = torch.ones(2)
        assert same(f(x), use_kinds(x))
        Kinds.plus_one = staticmethod(lambda x: x - 1)
        assert same(f(x), use_kinds(x))
        Kinds.C = 10  # read by the classmethod through cls, and through super()
        assert same(f(x), use_kinds(x))
        Kinds.five = property(lambda self: 50)
        assert same(f(x), use_kinds(x))
        Kinds.times_c = classmethod(lambda cls, x: x * 0)
        assert same(f(x), use_kinds(x))
    finally:
        for name in ("plus_one", "times_c", "five", "C"):
            setattr(Kinds, name, saved[name])


class Holder:
    def go(self, x):
        return x * 2


def call_method_of_argument(obj, x):
    return obj.go(x)


def test_method_of_an_argument_replaced_on_its_class():
    saved = Holder.go
    try:
        f = compiled(call_method_of_argument)
        obj, x = Holder(), torch.ones(2)
        f(obj, x)
        Holder.go = lambda self, x: x * 3
        assert same(f(obj, x), call_method_of_argument(obj, x))
    finally:
        Holder.go = saved


def test_module_forward_replaced_on_its_class():
    class Net(torch.nn.Module):
        def forward(self, x):
            return x + 1

    net = Net()
    f = kiln.compile(net, backend="eager")
    x = torch.ones(2)
    assert same(f(x), net(x))
    Net.forward = lambda self, x: x + 2
    assert same(f(x), net(x)) and f(x)[0].item() == 3


# ---------------------------------------------------------------------------------------------------
# Function metadata: __code__, __defaults__, __kwdefaults__ (what autoreload changes)


def test_code_of_the_compiled_function_replaced():
    def f(x):
        return x * 2

    def g(x):
        return x * 10

    c = compiled(f)
    x = torch.ones(2)
    c(x)
    f.__code__ = g.__code__
    assert same(c(x), f(x)) and c(x)[0].item() == 10
    assert kiln.stats()["compiles"] == 2


def test_defaults_and_kwdefaults_of_the_compiled_function():
    def f(x, s=2.0, *, t=1.0):
        return x * s + t

    c = compiled(f)
    x = torch.ones(2)
    assert same(c(x), f(x))
    f.__defaults__ = (3.0,)
    assert same(c(x), f(x))
    f.__kwdefaults__ = {"t": 5.0}
    assert same(c(x), f(x))
    f.__kwdefaults__["t"] = 7.0  # in place
    assert same(c(x), f(x)) and c(x)[0].item() == 10.0


class WithMethod:
    def run(self, x, s=2.0):
        return x * s


def test_compiled_bound_method_code_and_defaults():
    saved = (WithMethod.run.__code__, WithMethod.run.__defaults__)
    try:
        obj = WithMethod()
        c = kiln.compile(obj.run, backend="eager")
        x = torch.ones(2)
        c(x)
        WithMethod.run.__defaults__ = (4.0,)
        assert same(c(x), obj.run(x)) and c(x)[0].item() == 4.0
        WithMethod.run.__code__ = (lambda self, x, s=2.0: x - s).__code__
        assert same(c(x), obj.run(x)) and c(x)[0].item() == -3.0
    finally:
        WithMethod.run.__code__, WithMethod.run.__defaults__ = saved


def callee(x, s=2.0, *, t=0.0):
    return x + s + t


def caller(x):
    return callee(x) * 2


def test_inlined_callee_code_defaults_and_kwdefaults():
    saved = (callee.__code__, callee.__defaults__, callee.__kwdefaults__)
    try:
        c = compiled(caller)
        x = torch.ones(2)
        assert same(c(x), caller(x))
        callee.__defaults__ = (5.0,)
        assert same(c(x), caller(x))
        callee.__kwdefaults__ = {"t": 1.0}
        assert same(c(x), caller(x))
        callee.__code__ = (lambda x, s=2.0, *, t=0.0: x - s - t).__code__
        assert same(c(x), caller(x)) and c(x)[0].item() == -10.0
    finally:
        callee.__code__, callee.__defaults__, callee.__kwdefaults__ = saved


def test_failing_function_guard_in_user_words():
    from kiln.capture.guards import Guard, compile_guards

    def helper(x, s=1):
        return x

    check = compile_guards([Guard("G['helper']", "check_id", helper)])
    G = {"helper": helper}
    assert check.fn({}, G, None)
    helper.__defaults__ = (2,)
    assert not check.fn({}, G, None)
    assert "helper.__defaults__ changed from (1,) to (2,)" in check.explain_failure({}, G, None)
    check = compile_guards([Guard("G['helper']", "check_id", helper)])
    helper.__code__ = (lambda x, s=1: x + 1).__code__
    assert not check.fn({}, G, None)
    assert "the code of helper changed" in check.explain_failure({}, G, None)


# ---------------------------------------------------------------------------------------------------
# mark_dynamic on a tensor that a static entry answers


def _count_graphs(compile_fn, calls):
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    f = compile_fn(lambda x: x * 2, backend)
    for make in calls:
        x = make()
        assert same(f(x), x * 2)
    return count[0]


def _calls(mark_dynamic):
    def marked(shape, dim):
        def make():
            t = torch.randn(*shape)
            mark_dynamic(t, dim)
            return t
        return make

    return [lambda: torch.randn(8, 4), marked((8, 4), 0), lambda: torch.randn(8, 4), marked((9, 4), 0),
            marked((8, 4), 1)]


def test_mark_dynamic_on_a_dim_a_static_entry_specialized_recompiles_like_torch_compile():
    import torch._dynamo

    kiln_count = _count_graphs(lambda fn, be: kiln.compile(fn, backend=be), _calls(kiln.mark_dynamic))
    torch._dynamo.reset()
    torch_count = _count_graphs(lambda fn, be: torch.compile(fn, backend=be), _calls(torch._dynamo.mark_dynamic))
    torch._dynamo.reset()
    assert kiln_count == torch_count == 3


def test_mark_dynamic_recompile_makes_the_dim_symbolic():
    f = kiln.compile(lambda x: x.sum(0), backend="eager")
    f(torch.randn(8, 4))
    y = torch.randn(8, 4)
    kiln.mark_dynamic(y, 0)
    f(y)
    assert kiln.stats()["recompiles"] == 1
    guards = f._kiln_frame.cache.entries[0].check.guards
    spec = next(g.expected for g in guards if g.kind == "check_tensor")
    assert spec.sizes[0] is None  # the newest entry has dim 0 symbolic
    f(torch.randn(5, 4))  # and answers other sizes without recompiling
    assert kiln.stats()["recompiles"] == 1


# ---------------------------------------------------------------------------------------------------
# The disk cache: a stored entry must not answer after the class attribute changed in the source


_DISK_SCRIPT = textwrap.dedent("""
    import json, torch, kiln

    class Base:
        K = BASE_K

    class A(Base):
        def apply(self, x):
            return x * self.K

    def f(x):
        return A().apply(x)

    x = torch.ones(4)
    out = kiln.compile(f, options={"opt_level": "-O1"})(x)
    print(json.dumps({"out": out.tolist(), "eager": f(x).tolist(),
                      "disk_hits": kiln.stats()["disk_hits"], "frames": kiln.stats()["frames"]}))
""")


def _run(script: Path, cache: Path) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO), "KILN_PERSISTENT_CACHE": "1"}
    env.pop("KILN_LOGS", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.cpp
def test_disk_entry_is_not_used_after_the_class_attribute_changed(tmp_path: Path):
    cache, script = tmp_path / "cache", tmp_path / "prog.py"
    script.write_text(_DISK_SCRIPT.replace("BASE_K", "3"))
    first = _run(script, cache)
    assert first["out"] == first["eager"] == [3.0] * 4
    again = _run(script, cache)
    if again["disk_hits"] != 1:  # the entry itself must have been stored and usable
        pytest.fail(f"the unchanged program was not served from disk: {again}")
    script.write_text(_DISK_SCRIPT.replace("BASE_K", "11"))  # the inherited attribute, in the source
    changed = _run(script, cache)
    assert changed["out"] == changed["eager"] == [11.0] * 4
    assert changed["disk_hits"] == 0 and changed["frames"] == 1


# A decorated method whose wrapper reads a registry object held in the decorator's closure (the
# pattern of transformers' experts interface): the registry's contents are read through the cell.

class _Registry:
    def __init__(self) -> None:
        self.mapping = {"fast": lambda self, x: x * 3}

    def get(self, name: str, default):
        return self.mapping.get(name, default)


_REGISTRY = _Registry()


def _use_registry(cls, registry=_REGISTRY):
    original = cls.forward

    def forward(self, x):
        return registry.get(self.impl, original)(self, x)

    cls.forward = forward
    return cls


@_use_registry
class _Experts(torch.nn.Module):
    impl = "fast"

    def forward(self, x):
        return x * 2


class _WithExperts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = _Experts()

    def forward(self, x):
        return self.experts(x) + 1


def test_registry_held_in_a_decorators_closure_changed_after_compile():
    model = _WithExperts()
    fn = compiled(model)
    x = torch.randn(8)
    assert same(fn(x), model(x))
    saved = dict(_REGISTRY.mapping)
    try:
        _REGISTRY.mapping["fast"] = lambda self, x: x * 10
        assert same(fn(x), model(x))  # the entry read the old mapping: it must not be used
    finally:
        _REGISTRY.mapping.clear()
        _REGISTRY.mapping.update(saved)
    assert same(fn(x), model(x))
