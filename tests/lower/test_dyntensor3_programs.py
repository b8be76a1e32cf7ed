"""In-place ops reading their own target, *_like/copies of views, and views with offsets, through
the default pipeline (capture, AOT, C++) against eager.

Classes that were wrong:
1. An in-place op or out= reading the memory it writes through another tensor that eager does not
   refuse (an expand, a diagonal, a column: `x.mul_(x[:, :1])`, `x.sub_(x.diagonal())`) is computed
   by eager element by element, a later element reading what an earlier one wrote; the functional
   graph read every element first (wrong values). An op handed its own output as an operand
   (`x.scatter_(0, i, x)`, `x.index_put_((i,), x)`, `torch.take(x, i, out=x)`,
   `x.masked_scatter_(m, x)`, `torch.bmm(x, x, out=x)`) either raised in eager and not in Kiln, or
   gave eager's order of reads there. Now a graph break (kiln.capture.aliased_reads): eager runs it.
2. A write into a dynamic=True input whose own stride makes its elements overlap
   (`x.unfold(0, 4, 3).add_(1)`) was compiled (the overlap test took symbolic strides as apart);
   the static capture broke. Now decided on the example values, with guards.
3. A view made under no_grad whose base was then written in place (eager refuses to read its
   is_leaf/grad_fn) reaching a resumed frame was an internal error (a KilnWarning); now a quiet
   Unsupported frame that runs eagerly.
4. Empty outputs had strides (0, 1) for (4, 0); torch's contiguous strides count a size-0 dim as 1.
Left as the meta kernels and torch.compile's inductor give them (not eager's CPU kernels): the
strides of size-1 dims and of empty tensors of *_like/pointwise outputs of such views
(`torch.zeros_like(torch.randn(1, 5).t())`: eager (1, 5), meta/inductor/Kiln (1, 1)).
"""
from __future__ import annotations

import itertools
import warnings
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.log import KilnWarning

I = torch.tensor  # noqa: E741 - index tensors


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _outcome(fn: Callable[..., Any], args: list) -> tuple:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc))


def _flat(v: Any) -> list:
    return [t for x in v for t in _flat(x)] if isinstance(v, (tuple, list)) else [v]


def _same_values(got: Any, want: Any) -> None:
    for g, w in zip(_flat(got), _flat(want), strict=True):
        if isinstance(w, torch.Tensor):
            assert (g.dtype, g.shape) == (w.dtype, w.shape)
            torch.testing.assert_close(g.detach(), w.detach(), equal_nan=True)
        else:
            assert g == w


# ---------------------------------------------------------------------------------------- class 1
# Each program takes one tensor x (the argument, cloned for eager and for Kiln) and writes it.
OVERLAP: dict[str, tuple[Callable[[torch.Tensor], Any], Callable[[], torch.Tensor]]] = {
    # eager refuses (dense layouts meeting at other places)
    "shift_add": (lambda x: x[1:].add_(x[:-1]), lambda: _r(6, 3)),
    "mul_t_square": (lambda x: x.mul_(x.t()), lambda: _r(4, 4)),
    "copy_shift": (lambda x: x[1:].copy_(x[:-1]), lambda: _r(7)),
    "sub_out_shift": (lambda x: torch.sub(x[1:], x[:-1], out=x[:-1]), lambda: _r(6)),
    "div_row0_broadcast": (lambda x: x.div_(x[0]), lambda: _r(3, 3)),
    "setitem_shifted": (lambda x: x.__setitem__(slice(0, 3), x[1:4]) or x, lambda: _r(6)),
    # eager refuses: the op's operand is its output itself
    "scatter_self_src": (lambda x: x.scatter_(0, I([[1, 0, 2]]), x), lambda: _r(3, 3)),
    "scatter_add_self": (lambda x: x.scatter_add_(0, I([1, 0, 2]), x), lambda: _r(3)),
    "index_put_self": (lambda x: x.index_put_((I([1, 0, 2]),), x), lambda: _r(3)),
    "index_put_acc_self": (lambda x: x.index_put_((I([1, 0, 2]),), x, accumulate=True), lambda: _r(3)),
    "index_put_rows_of_self": (lambda x: x.index_put_((I([0, 2]),), x[1:3]), lambda: _r(4, 3)),
    "index_copy_self": (lambda x: x.index_copy_(0, I([1, 0, 2]), x), lambda: _r(3, 2)),
    "index_add_self": (lambda x: x.index_add_(0, I([1, 0, 2]), x), lambda: _r(3, 2)),
    "put_self": (lambda x: x.put_(I([1, 0, 2]), x), lambda: _r(3)),
    "take_out_self": (lambda x: torch.take(x, I([2, 0, 1]), out=x), lambda: _r(3)),
    "index_select_out_self": (lambda x: torch.index_select(x, 0, I([2, 0, 1]), out=x), lambda: _r(3)),
    "gather_out_self": (lambda x: torch.gather(x, 0, I([2, 0, 1]), out=x), lambda: _r(3)),
    "setitem_tensor_index_self": (lambda x: x.__setitem__(I([1, 0, 2]), x) or x, lambda: _r(3)),
    # eager computes element by element in its own order (no error): eager's values
    "mul_row0_expand": (lambda x: x.mul_(x[:1].expand(4, 4)), lambda: _r(4, 4)),
    "mul_col0": (lambda x: x.mul_(x[:, :1]), lambda: _r(3, 3)),
    "add_col0_broadcast": (lambda x: x.add_(x[:, 0]), lambda: _r(3, 3)),
    "add_diag_row": (lambda x: x.add_(x.diagonal().unsqueeze(0)), lambda: _r(4, 4)),
    "sub_diag": (lambda x: x.sub_(x.diagonal()), lambda: _r(3, 3)),
    "add_col_shift": (lambda x: (x[:, 1:].add_(x[:, :-1]), x * 2)[1], lambda: _r(6, 8)),
    "addcdiv_col_expand": (lambda x: x.addcdiv_(x[:, :1].expand(3, 3), x), lambda: _r(3, 3).abs() + 1),
    "masked_scatter_self": (lambda x: x.masked_scatter_(x > 0, x), lambda: _r(8)),
    "masked_scatter_self_fixed_mask": (lambda x: x.masked_scatter_(I([0, 1, 0, 1, 1, 0, 1, 1]).bool(), x),
                                       lambda: _r(8)),
    "bmm_out_self": (lambda x: torch.bmm(x, x, out=x), lambda: _r(2, 3, 3)),
    "clamp_min_diag_col": (lambda x: x.clamp_(min=x.diagonal().unsqueeze(1)), lambda: _r(3, 3)),
    "copy_row0_expand": (lambda x: x.copy_(x[:1].expand(3, 3)), lambda: _r(3, 3)),
    "where_out_expand": (lambda x: torch.where(x > 0, x[:1].expand(3, 3), x, out=x), lambda: _r(3, 3)),
    "mv_out_row": (lambda x: torch.mv(x, x[0], out=x[1]), lambda: _r(3, 3)),
    # the graph computes what eager does (no break needed): full aliases, disjoint views, copies
    "add_flip_copy": (lambda x: x.add_(x.flip(0)), lambda: _r(5, 4)),
    "add_self": (lambda x: x.add_(x), lambda: _r(4, 4)),
    "mul_self_iop": (lambda x: x.__imul__(x), lambda: _r(4, 4)),
    "view_add_same_elements": (lambda x: x.view(-1).add_(x.reshape(-1), alpha=2), lambda: _r(3, 3)),
    "where_out_self": (lambda x: torch.where(x > 0, x.flip(0), x, out=x), lambda: _r(5)),
    "clamp_out_self": (lambda x: torch.clamp(x.flip(0), -0.5, 0.5, out=x), lambda: _r(5)),
    "cumsum_out_self": (lambda x: torch.cumsum(x, 0, out=x), lambda: _r(5, 3)),
    "cumprod_out_self": (lambda x: torch.cumprod(x, 0, out=x), lambda: _r(5, 3)),
    "logcumsumexp_out_self": (lambda x: torch.logcumsumexp(x, 0, out=x), lambda: _r(5)),
    "cummax_out_self": (lambda x: torch.cummax(x, 0, out=(x, torch.empty(5, dtype=torch.long))), lambda: _r(5)),
    "mm_out_self": (lambda x: torch.mm(x, x, out=x), lambda: _r(3, 3)),
    "addmm_out_self": (lambda x: torch.addmm(x, x, x, out=x), lambda: _r(3, 3)),
    "sort_out_self": (lambda x: torch.sort(x, out=(x, torch.empty(5, dtype=torch.long))), lambda: _r(5)),
    "add_even_odd": (lambda x: x[::2].add_(x[1::2]), lambda: _r(6)),
    "mul_col0_by_col1": (lambda x: (x[:, 0].mul_(x[:, 1]), x + 1)[1], lambda: _r(6, 8)),
    "add_col_halves": (lambda x: (x[:, :x.shape[1] // 2].add_(x[:, x.shape[1] // 2:]), x * 2)[1], lambda: _r(6, 8)),
    "add_disjoint_strided": (lambda x: x[:4:2].add_(x[1::3][:2]), lambda: _r(6)),
    "setitem_even_from_odd": (lambda x: x.__setitem__(slice(None, None, 2), x[1::2]) or x, lambda: _r(6)),
    "index_fill_row0": (lambda x: x.index_fill_(0, I([1]), x[0]), lambda: _r(3)),
    "masked_fill_x0": (lambda x: x.masked_fill_(x > 0, x[0]), lambda: _r(5)),
    "lerp_flip": (lambda x: x.lerp_(x.flip(0), 0.5), lambda: _r(6)),
    "getitem_iadd": (lambda a: a.__setitem__(I([2, 0, 1]), a[I([2, 0, 1])] + a) or a, lambda: _r(3, 2)),
    "unfold_window_add": (lambda x: x[:3].add_(x.unfold(0, 3, 1)[3]), lambda: _r(6)),
}
OVERLAP_CI = ["shift_add", "scatter_self_src", "take_out_self", "mul_col0", "sub_diag", "add_col_shift",
              "masked_scatter_self",
              "bmm_out_self", "add_self", "cumsum_out_self", "add_even_odd"]


def _check_overlap(name: str, dynamic: bool, requires_grad: bool = False) -> None:
    """With requires_grad, x is a non-leaf copy of a leaf: the gradient reaching the leaf through the
    write (or eager's error that the write overwrote a saved tensor) is compared too."""
    fn, make = OVERLAP[name]
    x = make()
    leaf_w, leaf_g = x.clone().requires_grad_(requires_grad), x.clone().requires_grad_(requires_grad)
    want_x, got_x = (leaf_w.clone(), leaf_g.clone()) if requires_grad else (leaf_w, leaf_g)
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        want, got = _outcome(fn, [want_x]), _outcome(compiled, [got_x])
    assert got[0] == want[0] and (want[0] == "ok" or got[1] is want[1]), (got, want)
    if want[0] != "ok":
        return
    _same_values(got[1], want[1])
    torch.testing.assert_close(got_x, want_x)
    if requires_grad:
        weight = torch.arange(x.numel()).reshape(x.shape) % 3 + 1
        grad_w = _outcome(lambda: torch.autograd.grad((want_x * weight).sum(), leaf_w), [])
        grad_g = _outcome(lambda: torch.autograd.grad((got_x * weight).sum(), leaf_g), [])
        assert grad_g[0] == grad_w[0] and (grad_w[0] == "ok" or grad_g[1] is grad_w[1]), (grad_g, grad_w)
        if grad_w[0] == "ok":
            torch.testing.assert_close(grad_g[1], grad_w[1])


@pytest.mark.parametrize("name", OVERLAP_CI)
def test_overlapping_write_matches_eager(name: str) -> None:
    _check_overlap(name, dynamic=False)


def test_overlapping_write_with_requires_grad_matches_eager() -> None:
    _check_overlap("mul_col0", dynamic=False, requires_grad=True)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,requires_grad", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("name", sorted(OVERLAP))
def test_overlapping_write_sweep(name: str, dynamic: bool, requires_grad: bool) -> None:
    if requires_grad and not OVERLAP[name][1]().is_floating_point():
        pytest.skip("integer tensors do not require grad")
    _check_overlap(name, dynamic, requires_grad)


def test_full_alias_of_elementwise_and_disjoint_views_stay_in_one_graph() -> None:
    def f(x):
        x.add_(x)
        torch.cumsum(x, 0, out=x)
        x[::2].mul_(x[1::2])
        return x.sum()

    x = _r(6)
    want = f(x.clone())
    kiln.reset()
    compiled = kiln.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x.clone()), want)
    assert kiln.stats()["graphs"] == 1


def test_dynamic_sibling_slices_stay_in_one_graph_and_shift_breaks() -> None:
    """Under dynamic=True the views' strides and offsets are symbols: column halves, even and odd
    rows, two columns are proven apart (with guards) and stay in the graph; a shifted column is not
    and runs eagerly (it gave the functional, not eager's, values before, static and dynamic)."""
    def apart(x):
        h = x.shape[1] // 2
        x[:, :h].add_(x[:, h:])
        x[::2].mul_(x[1::2])
        x[:, 0].sub_(x[:, 1])
        return x * 2

    def shifted(x):
        x[:, 1:].add_(x[:, :-1])
        return x * 2

    for shape in [(6, 8), (4, 10)]:
        x = _r(*shape)
        kiln.reset()
        torch.testing.assert_close(kiln.compile(apart, dynamic=True, fullgraph=True)(x.clone()), apart(x.clone()))
        kiln.reset()
        torch.testing.assert_close(kiln.compile(shifted, dynamic=True)(x.clone()), shifted(x.clone()))
        assert kiln.stats()["graph_breaks"] == 1


# ---------------------------------------------------------------------------------------- class 2
VIEWS: dict[str, Callable[[], torch.Tensor]] = {
    "transposed": lambda: _r(5, 6).t(),
    "permuted": lambda: _r(4, 6, 5).permute(2, 0, 1),
    "sliced_inner": lambda: _r(4, 6, 5)[:, :, 1:4],
    "sliced_outer": lambda: _r(4, 6, 5)[1:3],
    "stepped": lambda: _r(4, 6, 5)[:, ::2],
    "expanded": lambda: _r(1, 5).expand(4, 5),
    "channels_last": lambda: _r(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "channels_last_sliced": lambda: _r(2, 3, 4, 5).to(memory_format=torch.channels_last)[:, 1:],
    "channels_last_3d": lambda: _r(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d),
    "offset": lambda: _r(40)[5:35].view(5, 6),
    "empty": lambda: _r(4, 0),
    "empty_3d": lambda: _r(3, 0, 5),
    "diagonal": lambda: _r(5, 5).diagonal(),
    "unfolded": lambda: _r(10).unfold(0, 3, 2),
    "as_strided_offset": lambda: _r(30).as_strided((3, 4), (1, 5), 2),
    "scalar": lambda: _r(),
    "permuted_sliced": lambda: _r(4, 6, 5).permute(1, 2, 0)[1:],
    "int_transposed": lambda: torch.arange(20).view(4, 5).t(),
}
COPIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like_plus": lambda x: torch.ones_like(x) + x,
    "full_like": lambda x: torch.full_like(x, 3),
    "empty_like_fill": lambda x: torch.empty_like(x).fill_(2),
    "rand_like_times_0": lambda x: torch.rand_like(x.float()) * 0,
    "clone": lambda x: x.clone(),
    "clone_contiguous_format": lambda x: x.clone(memory_format=torch.contiguous_format),
    "contiguous": lambda x: x.contiguous(),
    "to_float64": lambda x: x.to(torch.float64),
    "to_float16": lambda x: x.to(torch.float16),
    "zeros_like_int32": lambda x: torch.zeros_like(x, dtype=torch.int32),
    "zeros_like_contiguous_format": lambda x: torch.zeros_like(x, memory_format=torch.contiguous_format),
    "times_2": lambda x: x * 2,
    "empty_like_copy_plus_1": lambda x: torch.empty_like(x).copy_(x) + 1,
}
COPIES_CI = [("transposed", "zeros_like"), ("channels_last_sliced", "clone"), ("empty", "times_2"),
             ("stepped", "empty_like_fill"), ("offset", "rand_like_times_0")]


def _check_copy(view: str, op: str, dynamic: bool) -> None:
    x, fn = VIEWS[view](), COPIES[op]
    want = fn(x)
    kiln.reset()
    got = kiln.compile(fn, dynamic=dynamic)(x)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    torch.testing.assert_close(got, want)
    # eager's strides where they decide the layout; dims of size 1 and empty tensors follow the meta
    # kernels (as torch.compile's inductor does), compared there with the meta's answer
    meta = fn(x.to("meta"))
    assert got.stride() == (want.stride() if want.numel() > 0 and 1 not in want.shape else meta.stride())
    for layout in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
        if layout == torch.contiguous_format or got.dim() == (4 if layout == torch.channels_last else 5):
            assert got.is_contiguous(memory_format=layout) == want.is_contiguous(memory_format=layout)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("view,op", COPIES_CI)
def test_copy_of_view_keeps_eager_layout(view: str, op: str) -> None:
    _check_copy(view, op, dynamic=False)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("view,op", list(itertools.product(sorted(VIEWS), sorted(COPIES))))
def test_copy_of_view_sweep(view: str, op: str, dynamic: bool) -> None:
    x = VIEWS[view]()
    try:
        COPIES[op](x)
    except RuntimeError:
        pytest.skip("eager refuses this op on this view")
    _check_copy(view, op, dynamic)


# ---------------------------------------------------------------------------------------- class 3
# float16/bfloat16: eager rounds after each op; Kiln (as torch.compile's inductor) keeps float32
# inside a fused kernel, so a chain may differ from eager by an ulp of the result or more, while
# each single op equals eager bit for bit (the scalars rounded as eager's kernels round them).
# Measured on a (64, 257) randn input, max |result - float64 result| (eager / Kiln / inductor, CPU):
# float16 ((x*1.1+0.3).sin()*x-0.7).tanh() 4.3e-3 / 4.4e-4 / 2.4e-4; eight `+ 0.1` 1.3e-2 / 1.2e-3 /
# 1.2e-3; gelu(x*sigmoid(x))*1.7 4.6e-3 / 1.9e-3 / 1.9e-3; bfloat16 the same chains 2.9e-2 / 3.6e-3 /
# 2.0e-3, 5.0e-2 / 1.3e-2 / 1.3e-2, 3.7e-2 / 1.5e-2 / 1.5e-2. Max |Kiln - eager| equals max
# |inductor - eager| on 11 of 14 chains (a softmax, a manual layer norm, a sum of squares included),
# is half of it on one (float16 layer norm) and one ulp above it on the sin/tanh chain in both dtypes. Kiln rounds a Python scalar to the half dtype as
# eager's add does (its mean error on the eight adds, 2.8e-4, is eager's scalar, not its
# per-op rounding: inductor adds 0.1 unrounded, 1.9e-4). Nothing to fix there.
SINGLE_HALF_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add_scalar": lambda x, y: x + 0.1, "mul_scalar": lambda x, y: x * 1.1, "div_scalar": lambda x, y: x / 3.3,
    "rsub_scalar": lambda x, y: 0.7 - x, "add_alpha": lambda x, y: torch.add(x, y, alpha=0.3),
    "sub_alpha": lambda x, y: torch.sub(x, y, alpha=0.3), "rsub_alpha": lambda x, y: torch.rsub(x, y, alpha=0.3),
    "add_alpha_inplace": lambda x, y: x.clone().add_(y, alpha=0.3), "where_scalar": lambda x, y: torch.where(x > 0, x, 0.1),
    "clamp": lambda x, y: x.clamp(0.1, 0.7), "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.3),
    "lerp": lambda x, y: torch.lerp(x, y, 0.3),
}


@pytest.mark.parametrize("name,dtype", [("add_alpha", torch.float16), ("add_alpha", torch.bfloat16),
                                        ("sub_alpha", torch.float16), ("rsub_alpha", torch.bfloat16)], ids=str)
def test_single_half_op_equals_eager(name: str, dtype: torch.dtype) -> None:
    """`torch.add(x, y, alpha=0.3)` of float16 multiplied by 0.3 unrounded: 3.8% of a (64, 257)
    float16 output (10.8% of bfloat16) an ulp from eager, which multiplies by alpha in x's dtype."""
    x, y = _r(64, 257, seed=0).to(dtype), _r(64, 257, seed=1).to(dtype)
    fn = SINGLE_HALF_OPS[name]
    kiln.reset()
    assert torch.equal(kiln.compile(fn)(x, y), fn(x, y))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(SINGLE_HALF_OPS))
def test_single_half_op_sweep(name: str, dtype: torch.dtype) -> None:
    x, y = _r(64, 257, seed=0).to(dtype), _r(64, 257, seed=1).to(dtype)
    fn = SINGLE_HALF_OPS[name]
    kiln.reset()
    assert torch.equal(kiln.compile(fn)(x, y), fn(x, y))


HALF_CHAINS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mul_add_sin_tanh": lambda x: ((x * 1.1 + 0.3).sin() * x - 0.7).tanh(),
    "exp_div_sqrt": lambda x: (x.exp() / (1 + x * x)).sqrt() * 3.3,
    "eight_adds": lambda x: x + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1,
    "gelu_of_silu": lambda x: torch.nn.functional.gelu(x * torch.sigmoid(x)) * 1.7,
    "manual_layer_norm": lambda x: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5),
}


def _half_chain_cases() -> list:
    ci = {("eight_adds", torch.float16), ("mul_add_sin_tanh", torch.bfloat16), ("manual_layer_norm", torch.float16)}
    return [pytest.param(name, dtype, marks=() if (name, dtype) in ci else pytest.mark.slow, id=f"{name}-{dtype}")
            for name in sorted(HALF_CHAINS) for dtype in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("name,dtype", _half_chain_cases())
def test_half_chain_no_further_from_float64_than_eager(name: str, dtype: torch.dtype) -> None:
    """A chain kept in float32 is at least as close to the float64 result as eager's per-op rounding
    (mean and max), and within a few ulps of the result's magnitude of eager."""
    x = _r(64, 257).to(dtype)
    fn = HALF_CHAINS[name]
    ref, want = fn(x.double()), fn(x)
    kiln.reset()
    got = kiln.compile(fn)(x)
    assert got.dtype == want.dtype
    err_kiln, err_eager = (got.double() - ref).abs(), (want.double() - ref).abs()
    assert err_kiln.mean() <= err_eager.mean()
    assert err_kiln.max() <= err_eager.max()
    eps = torch.finfo(dtype).eps
    assert ((got.double() - want.double()).abs() <= 8 * eps * (1 + want.double().abs())).all()


# ---------------------------------------------------------------------------------------- class 4
def _base() -> torch.Tensor:
    return _r(6, 7, seed=1)


OFFSET_INPUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rows_from_2": lambda b: b[2:],
    "cols_from_1": lambda b: b[:, 1:],
    "diagonal": lambda b: b.diagonal(),
    "diagonal_offset": lambda b: b.diagonal(1),
    "unfold_overlapping": lambda b: b.reshape(-1).unfold(0, 4, 3),
    "unfold_overlapping_rows": lambda b: b.reshape(-1).unfold(0, 4, 3)[1:],
    "unfold_apart": lambda b: b.reshape(-1).unfold(0, 3, 4),
    "as_strided_offset": lambda b: b.as_strided((3, 4), (7, 2), 5),
    "as_strided_overlapping": lambda b: b.as_strided((12, 4), (3, 1), 2),
    "transposed_block": lambda b: b[1:5, 2:6].t(),
}
VIEW_PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "return_slice": lambda x: x[1:],
    "return_transpose": lambda x: x.t() if x.dim() == 2 else x.unsqueeze(0),
    "return_view_and_product": lambda x: (x[0], x * 2),
    "return_narrow": lambda x: x.narrow(-1, 1, 2),
    "return_expand": lambda x: x[..., :1].expand(*x.shape[:-1], 3),
    "return_two_views": lambda x: (x[:1], x[1:]),
    "inplace_row_returned": lambda x: x[0].mul_(2),
    "inplace_row_return_x": lambda x: (x[0].add_(1), x)[1],
    "inplace_whole": lambda x: x.add_(1),
    "inplace_then_sum": lambda x: (x.mul_(2), x.sum())[1],
    "setitem_row": lambda x: (x.__setitem__(0, 5.0), x * 1)[1],
    "view_after_write": lambda x: (x.add_(1), x[..., :2])[1],
}
VIEW_CI = [("cols_from_1", "inplace_row_return_x"), ("diagonal", "return_two_views"),
           ("as_strided_offset", "view_after_write"), ("transposed_block", "setitem_row")]


def _view_input(make: Callable[[torch.Tensor], torch.Tensor], requires_grad: bool) -> tuple:
    """(x, its base, the leaf the gradient reaches): x a view of a fresh base (of a leaf that
    requires grad when asked)."""
    leaf = _base().requires_grad_(requires_grad)
    base = leaf.clone() if requires_grad else leaf
    return make(base), base, leaf


def _check_view_program(inp: str, prog: str, dynamic: bool, requires_grad: bool, no_grad: bool) -> None:
    fn = VIEW_PROGRAMS[prog]
    x_e, base_e, leaf_e = _view_input(OFFSET_INPUTS[inp], requires_grad)
    x_k, base_k, leaf_k = _view_input(OFFSET_INPUTS[inp], requires_grad)
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    with torch.set_grad_enabled(not no_grad), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        want, got = _outcome(fn, [x_e]), _outcome(compiled, [x_k])
    assert got[0] == want[0] and (want[0] == "ok" or got[1] is want[1]), (got, want)
    if want[0] != "ok":
        return
    _same_values(got[1], want[1])
    torch.testing.assert_close(base_k.detach(), base_e.detach())
    for g, w in zip(_flat(got[1]), _flat(want[1]), strict=True):
        aliases = w.untyped_storage().data_ptr() == x_e.untyped_storage().data_ptr()
        assert (g.untyped_storage().data_ptr() == x_k.untyped_storage().data_ptr()) == aliases
        assert g.stride() == w.stride() and g.requires_grad == w.requires_grad
        if aliases:
            assert g.storage_offset() - x_k.storage_offset() == w.storage_offset() - x_e.storage_offset()
    if not requires_grad:  # a write through the returned view reaches the input, as eager's does
        g, w = _flat(got[1])[0], _flat(want[1])[0]
        if w.untyped_storage().data_ptr() == x_e.untyped_storage().data_ptr() and 0 not in w.stride():
            g.add_(100)
            w.add_(100)
            torch.testing.assert_close(base_k, base_e)
    elif not no_grad:
        outs = [(g, w) for g, w in zip(_flat(got[1]), _flat(want[1])) if w.requires_grad]
        if outs:
            loss_g = sum((g * (torch.arange(g.numel()).reshape(g.shape) % 3 + 1)).sum() for g, _ in outs)
            loss_w = sum((w * (torch.arange(w.numel()).reshape(w.shape) % 3 + 1)).sum() for _, w in outs)
            torch.testing.assert_close(torch.autograd.grad(loss_g, leaf_k)[0], torch.autograd.grad(loss_w, leaf_e)[0])


@pytest.mark.parametrize("inp,prog", VIEW_CI)
def test_offset_view_program_matches_eager(inp: str, prog: str) -> None:
    _check_view_program(inp, prog, dynamic=False, requires_grad=False, no_grad=False)


def test_overlapping_dynamic_input_write_breaks_as_static() -> None:
    """`x.as_strided((12, 4), (3, 1), 2).add_(1)` under dynamic=True was compiled: the rows share
    elements, eager adds twice where they meet; the graph added once."""
    _check_view_program("as_strided_overlapping", "inplace_whole", dynamic=True, requires_grad=False, no_grad=False)


def test_no_grad_view_of_written_base_reaches_resumed_frame_quietly() -> None:
    _check_view_program("as_strided_overlapping", "inplace_row_return_x", dynamic=False, requires_grad=True,
                        no_grad=True)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,requires_grad,no_grad", list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("inp,prog", list(itertools.product(sorted(OFFSET_INPUTS), sorted(VIEW_PROGRAMS))))
def test_offset_view_program_sweep(inp: str, prog: str, dynamic: bool, requires_grad: bool, no_grad: bool) -> None:
    _check_view_program(inp, prog, dynamic, requires_grad, no_grad)
