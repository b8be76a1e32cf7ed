"""Integer and complex tensor semantics through Kiln, against eager (or exact integer arithmetic).

1. Triton's integer division helpers (under the interpreter, cpu_backend="triton"): truncating and
   floor division, fmod and remainder for every signed and unsigned integer type, by divisors -1,
   255, the type's extremes, and the minimum over -1 (which eager's trunc division must never be
   fed: it dies of SIGFPE; the expected values come from Python integers, wrapped to the type).
   The class that was wrong: the helpers special-cased `b == -1` for every integer type; for an
   unsigned tile Triton refuses the comparison with a negative literal (uint8 division failed to
   compile, falling back to eager), and a compiler that wrapped -1 instead would take uint8's 255
   for -1. Unsigned types now get their own helpers, with no -1 case.
2. uint16/uint32/uint64 and int8 through the default (C++) pipeline: arithmetic, comparisons,
   shifts, division, reductions, casts; complex64/128 pointwise ops, views and reductions. Eager
   raises "not implemented for 'UInt16'" for many of them: Kiln raises the same type.
3. Output strides: a dense output keeps eager's strides whole, a size-1 dim's stride included
   (`.to(dtype)`, `.clone()`, `.bool()` of a (1, 7) view with strides (129, 1) give (129, 1) eagerly
   and under torch.compile; Kiln gave (7, 1)). Not covered: full_like/zeros_like of such a view keep
   the meta kernels' size-1 strides ((7, 1); eager (129, 1)), as torch.compile's inductor does too.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import config

T = torch.tensor
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
WIDE_UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]


# -- 1. Triton's integer division --------------------------------------------------------------

def _wrap(v: int, dtype: torch.dtype) -> int:
    info = torch.iinfo(dtype)
    v &= (1 << info.bits) - 1
    return v - (1 << info.bits) if info.min < 0 and v >= 1 << (info.bits - 1) else v


def _expected(op: str, a: int, b: int, dtype: torch.dtype) -> int:
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # truncated
    value = {"trunc": q, "fmod": a - q * b, "floor": a // b, "remainder": a - (a // b) * b}[op]
    return _wrap(value, dtype)


DIVISIONS: dict[str, Callable[[Any, Any], Any]] = {
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "fmod": lambda a, b: torch.fmod(a, b),
    "remainder": lambda a, b: torch.remainder(a, b),
}


def _extremes(dtype: torch.dtype) -> list[int]:
    info = torch.iinfo(dtype)
    vals = {info.min, info.min + 1, -7, -1, 0, 1, 7, 100, 127, 128, 254, 255, info.max - 1, info.max}
    return sorted(v for v in vals if info.min <= v <= info.max)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("op", list(DIVISIONS))
@pytest.mark.parametrize("dtype", INTS)
def test_triton_integer_division_by_extreme_divisors(dtype: torch.dtype, op: str) -> None:
    pytest.importorskip("triton")
    vals = _extremes(dtype)
    pairs = [(a, b) for a in vals for b in vals if b != 0]
    a = T([p[0] for p in pairs], dtype=dtype)
    b = T([p[1] for p in pairs], dtype=dtype)
    scalar = -1 if dtype.is_signed else 255
    with config.patch(cpu_backend="triton"):
        kiln.reset()
        got = kiln.compile(DIVISIONS[op], fullgraph=True)(a, b)
        kiln.reset()
        by_scalar = kiln.compile(lambda x: DIVISIONS[op](x, scalar), fullgraph=True)(a)
    assert got.dtype == by_scalar.dtype == dtype
    assert got.tolist() == [_expected(op, x, y, dtype) for x, y in pairs]
    assert by_scalar.tolist() == [_expected(op, x, scalar, dtype) for x, _ in pairs]


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_triton_unsigned_division_matches_eager_on_a_wide_tile() -> None:
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (37, 129), generator=g, dtype=torch.uint8)
    b = torch.randint(1, 256, (37, 129), generator=g, dtype=torch.uint8)
    b[::3, ::5] = 255
    fn = lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"))  # noqa: E731
    with config.patch(cpu_backend="triton"):
        kiln.reset()
        got = kiln.compile(fn)(a, b)
        assert kiln.stats()["fallbacks"] == 0
    for g_, w in zip(got, fn(a, b)):
        assert g_.dtype == w.dtype and torch.equal(g_, w)


# -- 2. wide unsigned, int8 and complex programs through the C++ pipeline ------------------------

def _ints(dtype: torch.dtype) -> tuple:
    info = torch.iinfo(dtype)
    vals = [0, 1, 2, 7, 100, 127, info.max, info.max - 1] + ([info.min, -1, -7] if info.min < 0 else [])
    as_int64 = [v - (1 << 64) if v >= 1 << 63 else v for v in vals for _ in range(3)]
    a = T(as_int64, dtype=torch.int64)
    a = a.view(torch.uint64) if dtype == torch.uint64 else a.to(dtype)
    return a, a[torch.arange(a.numel() - 1, -1, -1)].clone()


def _grid(dtype: torch.dtype) -> tuple:
    a = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    b = a % 5 + 1
    if dtype == torch.uint64:
        return a.view(torch.uint64), b.view(torch.uint64)
    return a.to(dtype), b.to(dtype)


def _complex(dtype: torch.dtype) -> tuple:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 4, dtype=dtype, generator=g), torch.randn(3, 4, dtype=dtype, generator=g)
    a[0, 0] = complex(float("inf"), 1.0)
    b[1, 1] = 0
    return a, b


INTEGER_PROGRAMS: dict[str, Callable[..., Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b, "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "eq": lambda a, b: a == b, "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b,
    "maximum": lambda a, b: torch.maximum(a, b), "minimum": lambda a, b: torch.minimum(a, b),
    "where": lambda a, b: torch.where(a > b, a, b), "lshift": lambda a, b: a << 3, "rshift": lambda a, b: a >> 2,
    "lshift_t": lambda a, b: a << (b % 8), "rshift_t": lambda a, b: a >> (b % 8),
    "add_scalar": lambda a, b: a + 5, "mul_scalar": lambda a, b: a * 3, "sub_rscalar": lambda a, b: 10 - a,
    "add_float": lambda a, b: a + 1.5, "mul_float": lambda a, b: a * 0.5, "neg": lambda a, b: -a,
    "abs": lambda a, b: a.abs(), "bitnot": lambda a, b: ~a, "sign": lambda a, b: a.sign(),
    "clamp": lambda a, b: a.clamp(2, 100), "clamp_min": lambda a, b: a.clamp_min(3),
    "sum": lambda a, b: a.sum(), "sum0": lambda a, b: a.sum(0), "sum_int32": lambda a, b: a.sum(dtype=torch.int32),
    "prod": lambda a, b: a.prod(), "amax": lambda a, b: a.amax(), "amin0": lambda a, b: a.amin(0),
    "max_dim": lambda a, b: a.max(0), "argmax": lambda a, b: a.argmax(), "mean": lambda a, b: a.mean(),
    "cumsum": lambda a, b: a.cumsum(0), "any": lambda a, b: a.any(), "all": lambda a, b: a.all(),
    "to_f32": lambda a, b: a.float() * 2, "to_f64": lambda a, b: a.double() + 1, "to_i64": lambda a, b: a.long() - 1,
    "to_bool": lambda a, b: a.bool(), "to_u8": lambda a, b: a.to(torch.uint8), "to_i32": lambda a, b: a.to(torch.int32),
    "from_float": lambda a, b: (a.double() * 0.75).to(a.dtype), "from_float_div": lambda a, b: a.float().div(3).to(a.dtype),
    "pow2": lambda a, b: a ** 2, "square": lambda a, b: a * a, "eq_scalar": lambda a, b: a == 7,
    "and_scalar": lambda a, b: a & 6, "view_add": lambda a, b: a[1:] + b[:-1], "sort": lambda a, b: a.sort(),
    "topk": lambda a, b: a.topk(2), "gather": lambda a, b: a[T([0, 2, 1])], "remainder": lambda a, b: a % 3,
    "fmod": lambda a, b: torch.fmod(a, 3), "trunc_div": lambda a, b: torch.div(a, 3, rounding_mode="trunc"),
    "floor_div": lambda a, b: a // 3, "fmod_t": lambda a, b: torch.fmod(a, b.clamp_min(1)),
    "sqrt": lambda a, b: a.sqrt(), "exp": lambda a, b: a.exp(), "relu": lambda a, b: torch.relu(a),
    "clamp_max": lambda a, b: torch.clamp(a, max=9), "cat": lambda a, b: torch.cat([a, b]) + 1,
    "stack_sum": lambda a, b: torch.stack([a, b]).sum(0), "masked_fill": lambda a, b: a.masked_fill(a > 5, 1),
    "bincount": lambda a, b: (a & 3).long().bincount(), "ne_sum": lambda a, b: (a != b).sum(),
    "copy_": lambda a, b: a.clone().copy_(b), "add_alpha": lambda a, b: a.add(b, alpha=2),
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
}

COMPLEX_PROGRAMS: dict[str, Callable[..., Any]] = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "sub": lambda a, b: a - b * 2,
    "abs": lambda a, b: a.abs(), "angle": lambda a, b: a.angle(), "real": lambda a, b: a.real * 2,
    "imag": lambda a, b: a.imag + 1, "conj_mul": lambda a, b: a.conj() * b, "conj_physical": lambda a, b: torch.conj_physical(a),
    "real_view": lambda a, b: a.real, "imag_view": lambda a, b: a.imag, "sum": lambda a, b: a.sum(),
    "sum0": lambda a, b: a.sum(0), "mean1": lambda a, b: a.mean(1), "prod0": lambda a, b: a.prod(0),
    "exp": lambda a, b: a.exp(), "log": lambda a, b: a.log(), "sqrt": lambda a, b: a.sqrt(), "sin": lambda a, b: a.sin(),
    "tanh": lambda a, b: a.tanh(), "eq": lambda a, b: a == b, "neg": lambda a, b: -a, "reciprocal": lambda a, b: a.reciprocal(),
    "pow2": lambda a, b: a ** 2, "pow_t": lambda a, b: a.pow(b), "sgn": lambda a, b: a.sgn(),
    "view_as_real_mul": lambda a, b: torch.view_as_real(a) * 2, "view_as_real": lambda a, b: torch.view_as_real(a),
    "polar": lambda a, b: torch.polar(a.abs(), a.angle()), "complex": lambda a, b: torch.complex(a.real, b.imag),
    "real_to_complex": lambda a, b: a.real.to(a.dtype) + b, "mul_scalar": lambda a, b: a * 2.5,
    "add_imaginary": lambda a, b: a + 1j, "matmul": lambda a, b: a @ b.T, "isnan": lambda a, b: a.isnan(),
    "isfinite": lambda a, b: a.isfinite(), "where": lambda a, b: torch.where(a.real > 0, a, b),
    "cat": lambda a, b: torch.cat([a, b], 1), "t_add": lambda a, b: a.t() + b.t(), "abs2": lambda a, b: (a * a.conj()).real,
    "square": lambda a, b: torch.square(a), "mul_real": lambda a, b: a * b.real, "add_int": lambda a, b: a + torch.arange(4),
    "cumsum": lambda a, b: a.cumsum(1), "to_real": lambda a, b: a.to(torch.float32), "sigmoid": lambda a, b: torch.sigmoid(a),
    "rsqrt": lambda a, b: a.rsqrt(), "imag_mul_": lambda a, b: a.clone().imag.mul_(2), "conj_clone": lambda a, b: a.conj().clone(),
}


def _programs() -> dict[str, tuple[Callable[..., Any], Callable[[], tuple]]]:
    out: dict[str, tuple[Callable[..., Any], Callable[[], tuple]]] = {}
    for dtype in WIDE_UNSIGNED + [torch.int8]:
        short = str(dtype).removeprefix("torch.")
        for name, fn in INTEGER_PROGRAMS.items():
            out[f"{name}-{short}"] = (fn, lambda d=dtype: _ints(d))
            out[f"{name}-{short}-grid"] = (fn, lambda d=dtype: _grid(d))
    for dtype in (torch.complex64, torch.complex128):
        short = str(dtype).removeprefix("torch.")
        for name, fn in COMPLEX_PROGRAMS.items():
            out[f"{name}-{short}"] = (fn, lambda d=dtype: _complex(d))
    return out


PROGRAMS = _programs()
# a fast sample: one program of each kind per type family; the whole table runs under slow
FAST = [f"{n}-{d}" for d in ("uint16", "uint32", "uint64", "int8")
        for n in ("add", "mul_float", "rshift_t", "sum", "to_f32", "from_float", "trunc_div", "fmod_t", "sort")]
FAST += [f"{n}-{d}" for d in ("complex64", "complex128")
         for n in ("div", "abs", "angle", "imag_view", "sum0", "conj_mul", "view_as_real", "sgn")]


def _outcome(fn: Callable[..., Any], args: list) -> tuple:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc))


def _flat(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _same(got: Any, want: Any) -> None:
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            assert g == w
            continue
        assert (g.dtype, g.shape, g.is_conj()) == (w.dtype, w.shape, w.is_conj())
        if w.numel() > 1:
            assert g.stride() == w.stride()
        if w.is_floating_point() or w.is_complex():
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert torch.equal(g.view(torch.int64) if g.dtype == torch.uint64 else g,
                               w.view(torch.int64) if w.dtype == torch.uint64 else w)


def _check(name: str, dynamic: bool) -> None:
    fn, make = PROGRAMS[name]
    args = make()
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    want, got = _outcome(fn, [a.clone() for a in args]), _outcome(compiled, [a.clone() for a in args])
    assert got[0] == want[0] and (want[0] == "ok" or got[1] is want[1]), (got, want)
    if want[0] == "ok":
        assert kiln.stats()["fallbacks"] == 0
        _same(got[1], want[1])


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", FAST)
def test_program_matches_eager(name: str, dynamic: bool) -> None:
    _check(name, dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - set(FAST)))
def test_program_sweep_matches_eager(name: str, dynamic: bool) -> None:
    _check(name, dynamic)


@pytest.mark.parametrize("dtype", WIDE_UNSIGNED)
def test_wide_unsigned_division_raises_as_eager(dtype: torch.dtype) -> None:
    a, b = _grid(dtype)
    for fn in DIVISIONS.values():
        with pytest.raises(NotImplementedError):
            fn(a, b)
        kiln.reset()
        with pytest.raises(NotImplementedError, match="not implemented for 'UInt"):
            kiln.compile(fn)(a, b)


# -- 3. strides of size-1 dims ------------------------------------------------------------------

def _strided_views() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(3, 129, generator=g)[1:2, :7],
            torch.randn(3, 129, generator=g)[:, 5:6],
            torch.randn(4, 1, 6, generator=g)[:, :, 1:5],
            torch.randn(5, 9, generator=g).t()[2:3],
            torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)[:1]]


COPIES: dict[str, Callable[[torch.Tensor], Any]] = {
    "to_float64": lambda x: x.to(torch.float64), "bool": lambda x: x.bool(), "clone": lambda x: x.clone(),
    "to_int32": lambda x: (x * 10).to(torch.int32), "half": lambda x: (-x).half(), "mul": lambda x: x * 2,
    "two": lambda x: (x.double(), x.bool()), "relu": lambda x: x.relu(),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("op", list(COPIES))
def test_copies_keep_eager_strides_of_size_one_dims(op: str, dynamic: bool) -> None:
    fn = COPIES[op]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    for x in _strided_views():
        got, want = _flat(compiled(x)), _flat(fn(x))
        for g, w in zip(got, want):
            assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride()), (tuple(x.shape), x.stride())
            assert torch.equal(g, w)
    assert kiln.stats()["fallbacks"] == 0


def test_to_dtype_strides_match_torch_compile() -> None:
    x = torch.randn(3, 129)[1:2, :7]
    fn = lambda x: (x.to(torch.float64), x.bool(), x.clone())  # noqa: E731
    kiln.reset()
    got = kiln.compile(fn)(x)
    oracle = torch.compile(fn, backend="eager")(x)
    assert [t.stride() for t in got] == [t.stride() for t in oracle] == [(129, 1)] * 3
