"""An op whose eager CPU kernel refuses its inputs' dtypes raises eager's error when compiled too,
instead of a value computed by a kernel Kiln wrote (kiln/lower/eager_dtypes.py); ops eager accepts
(integer indices, bool masks, half inputs) are still lowered. A constant Scalar argument out of the
range of the op's dtype (a clamp bound, a fill value, a pad value) raises eager's overflow error
instead of wrapping."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.lower.eager_dtypes import EAGER_REFUSES, mark_refused

pytestmark = pytest.mark.cpp

BOOL = torch.tensor([True, False, True, True])
LONG = torch.tensor([3, -1, 4, 1])
CPLX = torch.randn(4, dtype=torch.complex64)

REFUSED = [
    ("argmax_bool", lambda x: x.argmax(), BOOL),
    ("relu_bool", lambda x: torch.relu(x), BOOL),
    ("abs_bool", lambda x: torch.abs(x), BOOL),
    ("softmax_long", lambda x: torch.softmax(x, 0), LONG),
    ("hardswish_long", F.hardswish, LONG),
    ("logaddexp_long", lambda x: torch.logaddexp(x, x), LONG),
    ("fused_then_refused", lambda x: torch.softmax(x * 2 + 1, 0), LONG),
    ("clamp_complex", lambda x: x.clamp(-1, 1), CPLX),
    ("pow_long_negative_int", lambda x: (x + 1) ** -1, LONG),  # an int tensor to a negative int power
    ("pow_int32_negative_fused", lambda x: (x.int() * 2).pow(-2) + 1, LONG),
]


@pytest.mark.parametrize("name,fn,x", REFUSED, ids=[r[0] for r in REFUSED])
def test_compiled_raises_what_eager_raises(name, fn, x):
    with pytest.raises(Exception) as eager:
        fn(x)
    kiln.reset()
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(fn)(x)
    assert str(compiled.value).splitlines()[0] == str(eager.value).splitlines()[0]


ACCEPTED = [
    ("embedding", lambda w, i: F.embedding(i, w).sum(), (torch.randn(10, 3), torch.tensor([[1, 2], [0, 9]]))),
    ("gather", lambda x, i: x.gather(1, i) * 2, (torch.randn(3, 4), torch.zeros(3, 2, dtype=torch.long))),
    ("masked_fill", lambda x, m: x.masked_fill(m, 0.0).relu(), (torch.randn(4), BOOL)),
    ("int_arith", lambda a, b: (a * 3 + b) // 2, (LONG, LONG.flip(0))),
    ("int_pow_positive", lambda a, b: (a * 3) ** 2 + b.pow(0), (LONG, LONG.flip(0))),
    ("bool_ops", lambda a, b: (a & b) | ~a, (BOOL, BOOL.flip(0))),
    ("half", lambda a, b: (a * b).sum(-1), (torch.randn(4, 4).half(), torch.randn(4, 4).half())),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t), (torch.randn(4, 5), torch.tensor([0, 4, 2, 1]))),
]


@pytest.mark.parametrize("name,fn,args", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted_dtypes_are_lowered_not_refused(name, fn, args):
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
    metas = {n: n.meta.get("val") for n in gm.graph.nodes}
    assert mark_refused(gm, metas, lambda target: True) == 0, [n.meta[EAGER_REFUSES] for n in gm.graph.nodes if EAGER_REFUSES in n.meta]
    kiln.reset()
    got, expected = kiln.compile(fn)(*args), fn(*args)
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)


I8 = torch.tensor([1, 2, -3], dtype=torch.int8)
U8 = torch.tensor([1, 2, 3], dtype=torch.uint8)
F32 = torch.tensor([0.5, 2.0, -3.0])

OVERFLOWING = [
    ("clamp_both_int8", lambda x: x.clamp(-200, 300), I8),
    ("clamp_min_uint8", lambda x: x.clamp(min=300), U8),
    ("clamp_max_int8", lambda x: torch.clamp(x, max=-129), I8),
    ("where_scalar_int8", lambda x: torch.where(x > 1, x, 300), I8),
    ("masked_fill_uint8", lambda x: x.masked_fill(x > 1, 256), U8),
    ("full_like_int8", lambda x: torch.full_like(x, 128), I8),
    ("fill_int8", lambda x: x.clone().fill_(-129), I8),
    ("index_fill_uint8", lambda x: x.index_fill(0, torch.tensor([0]), 1000), U8),
    ("pad_value_int8", lambda x: F.pad(x, (1, 1), value=300), I8),
    ("scatter_value_int8", lambda x: x.scatter(0, torch.tensor([0]), 300), I8),
    ("full_int8_added", lambda x: x + torch.full((3,), 300, dtype=torch.int8), I8),
    ("full_large_int8", lambda x: torch.full((5000,), 300, dtype=torch.int8).sum() + x, I8),
    ("threshold_float32", lambda x: F.threshold(x, 1.0, 1e40), F32),
    ("hardtanh_float32", lambda x: F.hardtanh(x * 2, -1e39, 1.0), F32),
    ("full_half_int", lambda x: torch.full((3,), 70000, dtype=torch.float16) + x, F32),
]


@pytest.mark.parametrize("name,fn,x", OVERFLOWING, ids=[r[0] for r in OVERFLOWING])
def test_a_scalar_out_of_the_dtypes_range_raises_eagers_overflow_error(name, fn, x):
    with pytest.raises(RuntimeError, match="without overflow"):
        fn(x)
    kiln.reset()
    with pytest.raises(RuntimeError, match="without overflow"):
        kiln.compile(fn)(x)


IN_RANGE = [
    ("clamp_int8_edges", lambda x: x.clamp(-128, 127) * 2, I8),
    ("uint8_fill_negative_wraps", lambda x: x.masked_fill(x > 1, -1), U8),  # eager wraps -255..-1 into uint8
    ("clamp_float_bounds_promote", lambda x: x.clamp(-200.5, 300.5), I8),  # the result is float32
    ("add_wraps", lambda x: x + 300, I8),  # a wrapped number: eager wraps it too
    ("fill_inf_float", lambda x: x.masked_fill(x > 1, float("inf")), F32),
]


@pytest.mark.parametrize("name,fn,x", IN_RANGE, ids=[r[0] for r in IN_RANGE])
def test_scalars_eager_accepts_stay_compiled_and_agree(name, fn, x):
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


SYMBOLIC = [
    ("clamp_max_int8", lambda a, k: a.clamp(max=k), I8, [5, 7, 100, 300, -2]),
    ("masked_fill_int8", lambda a, k: a.masked_fill(a > 0, k), I8, [5, 7, 100, 1000, -2]),
    ("pad_uint8", lambda a, k: F.pad(a, (1, 1), value=k), U8, [5, 7, 256, 3]),
    ("fill_half", lambda a, k: a.half().masked_fill(a > 1, k), F32, [5.0, 7.0, 1e6, 3.0]),
    ("full_half", lambda a, k: torch.full((3,), k, dtype=torch.float16) + a, F32, [5, 7, 100000, 3]),
]


@pytest.mark.parametrize("name,fn,x,values", SYMBOLIC, ids=[r[0] for r in SYMBOLIC])
def test_an_int_or_float_argument_of_a_dynamic_graph_is_range_checked_on_each_call(name, fn, x, values):
    """The argument becomes a symbol after it changed: the compiled graph cannot know its value, so
    the op runs as the ATen call, which checks the value of every call."""
    _compare_calls(fn, x, values, "without overflow")


NEGATIVE_POWERS = [
    ("pow_int64", lambda a, k: a ** k, LONG, [2, 3, 1, -1, 0, -2]),
    ("pow_int32_fused", lambda a, k: (a.int() * 2) ** k + 1, LONG, [2, 3, -1, 4]),
    ("pow_uint8", lambda a, k: torch.pow(a, k), U8, [2, 3, -1]),
]


@pytest.mark.parametrize("name,fn,x,values", NEGATIVE_POWERS, ids=[r[0] for r in NEGATIVE_POWERS])
def test_an_int_tensor_to_a_symbolic_negative_power_raises_eagers_error(name, fn, x, values):
    """A negative int exponent that is a graph input (a symbol once it changed): eager refuses it
    for an integer tensor; Kiln's kernel computed 0 or 1."""
    _compare_calls(fn, x, values, "negative integer powers")


def _compare_calls(fn, x, values, refusal):
    kiln.reset()
    compiled = kiln.compile(fn)
    for value in values:
        try:
            want = fn(x, value)
        except RuntimeError as error:
            assert refusal in str(error)
            with pytest.raises(RuntimeError, match=refusal):
                compiled(x, value)
        else:
            torch.testing.assert_close(compiled(x, value), want)


def test_probing_a_symbolic_scalar_records_no_guard(tmp_path):
    """The dtype probe runs the op on stand-ins: given a SymInt bound, the real op asked the ShapeEnv
    for its value and recorded `s0 - 1 == 10` after capture, so a fresh lowering (no kernel cache)
    pinned the dynamic graph to one size (bicubic interpolation's index clamp recompiled per size)."""
    def fn(x):
        return torch.arange(x.shape[0]).clamp(0, x.shape[0] - 2) + x.long()

    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    with kiln.config.patch(cache_dir=str(tmp_path), cpu_wrapper="python"):
        for n in (5, 7, 11):
            x = torch.arange(n)
            assert torch.equal(compiled(x), fn(x))
    assert kiln.stats()["compiles"] == 1


F64 = torch.tensor([0.5, 2.0, -3.0], dtype=torch.float64)
INTEGER_ONLY_ON_FLOAT = [
    ("xor_scalar", lambda x: x ^ 1, F32),
    ("and_scalar_fused", lambda x: (x * 2 & 1) + 1, F32),
    ("or_self", lambda x: x | x, F64),
    ("xor_bool_mask", lambda x: x ^ (x > 0), F32),
    ("left_shift_self", lambda x: torch.bitwise_left_shift(x, x), F32),
    ("right_shift_fused", lambda x: torch.bitwise_right_shift(x + 1, x), F64),
]


@pytest.mark.parametrize("name,fn,x", INTEGER_ONLY_ON_FLOAT, ids=[r[0] for r in INTEGER_ONLY_ON_FLOAT])
@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_integer_only_ops_of_float32_and_float64_raise_eagers_error_at_the_call(name, fn, x, backend):
    """Float32/float64 were never probed: `x ^ 1` of a float tensor passed the meta kernels, its C++
    kernel failed to build and the frame fell back to eager with an internal-error warning."""
    with pytest.raises(Exception) as eager:
        fn(x)
    kiln.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(type(eager.value)) as compiled:
            kiln.compile(fn, backend=backend)(x)
    assert str(compiled.value).splitlines()[0] == str(eager.value).splitlines()[0]
    assert not [w for w in caught if "kiln" in str(w.message)], [str(w.message)[:200] for w in caught]


def test_an_integer_only_op_of_a_float_tensor_is_marked_refused():
    # traced on fake tensors: the real op would raise while tracing
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b: torch.bitwise_xor(a, b), tracing_mode="fake")(F32, F32)
    metas = {n: n.meta.get("val") for n in gm.graph.nodes}
    assert mark_refused(gm, metas, lambda target: True) == 1
