"""Recompiles happen exactly when the real torch.compile recompiles: the same call sequences go
through kiln.compile and torch.compile, each with a counting eager backend, and the graph counts
must agree (outputs must equal eager's on every call)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.backends import CountingBackend
from kiln.log import KilnWarning

SCALE = 2.0


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


def compare(fn, calls, *, dynamic=None, before_call=None):
    """Run every call through both compilers; return (kiln graphs, torch.compile graphs)."""
    ours, theirs = CountingBackend(), CompileCounter()
    k = kiln.compile(fn, backend=ours, dynamic=dynamic)
    t = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for i, make_args in enumerate(calls):
        if before_call is not None:
            before_call(i)
        args = make_args()
        expected = fn(*args)
        torch.testing.assert_close(k(*args), expected)
        t(*args)
    return len(ours.graphs), theirs.frame_count


def rand(*shape, **kw):
    return lambda: (torch.randn(*shape, **kw),)


def add_one(x):
    return x + 1


def scaled(x, n):
    return x * n


def act(x, name):
    return torch.relu(x) if name == "relu" else torch.tanh(x)


def optional_bias(x, b):
    return x if b is None else x + b


def total(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def use_global(x):
    return x * SCALE


def keyed(d):
    return d["a"] * 2 + d.get("b", 0)


def pair_or_triple(t):
    return sum(t[1:], t[0])


def flagged(x, flag):
    return x + 1 if flag else x - 1


CASES = {
    "static sizes": (add_one, [rand(8, 3), rand(8, 3), rand(16, 3), rand(16, 3), rand(32, 3)], False),
    "automatic dynamic": (add_one, [rand(8, 3), rand(9, 3), rand(10, 3), rand(11, 3)], None),
    "dynamic=True": (add_one, [rand(8, 3), rand(9, 3), rand(10, 5)], True),
    "dtype": (add_one, [rand(4), rand(4, dtype=torch.float64), rand(4), rand(4, dtype=torch.float64)], None),
    "requires_grad": (add_one, [rand(4), rand(4, requires_grad=True), rand(4)], None),
    "strides": (add_one, [rand(4, 6), lambda: (torch.randn(6, 4).t(),), rand(4, 6)], False),
    "int argument": (scaled, [lambda: (torch.ones(3), 2), lambda: (torch.ones(3), 2), lambda: (torch.ones(3), 3),
                              lambda: (torch.ones(3), 4)], None),
    "float argument": (scaled, [lambda: (torch.ones(3), 0.5), lambda: (torch.ones(3), 0.25),
                                lambda: (torch.ones(3), 0.75), lambda: (torch.ones(3), 0.125)], None),
    "string argument": (act, [lambda: (torch.randn(3), "relu"), lambda: (torch.randn(3), "tanh"),
                              lambda: (torch.randn(3), "relu")], None),
    "None or tensor": (optional_bias, [lambda: (torch.ones(3), None), lambda: (torch.ones(3), torch.ones(3)),
                                       lambda: (torch.ones(3), None)], None),
    "size becomes 1": (add_one, [rand(8, 3), rand(1, 3), rand(9, 3), rand(10, 3)], None),
    "bool argument": (flagged, [lambda: (torch.ones(2), True), lambda: (torch.ones(2), False),
                                lambda: (torch.ones(2), True)], None),
    "dict keys": (keyed, [lambda: ({"a": torch.ones(2)},), lambda: ({"a": torch.ones(2), "b": torch.ones(2)},),
                          lambda: ({"a": torch.ones(2)},)], None),
    "tuple length": (pair_or_triple, [lambda: ((torch.ones(2), torch.ones(2)),),
                                      lambda: ((torch.ones(2),) * 3,), lambda: ((torch.ones(2),) * 2,)], None),
    "int argument, dynamic=False": (scaled, [lambda: (torch.ones(3), 2), lambda: (torch.ones(3), 3),
                                             lambda: (torch.ones(3), 4)], False),
    "list length": (total, [lambda: ([torch.ones(2)] * 2,), lambda: ([torch.ones(2)] * 3,),
                            lambda: ([torch.ones(2)] * 2,)], None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_recompile_counts_match_torch_compile(name):
    fn, calls, dynamic = CASES[name]
    ours, theirs = compare(fn, calls, dynamic=dynamic)
    assert ours == theirs, f"{name}: kiln compiled {ours} graphs, torch.compile {theirs}"


def test_global_constant_change_recompiles():
    global SCALE

    def set_scale(i):
        global SCALE
        SCALE = [2.0, 2.0, 3.0][i]

    try:
        ours, theirs = compare(use_global, [rand(3)] * 3, before_call=set_scale)
    finally:
        SCALE = 2.0
    assert ours == theirs == 2


def test_grad_mode_recompiles():
    def set_mode(i):
        torch.set_grad_enabled(i != 1)

    try:
        ours, theirs = compare(add_one, [rand(3)] * 3, before_call=set_mode)
    finally:
        torch.set_grad_enabled(True)
    assert ours == theirs == 2


def test_module_training_flag_recompiles():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.0))
    ours, theirs = CountingBackend(), CompileCounter()
    k, t = kiln.compile(net, backend=ours), torch.compile(net, backend=theirs)
    x = torch.randn(2, 3)
    for mode in ["train", "eval", "eval", "train"]:
        getattr(net, mode)()
        torch.testing.assert_close(k(x), net(x))
        t(x)
    assert len(ours.graphs) == theirs.frame_count == 2


def test_closure_cell_change_recompiles():
    k = 2

    def times_k(x):
        return x * k

    def set_k(i):
        nonlocal k
        k = [2, 2, 5][i]

    ours, theirs = compare(times_k, [rand(3)] * 3, before_call=set_k)
    assert ours == theirs == 2


def test_module_attributes_like_torch_compile():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.factor = 2

        def forward(self, x):
            return self.lin(x) * self.factor

    net = Scaled()
    ours, theirs = CountingBackend(), CompileCounter()
    k, t = kiln.compile(net, backend=ours), torch.compile(net, backend=theirs)
    x = torch.randn(2, 3)
    steps = [lambda: None, lambda: setattr(net, "factor", 3),
             lambda: setattr(net.lin, "weight", torch.nn.Parameter(torch.randn(3, 3))),
             lambda: setattr(net.lin, "weight", torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64)))]
    for step in steps[:3]:
        step()
        torch.testing.assert_close(k(x), net(x))
        t(x)
    assert len(ours.graphs) == theirs.frame_count


def test_kwargs_call_hits_the_cache():
    ours = CountingBackend()
    k = kiln.compile(scaled, backend=ours)
    x = torch.ones(3)
    torch.testing.assert_close(k(x, n=2), x * 2)
    torch.testing.assert_close(k(n=2, x=x), x * 2)
    torch.testing.assert_close(k(x, 2), x * 2)
    assert len(ours.graphs) == 1 and kiln.stats()["cache_hits"] == 2


def test_mark_dynamic_compiles_once():
    ours = CountingBackend()
    k = kiln.compile(add_one, backend=ours)
    for n in range(8, 21):
        x = torch.randn(n, 3)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(k(x), x + 1)
    assert len(ours.graphs) == 1


def test_batch_sizes_compile_at_most_twice_by_default():
    ours = CountingBackend()
    k = kiln.compile(add_one, backend=ours)
    for n in range(8, 21):
        x = torch.randn(n, 3)
        torch.testing.assert_close(k(x), x + 1)
    assert len(ours.graphs) <= 2


def test_static_sizes_hit_the_cache_limit_like_torch_compile():
    calls = [rand(n, 3) for n in range(2, 14)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours, theirs = compare(add_one, calls, dynamic=False)
    assert ours == theirs == kiln.config.cache_size_limit
    limit = [w for w in caught if issubclass(w.category, KilnWarning) and "cache_size_limit" in str(w.message)]
    assert len(limit) == 1 and "add_one" in str(limit[0].message)
    assert kiln.stats()["fallbacks"] == len(calls) - kiln.config.cache_size_limit


def bump_then_double(a, b):
    a.add_(1)
    return b * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_aliased_inputs_get_their_own_entry(backend):
    k = kiln.compile(bump_then_double, backend=backend)
    counter = CompileCounter()
    t = torch.compile(bump_then_double, backend=counter)
    for same in [False, True, False]:
        for fn in (k, bump_then_double, t):
            a = torch.zeros(3)
            b = a if same else torch.zeros(3)
            out = fn(a, b)
            torch.testing.assert_close(out, b * 2)
            torch.testing.assert_close(a, torch.ones(3))
    assert kiln.stats()["compiles"] == counter.frame_count == 2


def plus_ones(x):
    return x + torch.ones(3)


def test_default_dtype_change_recompiles():
    def set_dtype(i):
        torch.set_default_dtype([torch.float32, torch.float64, torch.float64][i])

    try:
        ours, theirs = compare(plus_ones, [lambda: (torch.ones(3, dtype=torch.float64),)] * 3, before_call=set_dtype)
    finally:
        torch.set_default_dtype(torch.float32)
    assert ours == theirs == 2


def matmul(x, w):
    return x @ w


def test_autocast_recompiles_and_matches_eager():
    ours = CountingBackend()
    k = kiln.compile(matmul, backend=ours)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    k(x, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = k(x, w), matmul(x, w)
    assert out.dtype == expected.dtype == torch.bfloat16
    assert len(ours.graphs) == 2
