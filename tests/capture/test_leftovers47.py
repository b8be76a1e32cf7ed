"""Leftovers found by probes, each a class of cases compared with eager (values, raised errors with
eager's text, signs of zeros) and, for graph counts, with the real torch.compile as the oracle.

- Python float arguments under `//` and `%` (`x * (a // b)`, `x + a % b`) are symbolic after the
  first recompile, as every other use of a float argument (torch.compile makes them symbolic too):
  one graph serves every later value, and it computes Python's float floor division and remainder
  (through fmod: 1.0 // 0.1 is 9.0, -1.0 % 3.0 is 2.0, a zero remainder takes the divisor's sign) on
  every backend, including inf and nan arguments, and raises Python's ZeroDivisionError text;
- an in-place layout change of a graph input AOT autograd cannot replay is a break at the call;
- dicts keyed by tuples of classes (kl_divergence's registry) are traced: kl_divergence is one graph;
- a TorchFunctionMode around or inside a compiled frame sees eager's calls;
- a Python attribute set on a tensor the frame computes is replayed on the graph's output;
- int and float arithmetic dunders on symbolic numbers are the operators (or NotImplemented).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import sympy
import torch

import kiln
from eager_compare import outcome, same_outcome
from torch_oracle import torch_graph_count
from kiln.symbolic.floats import FloatFloorDiv, FloatMod
from kiln.symbolic.render import render_c, render_python

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


@pytest.fixture(autouse=True)
def fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def scaled_quotient(x, a, b):
    return x * (a // b)


def shifted_remainder(x, a, b):
    return x + a % b


def both_and_sizes(x, a, b):
    return x * (b // a) + (a % b) * 2 + x.shape[0] // b


def returned_numbers(x, a, b):
    q = a // b
    r = a % b
    return x * q + r, q, r


def size_times_float(x, a, b):
    return x * ((x.shape[0] * a) % b)


def in_place_floordiv(x, a, b):
    a //= b
    return x - a


def factory_of_quotient(x, a, b):
    return torch.full((2,), a // b) + x.sum() * (a % b)


def negated_operands(x, a, b):
    return x * (-a // b) + (a % -b) + 7.5 % b


PROGRAMS = [scaled_quotient, shifted_remainder, both_and_sizes, returned_numbers, size_times_float, in_place_floordiv,
            factory_of_quotient, negated_operands]
# finite pairs: Python's corner cases (1.0 // 0.1 is 9.0, signed zeros, tiny remainders) and a zero divisor
FLOAT_PAIRS = [(3.5, 2.0), (7.25, 1.5), (1.0, 0.1), (-5.5, 2.0), (9.0, -4.0), (-1.0, 3.0), (1.0, -3.0), (6.0, 3.0),
               (-6.0, 3.0), (0.0, -2.0), (-0.0, 2.0), (1e-20, 1.0), (-1e-20, 1.0), (5.0, 0.0), (2.5, -0.0), (4.0, 1.5)]
NON_FINITE_PAIRS = [(3.5, 2.0), (7.25, 1.5), (math.inf, 2.0), (2.0, math.inf), (-2.0, math.inf), (math.nan, 2.0),
                    (2.0, math.nan), (-math.inf, -3.0)]
MIXED_PAIRS = [(3, 2.0), (7, 2.5), (-7, 2.5), (5, 0.0), (-8, -2.5), (3.5, 2), (7.5, 4), (-7.5, 4), (5.5, 0)]


def _signs(v: Any) -> Any:
    """Signs of zeros and the nan-ness of each number (what same() cannot tell apart)."""
    if isinstance(v, tuple):
        return [_signs(i) for i in v]
    if isinstance(v, float):
        return "nan" if math.isnan(v) else math.copysign(1.0, v)
    if isinstance(v, torch.Tensor):
        return [("nan" if math.isnan(e) else math.copysign(1.0, e)) for e in v.tolist()]
    return v


def _same(got: Any, want: Any) -> bool:
    if want[0] != "ok":
        return same_outcome(got, want, text=True)
    return got[0] == "ok" and repr(_signs(got[1])) == repr(_signs(want[1])) and (
        same_outcome(got, want, text=True) or repr(got) == repr(want))  # nan == nan in repr


def _run(fn: Callable[..., Any], pairs: list[tuple], backend: str) -> int:
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter)
    for a, b in pairs:
        want = outcome(fn, torch.arange(4.0) - 1.5, a, b)
        got = outcome(compiled, torch.arange(4.0) - 1.5, a, b)
        assert _same(got, want), (fn.__name__, backend, a, b, got, want)
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    return counter.frame_count


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_float_floordiv_and_mod_follow_automatic_dynamic(fn):
    """Two graphs over every finite pair (the first values, then symbols), as torch.compile."""
    calls = [(torch.arange(4.0) - 1.5, a, b) for a, b in FLOAT_PAIRS]
    calls = [args for args in calls if outcome(fn, *args)[0] == "ok"]  # torch.compile's run raises the same
    assert _run(fn, FLOAT_PAIRS, "eager") == 2 == torch_graph_count(fn, calls)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("fn", [scaled_quotient, returned_numbers, negated_operands, size_times_float],
                         ids=lambda f: f.__name__)
def test_float_floordiv_and_mod_values_on_lowered_backends(fn, backend):
    assert _run(fn, FLOAT_PAIRS, backend) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_and_nan_arguments(backend):
    """An inf or nan argument is a constant of the graph (a symbol stands for finite values only),
    which the lowered code spells as a non-finite double."""
    for fn in (shifted_remainder, returned_numbers):
        _run(fn, NON_FINITE_PAIRS, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int_and_float_operands(backend):
    for fn in (scaled_quotient, negated_operands):
        _run(fn, MIXED_PAIRS, backend)


def test_dynamic_true_makes_one_graph():
    fn = shifted_remainder
    counter = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=counter, dynamic=True)
    for a, b in FLOAT_PAIRS:
        assert _same(outcome(compiled, torch.ones(3), a, b), outcome(fn, torch.ones(3), a, b))
    calls = [(torch.ones(3), a, b) for a, b in FLOAT_PAIRS if b != 0]
    assert counter.frame_count == torch_graph_count(fn, calls, dynamic=True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("grad_mode", ["grad", "no_grad", "inference_mode"])
def test_gradients_through_a_symbolic_quotient(backend, grad_mode):
    """The reused graph's backward scales by this call's quotient, not the first one's."""
    def fn(w, a, b):
        return (w * (a // b) + w * (a % b)).sum()

    modes = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
    compiled = kiln.compile(fn, backend=backend)
    for a, b in [(3.5, 2.0), (7.25, 1.5), (-9.0, 4.0), (1.0, 0.1)]:
        w_eager = torch.randn(3, requires_grad=True)
        w_kiln = w_eager.detach().clone().requires_grad_(True)
        with modes[grad_mode]():
            want = fn(w_eager, a, b)
            got = compiled(w_kiln, a, b)
        assert torch.equal(got, want)
        if grad_mode == "grad":
            want.backward()
            got.backward()
            assert torch.equal(w_kiln.grad, w_eager.grad)
    assert kiln.stats()["fallbacks"] == 0


def test_float_operations_evaluate_and_render_as_python():
    a, b = sympy.Symbol("zf0", real=True), sympy.Symbol("zf1", real=True)
    for x, y in [(1.0, 0.1), (-1.0, 3.0), (1.0, -3.0), (-0.0, 2.0), (7.5, 2), (-7, 2.5)]:
        assert float(FloatFloorDiv(sympy.Float(x), sympy.Float(y))) == x // y
        assert math.copysign(1.0, float(FloatMod(sympy.Float(x), sympy.Float(y)))) == math.copysign(1.0, x % y)
        for e, want in ((FloatFloorDiv(a, b), x // y), (FloatMod(a, b), x % y)):
            got = eval(render_python(e), {"zf0": float(x), "zf1": float(y)})
            assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    assert render_c(FloatFloorDiv(a, b)) == "kiln_floordiv_float(zf0, zf1)"
    assert render_c(FloatMod(a, sympy.Integer(3))) == "std::copysign(kiln_fmod_float(zf0, 3.0), 3.0)"
    assert render_python(FloatMod(sympy.oo, a)) == "float('inf') % zf0"


# ------------------------------------------------ in-place layout changes AOT autograd cannot replay
# An in-place op that changes a graph input's sizes, strides or storage where the runtime cannot give
# the caller's tensor that layout after the graph (the input requires grad; resize_ and set_) is a
# break at the call (torch.compile breaks there too), not the whole frame run eagerly on every call.

def strided_under_no_grad(x):
    with torch.no_grad():
        x.as_strided_((2, 2), (2, 1))
    return x + 1


def transposed_under_no_grad(x):
    with torch.no_grad():
        x.t_()
    return x * 2


def unsqueezed_under_no_grad(x):
    with torch.no_grad():
        x.unsqueeze_(0).squeeze_(0).unsqueeze_(1)
    return x.sum(0)


def resized(x):
    x.resize_(2, 2)
    return x * 2


def grown(x):
    x.resize_(10)
    return x[:4] + 1


def set_to_other(x, y):
    x.set_(y)
    return x + 1


def strided_with_offset(x):
    x.as_strided_((3,), (2,), 1)
    return x * 3


LAYOUT_CASES = [
    (strided_under_no_grad, lambda: (torch.arange(8.0, requires_grad=True),)),
    (transposed_under_no_grad, lambda: (torch.ones(2, 3, requires_grad=True),)),
    (unsqueezed_under_no_grad, lambda: (torch.arange(3.0, requires_grad=True),)),
    (resized, lambda: (torch.arange(8.0),)),
    (grown, lambda: (torch.arange(8.0),)),
    (set_to_other, lambda: (torch.arange(8.0), torch.ones(3))),
    (strided_with_offset, lambda: (torch.arange(8.0),)),
]


def _layout(t: torch.Tensor) -> tuple:
    # the first elements only: resize_ to more elements leaves the new ones uninitialized
    return tuple(t.shape), t.stride(), t.storage_offset(), t._version, t.requires_grad, t.detach().reshape(-1)[:4].clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make", LAYOUT_CASES, ids=[c[0].__name__ for c in LAYOUT_CASES])
def test_input_layout_changes_break_or_compile(fn, make, backend):
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        eager_args, kiln_args = make(), make()
        want = fn(*eager_args)
        got = compiled(*kiln_args)
        assert torch.equal(got.detach(), want.detach()) and got.shape == want.shape
        for e, k in zip(eager_args, kiln_args):
            le, lk = _layout(e), _layout(k)
            assert le[:5] == lk[:5] and torch.equal(le[5], lk[5]), (le, lk)
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert kiln.stats()["graphs"] >= 1


# ------------------------------------------- dicts keyed by tuples of classes (kl_divergence's registry)
# torch.distributions.kl_divergence looks its function up in dicts keyed by (type(p), type(q)) and
# iterates the registry on a first call: such a dict is traced as a dict (keys guarded, values read
# by position), so the whole call is one graph, where it was a break inside an except handler.

def kl_normal(m1, s1, m2, s2):
    from torch.distributions import Normal, kl_divergence
    return kl_divergence(Normal(m1, s1), Normal(m2, s2)).sum()


def kl_categorical(p, q):
    from torch.distributions import Categorical, kl_divergence
    return kl_divergence(Categorical(probs=p), Categorical(probs=q))


def kl_bernoulli_scaled(p, q):
    from torch.distributions import Bernoulli, kl_divergence
    return kl_divergence(Bernoulli(probs=p), Bernoulli(probs=q)).mean() * 2


TYPE_TABLE = {(int, str): "int-str", (float, str): "float-str", (int, int): "int-int"}


def lookup_by_type_pair(x, a, b):
    return x * len(TYPE_TABLE[type(a), type(b)])


def scan_type_pairs(x, a):
    for left, right in TYPE_TABLE:
        if isinstance(a, left):
            x = x + len(TYPE_TABLE[left, right])
    return x


@pytest.mark.parametrize("fn,make", [
    (kl_normal, lambda: (torch.zeros(3), torch.ones(3), torch.full((3,), 0.5), torch.full((3,), 2.0))),
    (kl_categorical, lambda: (torch.tensor([0.1, 0.2, 0.7]), torch.tensor([0.3, 0.3, 0.4]))),
    (kl_bernoulli_scaled, lambda: (torch.tensor([0.2, 0.9]), torch.tensor([0.5, 0.4]))),
], ids=["normal", "categorical", "bernoulli"])
def test_kl_divergence_is_one_graph(fn, make):
    from torch.distributions import kl
    kl._KL_MEMOIZE.clear()  # the first call dispatches over the registry (its loop over a dict)
    counter = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=counter)
    for _ in range(3):
        assert torch.allclose(compiled(*make()), fn(*make()))
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert counter.frame_count == 1


def test_dict_keyed_by_type_pairs():
    compiled = kiln.compile(lookup_by_type_pair, backend="eager")
    for a, b in [(1, "s"), (1.5, "t"), (2, 3)]:
        assert torch.equal(compiled(torch.ones(2), a, b), lookup_by_type_pair(torch.ones(2), a, b))
    compiled_scan = kiln.compile(scan_type_pairs, backend="eager")
    for a in (1, 2.5):
        assert torch.equal(compiled_scan(torch.ones(2), a), scan_type_pairs(torch.ones(2), a))
    TYPE_TABLE[(int, str)] = "changed value"  # a value the trace read: guarded
    try:
        assert torch.equal(compiled(torch.ones(2), 1, "s"), lookup_by_type_pair(torch.ones(2), 1, "s"))
        TYPE_TABLE[(str, str)] = "new key"  # the keys: guarded
        assert torch.equal(compiled_scan(torch.ones(2), 1), scan_type_pairs(torch.ones(2), 1))
    finally:
        TYPE_TABLE[(int, str)] = "int-str"
        del TYPE_TABLE[(str, str)]
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()


# ------------------------------------------------------- a TorchFunctionMode around a compiled call
# A user's TorchFunctionMode active around (or entered inside) a compiled frame sees eager's calls,
# in eager's order, and changes results as in eager: never the wrapper's own calls (the externs a
# lowered graph calls, its allocations), whether the frame was compiled before the mode was entered.

class _Log(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _DoubleMatmuls(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func in (torch.mm, torch.matmul, torch.Tensor.__matmul__, torch.addmm) else out


def externs(x, w, b):
    return torch.relu(x @ w) + torch.mm(x, w) + torch.addmm(b, x, w)


def mode_inside(x, w, b):
    with _Log():
        y = torch.mm(x, w)
    return torch.addmm(b, y, w).relu()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("warm", [True, False], ids=["compiled_before", "first_call_under_mode"])
def test_torch_function_mode_sees_eager_calls(backend, warm):
    x, w, b = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4)
    compiled = kiln.compile(externs, backend=backend)
    if warm:
        compiled(x, w, b)
    with _Log() as eager_log:
        want = externs(x, w, b)
    with _Log() as kiln_log:
        got = compiled(x, w, b)
    assert torch.allclose(got, want) and kiln_log.calls == eager_log.calls, kiln_log.calls
    with _DoubleMatmuls():
        want = externs(x, w, b)
        got = compiled(x, w, b)
    assert torch.allclose(got, want)
    assert torch.allclose(compiled(x, w, b), externs(x, w, b))  # the mode gone: the graph again


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_mode_entered_in_the_frame(backend):
    x, w, b = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4)
    compiled = kiln.compile(mode_inside, backend=backend)
    for _ in range(2):
        assert torch.allclose(compiled(x, w, b), mode_inside(x, w, b))


# ------------------------------------------------- a Python attribute set on a tensor the frame computes
# `y = x * 2; y.tag = 1; return y`: the glue sets it on the graph's output after the graph (torch.compile
# keeps one graph too), and the trace reads it back (`y.tag`, hasattr) as the value it stored.

def tag_returned(x):
    y = x * 2
    y.tag = 1
    return y


def tag_read_back(x):
    y = x.relu()
    y.meta_info = {"rows": x.shape[0]}
    z = y + len(y.meta_info)
    return z, y, hasattr(y, "meta_info"), hasattr(y, "other")


def tag_holds_tensor(x):
    y = x + 1
    y.partner = y * 3
    y.tag = "first"
    y.tag = "second"
    return y, y.partner.sum()


def tag_on_a_view(x):
    v = (x * 2)[1:]
    v.name_of = "tail"
    return v


ATTRIBUTE_CASES = [tag_returned, tag_read_back, tag_holds_tensor, tag_on_a_view]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("fn", ATTRIBUTE_CASES, ids=lambda f: f.__name__)
def test_attributes_of_computed_tensors(fn, grad, backend):
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter)
    for _ in range(2):
        x = torch.randn(4, requires_grad=grad)
        want, got = fn(x), compiled(x)
        flat_want = want if isinstance(want, tuple) else (want,)
        flat_got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(flat_want, flat_got):
            if isinstance(w, torch.Tensor):
                assert torch.allclose(g, w)
                own = {k: v for k, v in vars(w).items()}
                assert set(vars(g)) == set(own), (vars(g), own)
                for k, v in own.items():
                    got_v = vars(g)[k]
                    assert torch.allclose(got_v, v) if isinstance(v, torch.Tensor) else got_v == v
            else:
                assert g == w
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert counter.frame_count == 1


# ------------------------------------------------------- int and float dunders on symbolic numbers
# `a.__floordiv__(b)` and its kind on an int or float argument once it is symbolic: the operator
# itself, or NotImplemented where the method does not take the other type (`(3).__truediv__(2.0)`),
# instead of an AttributeError that ran the frame eagerly.

def dunder_floordiv(x, a, b):
    return x * a.__floordiv__(b)


def dunder_reflected(x, a, b):
    return x + a.__rmod__(b) + a.__add__(b) - a.__rsub__(b) * a.__mul__(b)


def dunder_not_implemented(x, a, b):
    r = a.__truediv__(b)
    return x * (0 if r is NotImplemented else r), r is NotImplemented


@pytest.mark.parametrize("fn,pairs", [
    (dunder_floordiv, [(3.5, 2.0), (7.25, 1.5), (1.0, 0.1), (-4.5, 2.0)]),
    (dunder_reflected, [(3.5, 2.0), (7.25, 1.5), (-1.0, 0.3), (2.5, 4)]),
    (dunder_reflected, [(3, 2), (7, 5), (-1, 4)]),
    (dunder_not_implemented, [(3, 2.0), (7, 1.5), (9, 4.5)]),
    (dunder_not_implemented, [(3, 2), (7, 3), (9, 4)]),
], ids=["floordiv", "reflected_floats", "reflected_ints", "int_by_float", "int_by_int"])
def test_number_dunders_on_symbolic_arguments(fn, pairs):
    compiled = kiln.compile(fn, backend="eager")
    for a, b in pairs:
        want = outcome(fn, torch.arange(3.0), a, b)
        got = outcome(compiled, torch.arange(3.0), a, b)
        assert _same(got, want), (a, b, got, want)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert kiln.stats()["graphs"] <= 3  # the first values, then symbols (and an int b after float ones)
