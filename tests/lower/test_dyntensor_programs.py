"""Tensor semantics of small programs through the default pipeline (capture, AOT, C++), against eager.

Each program runs eagerly and compiled (static, and dynamic=True for a sample) on clones of the same
arguments: the same exception type, or outputs with eager's dtype, shape, strides (where eager gives
a dense layout) and values (NaN positions included), and the arguments left as eager leaves them.
With requires_grad inputs the gradients are compared too.

The class that was wrong: integer division by a divisor equal to the type's all-ones pattern. The
C++ helpers of truncating division and fmod tested `b == (T)-1` to avoid the one overflowing
quotient of signed types; for uint8, (uint8_t)-1 is 255, so `torch.fmod(a, 255)` gave 0 instead of
`a` and `torch.div(a, 255, rounding_mode="trunc")` gave the wrapped negation of `a`.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln

T = torch.tensor


def _ints() -> tuple:
    return (T([-7, -3, 0, 3, 7, 100]),)


def _ints2() -> tuple:
    return (T([-7, -3, 5, 3, 7, 100]), T([2, -2, 3, -4, 7, 3]))


def _u8_all_ones() -> tuple:
    return (T([113, 250, 0, 255, 26, 7], dtype=torch.uint8), T([255, 255, 255, 255, 3, 255], dtype=torch.uint8))


def _u8_wide() -> tuple:  # a vectorized loop with a tail
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (37, 129), generator=g, dtype=torch.uint8)
    b = torch.randint(1, 256, (37, 129), generator=g, dtype=torch.uint8)
    b[::3, ::5] = 255
    return (a, b)


def _i8() -> tuple:
    return (T([100, 120, -128, 127, 5, -1], dtype=torch.int8), T([-1, 3, -1, -1, -2, 7], dtype=torch.int8))


def _floats() -> tuple:
    return (T([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, float("nan"), float("inf"), -float("inf")]),)


def _f() -> tuple:
    return (torch.randn(4, 5, generator=torch.Generator().manual_seed(2)),)


def _f3() -> tuple:
    return (torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3)),)


def _bools() -> tuple:
    return (T([True, False, True, False]), T([True, True, False, False]))


def _channels_last() -> tuple:
    return (torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(4)).to(memory_format=torch.channels_last),)


def _oob_index() -> tuple:
    return (torch.randn(5, 4), T([0, 5, 2]))


def _same_twice() -> tuple:
    x = torch.randn(4, 5)
    return (x, x)


def _offset_view() -> tuple:
    return (torch.randn(30)[7:27].view(4, 5),)


def _mutate_input(a: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return a * 2


def _mutate_both_aliases(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.mul_(2)
    a.add_(1)
    return a * b


def _out_resized(a: torch.Tensor) -> torch.Tensor:
    o = torch.empty(0)
    torch.exp(a, out=o)
    return o


Program = tuple[Callable[..., Any], Callable[[], tuple]]
PROGRAMS: dict[str, Program] = {
    # integer division by the all-ones pattern of an unsigned type (the bug fixed here)
    "u8_fmod_by_255": (lambda a, b: torch.fmod(a, b), _u8_all_ones),
    "u8_div_trunc_by_255": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), _u8_all_ones),
    "u8_remainder_by_255": (lambda a, b: a % b, _u8_all_ones),
    "u8_floordiv_by_255": (lambda a, b: a // b, _u8_all_ones),
    "u8_fmod_wide": (lambda a, b: torch.fmod(a, b), _u8_wide),
    "u8_div_trunc_wide": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), _u8_wide),
    "u8_fmod_scalar_255": (lambda a, b: torch.fmod(a, 255), _u8_all_ones),
    # signed division by -1 (the minimum wraps) and by zero (eager raises)
    "i8_fmod_by_minus_one": (lambda a, b: torch.fmod(a, b), _i8),
    "i8_div_trunc_by_minus_one": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), _i8),
    "i8_floordiv": (lambda a, b: a // b, _i8),
    "int_floordiv_zero": (lambda a: a // 0, _ints),
    "int_remainder_zero_tensor": (lambda a, b: a % (b * 0), _ints2),
    "int_floordiv_negative": (lambda a, b: a // b, _ints2),
    "int_remainder_negative": (lambda a, b: a % b, _ints2),
    "float_floordiv_zero": (lambda a: a // 0.0, _floats),
    # type promotion with Python scalars and 0-dim tensors
    "int_times_float": (lambda a: a * 1.5, _ints),
    "int_times_0dim_double": (lambda a: a * T(2.5, dtype=torch.float64), _ints),
    "int8_plus_0dim_int64": (lambda a, b: a * T(300), _i8),
    "bool_plus_int": (lambda a, b: a + 1, _bools),
    "bool_sub_raises": (lambda a, b: a - b, _bools),
    "uint8_sum_is_int64": (lambda a, b: a.sum(), _u8_all_ones),
    "int_mean_raises": (lambda a: a.mean(), _ints),
    # bitwise, shifts, comparisons with NaN, clamp
    "shift_left_past_width": (lambda a: a << 65, _ints),
    "int8_shift_left": (lambda a, b: a << 3, _i8),
    "nan_compare": (lambda a: (a == a, a < 1.0, a >= float("inf")), _floats),
    "maximum_nan": (lambda a: torch.maximum(a, a.flip(0)), _floats),
    "clamp_min_only": (lambda a: a.clamp(min=0.1), _floats),
    "clamp_int_float_bounds": (lambda a: a.clamp(-2.5, 3.5), _ints),
    "argmax_nan": (lambda a: a.argmax(), _floats),
    "int_min_abs": (lambda a: (a * 0 + torch.iinfo(torch.int64).min).abs(), _ints),
    # indexing with bounds checks
    "index_out_of_range": (lambda a, i: a[i], _oob_index),
    "gather_out_of_range": (lambda a: a.gather(1, T([[0, 5]])), _f),
    "scatter_add_out_of_range": (lambda a: a.scatter_add(0, T([[4, 0]]), torch.ones(1, 2)), _f),
    "index_add_negative": (lambda a: a.index_add(0, T([0, -1]), torch.ones(2, 5)), _f),
    "index_put_accumulate_duplicates": (lambda a: a.index_put((T([0, 0, 1]), T([2, 2, -1])), T([1., 2, 3]),
                                                              accumulate=True), _f),
    "expand_then_inplace_raises": (lambda a: a[:1].expand(4, 5).add_(1), _f),
    # views, aliasing, out=
    "mutate_offset_view_input": (_mutate_input, _offset_view),
    "mutate_same_tensor_twice": (_mutate_both_aliases, _same_twice),
    "out_resized": (_out_resized, _f),
    "unfold_overlapping": (lambda a: a.unfold(1, 3, 1).sum(-1), _f),
    # constructors, casts, layouts, reductions
    "arange_float_step": (lambda a: torch.arange(-1.5, 2.3, 0.7) + a[0, 0], _f),
    "tensor_of_0dim_tensors": (lambda a: torch.tensor([a[0, 0], a[1, 1]]), _f),
    "cast_chain": (lambda a: (a * 1000).to(torch.int32).to(torch.int8).to(torch.float64), _f),
    "channels_last_pointwise": (lambda a: a.relu() * 2, _channels_last),
    "channels_last_keepdim_sum": (lambda a: a.sum(1, keepdim=True), _channels_last),
    "empty_dim_amax_raises": (lambda a: a[:0].amax(0), _f),
    "sum_dim_empty_list": (lambda a: a.sum(dim=[]), _f3),
    "var_negative_dims": (lambda a: a.var((0, -1), correction=0, keepdim=True), _f3),
}

DYNAMIC = ["u8_fmod_by_255", "u8_div_trunc_wide", "i8_div_trunc_by_minus_one", "int_floordiv_negative",
           "index_out_of_range", "channels_last_pointwise", "mutate_offset_view_input"]
GRAD = ["maximum_nan", "unfold_overlapping", "channels_last_keepdim_sum", "var_negative_dims",
        "index_put_accumulate_duplicates"]


def _clone(args: tuple, requires_grad: bool) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone() if a._base is None else \
                a._base.detach().clone().as_strided(a.size(), a.stride(), a.storage_offset())
            if requires_grad and c.is_floating_point():
                c.requires_grad_(True)
            out.append(c)
        else:
            out.append(a)
    if len(args) == 2 and args[0] is args[1]:
        out[1] = out[0]  # the same tensor passed twice stays one tensor
    return out


def _outcome(fn: Callable[..., Any], args: list) -> tuple:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc))


def _tensors(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value]


def _same(got: Any, want: Any) -> None:
    got, want = _tensors(got), _tensors(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            assert g == w
            continue
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if w.numel() > 1:
            assert g.stride() == w.stride()
        if w.is_floating_point() or w.is_complex():
            torch.testing.assert_close(g.detach(), w.detach(), equal_nan=True)
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def _check(name: str, dynamic: bool, requires_grad: bool) -> None:
    fn, make = PROGRAMS[name]
    args = make()
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    eager_args, kiln_args = _clone(args, requires_grad), _clone(args, requires_grad)
    with torch.set_grad_enabled(requires_grad):
        want, got = _outcome(fn, eager_args), _outcome(compiled, kiln_args)
    assert got[0] == want[0] and (want[0] == "ok" or got[1] is want[1]), (got, want)
    assert kiln.stats()["fallbacks"] == 0
    if want[0] != "ok":
        return
    _same(got[1], want[1])
    _same(kiln_args, eager_args)
    if requires_grad:
        leaves_w = [a for a in eager_args if isinstance(a, torch.Tensor) and a.requires_grad]
        leaves_g = [a for a in kiln_args if isinstance(a, torch.Tensor) and a.requires_grad]
        outs_w = [t for t in _tensors(want[1]) if isinstance(t, torch.Tensor) and t.requires_grad]
        outs_g = [t for t in _tensors(got[1]) if isinstance(t, torch.Tensor) and t.requires_grad]
        assert len(outs_g) == len(outs_w) > 0
        weight = [torch.arange(o.numel()).reshape(o.shape) % 3 + 1 for o in outs_w]
        loss_w = torch.stack([(o * k).sum() for o, k in zip(outs_w, weight)]).sum()
        loss_g = torch.stack([(o * k).sum() for o, k in zip(outs_g, weight)]).sum()
        grads_w = torch.autograd.grad(loss_w, leaves_w)
        grads_g = torch.autograd.grad(loss_g, leaves_g)
        for g, w in zip(grads_g, grads_w):
            torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_static_matches_eager(name: str) -> None:
    _check(name, dynamic=False, requires_grad=False)


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_matches_eager(name: str) -> None:
    _check(name, dynamic=True, requires_grad=False)


@pytest.mark.parametrize("name", GRAD)
def test_requires_grad_matches_eager(name: str) -> None:
    _check(name, dynamic=False, requires_grad=True)


_INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
_DIVISIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "fmod": lambda a, b: torch.fmod(a, b), "remainder": lambda a, b: a % b, "floor_divide": lambda a, b: a // b,
              "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
              "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor")}


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(_DIVISIONS))
@pytest.mark.parametrize("dtype", _INT_DTYPES, ids=str)
def test_integer_division_by_every_extreme_divisor(dtype: torch.dtype, op: str) -> None:
    """Every divisor at the edges of the type (min, -1, 1, max, the all-ones pattern) against every
    dividend at the edges, in a loop long enough to be vectorized."""
    info = torch.iinfo(dtype)
    edges = sorted({info.min, info.min + 1, -1 if info.min < 0 else 1, 1, 2, info.max - 1, info.max, 7})
    a = T(edges, dtype=dtype).repeat_interleave(len(edges)).repeat(5)
    b = T(edges, dtype=dtype).repeat(len(edges)).repeat(5)
    b[b == 0] = 1  # a zero divisor raises (tested above)
    if op == "div_trunc" and dtype in (torch.int32, torch.int64):
        a[(a == info.min) & (b == -1)] = info.min + 1  # eager's own kernel traps (SIGFPE) on this one
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _DIVISIONS[op]
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn)(a, b), fn(a, b), rtol=0, atol=0)


# One dynamic graph called on a sequence of shapes, the last with an empty dim: a column reduction
# whose tile width was the known size of its last outer dim made `int nan_buf[0] = {0}` (and
# `acc[0]`) for a size-0 tensor, which g++ refuses: the graph fell back to eager with a warning.
SHAPE_SEQUENCE = [(37, 129), (5, 3), (1, 7), (9, 1), (3, 0)]
SEQUENCED: dict[str, Callable[[torch.Tensor], Any]] = {
    "amax_dim0": lambda a: a.amax(0),
    "max_dim0_values_indices": lambda a: a.max(0),
    "half_amin_dim0": lambda a: a.half().amin(0),
    "sum_dim0": lambda a: a.sum(0),
    "argmax_dim0": lambda a: a.argmax(0),
}


@pytest.mark.parametrize("name", sorted(SEQUENCED))
def test_dynamic_graph_over_shapes_down_to_empty(name: str) -> None:
    fn = SEQUENCED[name]
    base = torch.randn(37, 129, generator=torch.Generator().manual_seed(5))
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows, cols in SHAPE_SEQUENCE:
        x = base[:rows, :cols].contiguous()
        want, got = _outcome(fn, [x]), _outcome(compiled, [x])
        assert got[0] == want[0] and (want[0] == "ok" or got[1] is want[1]), ((rows, cols), got, want)
        if want[0] == "ok":
            _same(got[1], want[1])
    assert kiln.stats()["fallbacks"] == 0
