"""Outputs that alias inputs or each other come back as eager's: values, strides, offsets, sharing.

Each case runs eagerly and compiled on fresh inputs and compares, through tests/fuzz/aliasing.py,
every output's values, dtype, shape, strides and storage offset, which inputs and earlier outputs
it shares memory with, the inputs afterwards, and the inputs after a marker is written through
each output that aliases one. The table crosses input layouts (contiguous, transposed, strided
rows, a column slice, a storage offset, channels-last, expanded, empty) with in-place updates (none,
one, several, through a view) and with the views returned (slices with steps, select, narrow,
diagonal, unfold, expand, as_strided, unbind/split/chunk, reshape, view(dtype), detach, ...), under
static shapes, dynamic=True and automatic dynamic (a second size). The CI slice covers every view,
layout and update at least once on aot_eager and a third of them on inductor; the @slow sweep runs
the whole product on the three backends.
Before kiln.runtime.views, a view of a mutated input or of an input with an offset was rebuilt with
the traced strides and offset and read the wrong elements (issue 29, items 1, 2 and 4).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.log import KilnWarning

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from aliasing import differences, outcome  # noqa: E402

Make = Callable[[int], list[Any]]


def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds in tests


# ---------------------------------------------------------------------------------------------------
# The table: input layouts (a fresh tensor of n rows each call), in-place updates, returned views

def _contiguous(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(n * 3, dtype=dtype).reshape(n, 3)


def _transposed(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(n * 3, dtype=dtype).reshape(3, n).t()


def _strided_rows(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(n * 6, dtype=dtype).reshape(2 * n, 3)[::2]


def _column_slice(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(n * 5, dtype=dtype).reshape(n, 5)[:, 1:4]


def _offset(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(7 + n * 3, dtype=dtype)[7:].view(n, 3)


def _expanded(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(3, dtype=dtype).expand(n, 3)


LAYOUTS: dict[str, Callable[..., torch.Tensor]] = {
    "contiguous": _contiguous, "transposed": _transposed, "strided_rows": _strided_rows,
    "column_slice": _column_slice, "offset": _offset, "expanded": _expanded,
}

VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "column": lambda a: a[:, :1],
    "reshape": lambda a: a.reshape(-1),
    "flatten": lambda a: a.flatten(),
    "t": lambda a: a.t(),
    "rows_step": lambda a: a[::2],
    "diagonal": lambda a: a.diagonal(),
    "unfold": lambda a: a.unfold(0, 2, 1),
    "expand": lambda a: a.expand(2, *a.shape),
    "select": lambda a: a[1],
    "narrow": lambda a: a.narrow(1, 1, 1),
    "unbind": lambda a: a.unbind(1),
    "split": lambda a: a.split(1, 1),
    "chunk": lambda a: a.chunk(2, 0),
    "unsqueeze": lambda a: a.unsqueeze(1),
    "permute_slice": lambda a: a.unsqueeze(0).permute(2, 0, 1)[1:],
    "view_dtype": lambda a: a.view(torch.int32),
    "as_strided": lambda a: a.as_strided((2, 2), (1, 2), 1),
    "itself": lambda a: a,
    "detach": lambda a: a.detach(),
    "contiguous": lambda a: a.contiguous(),
    "movedim_slice": lambda a: a.movedim(0, 1)[..., 1:],
}

MUTATIONS: dict[str, Callable[[torch.Tensor], Any] | None] = {
    "none": None,
    "add_": lambda a: a.add_(1),
    "several": lambda a: (a.mul_(2), a[0].add_(5)),
    "through_view": lambda a: a[:, 0].fill_(7),
    "zero_": lambda a: a.zero_(),
}


def _program(mutation: Callable | None, view: Callable) -> Callable[[torch.Tensor], Any]:
    def program(a: torch.Tensor) -> Any:
        if mutation is not None:
            mutation(a)
        return view(a), a.sum()  # the sum: an op, so the frame has a graph to compile
    return program


def _table() -> list[tuple[str, str, str]]:
    """(layout, mutation, view) for every combination eager accepts (no update of an expanded input)."""
    return [(layout, mutation, view) for layout in LAYOUTS for mutation in MUTATIONS for view in VIEWS
            if not (layout == "expanded" and mutation != "none")]


def _ci_slice() -> list[tuple[str, str, str]]:
    """Every view three times, under rotating layouts and updates: each one of them is met."""
    layouts, mutations = list(LAYOUTS), list(MUTATIONS)
    chosen = []
    for k, view in enumerate(VIEWS):
        for step in range(3):
            layout = layouts[(k + step) % len(layouts)]
            mutation = mutations[(k + 2 * step) % len(mutations)]
            chosen.append((layout, "none" if layout == "expanded" else mutation, view))
    return chosen


def _check(fn: Callable, make: Make, backend: str, *, dynamic: bool | None, sizes: tuple[int, ...] = (4, 6),
           grad: bool = False, mark: Callable[[list[Any]], None] | None = None, eagerly: bool = False) -> None:
    """`fn` compiled agrees with eager on fresh inputs of each size, with no fallback (or, where
    `eagerly`, with the refusal that runs the frame eagerly)."""
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic, options=_options(backend))
    for n in sizes:
        expected = outcome(fn, make(n), grad=grad)
        inputs = make(n)
        if mark is not None:
            mark(inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("error", KilnWarning)  # a fallback to eager is a failure here
            got = outcome(compiled, inputs, grad=grad)
        found = differences(expected, got)
        assert not found, f"n={n}: " + "\n".join(found)
    stats = kiln.stats()
    if eagerly:  # the frame itself runs eagerly; its callees (the mutation, the view) compile on their own
        assert stats["fallbacks"] >= 1, stats
    else:
        assert stats["graphs"] >= 1 and stats["fallbacks"] == 0, stats


def _runs_eagerly(case: tuple[str, str, str]) -> bool:
    """An as_strided view of an input laid out otherwise than contiguously from offset 0, which
    the frame also updates: refused (see kiln.autograd.functionalize), eager's answer stands."""
    layout, mutation, view = case
    return view == "as_strided" and mutation != "none" and layout != "contiguous"


def _case_id(case: tuple[str, str, str]) -> str:
    return "-".join(case)


def _dynamic_mode(case: tuple[str, str, str]) -> bool | None:
    # alternate: dynamic=True from the first call, or automatic dynamic after the second size
    return True if sum(map(len, case)) % 2 else None


@pytest.mark.parametrize("case", _ci_slice(), ids=_case_id)
def test_views_of_inputs_aot_eager(case: tuple[str, str, str]) -> None:
    layout, mutation, view = case
    _check(_program(MUTATIONS[mutation], VIEWS[view]), lambda n: [LAYOUTS[layout](n)], "aot_eager",
           dynamic=_dynamic_mode(case), eagerly=_runs_eagerly(case))


@pytest.mark.cpp
@pytest.mark.parametrize("case", _ci_slice()[::3], ids=_case_id)
def test_views_of_inputs_inductor(case: tuple[str, str, str]) -> None:
    layout, mutation, view = case
    _check(_program(MUTATIONS[mutation], VIEWS[view]), lambda n: [LAYOUTS[layout](n)], "inductor",
           dynamic=_dynamic_mode(case), eagerly=_runs_eagerly(case))


@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_views_of_inputs_whole_table(backend: str, dynamic: bool | None) -> None:
    failures = []
    for case in _table():
        layout, mutation, view = case
        try:
            _check(_program(MUTATIONS[mutation], VIEWS[view]), lambda n: [LAYOUTS[layout](n)], backend,
                   dynamic=dynamic, eagerly=backend != "eager" and _runs_eagerly(case))
        except AssertionError as err:
            failures.append(f"{_case_id(case)}: {str(err)[:300]}")
    assert not failures, f"{len(failures)} of {len(_table())} cases differ:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------------
# The examples of issue 29


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_mutated_strided_input_returned_as_a_column(backend: str) -> None:
    def f(a):
        a.add_(1)
        return a[:, :1]

    _check(f, lambda n: [torch.arange(n * 6.0).reshape(2 * n, 3)[::2]], backend, dynamic=None, sizes=(5,))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_mutated_offset_input_returned_reshaped(backend: str) -> None:
    def f(buf):
        buf.mul_(2)
        return buf.reshape(-1)

    _check(f, lambda n: [torch.arange(20.0)[5:].view(n, 3)], backend, dynamic=None, sizes=(5,))


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_transpose_of_an_offset_input_under_dynamic_shapes(backend: str, dynamic: bool | None) -> None:
    def f(x):
        return x.transpose(0, 1), x.sum()

    _check(f, lambda n: [torch.arange(40.0)[10:10 + 3 * n].view(n, 3)], backend, dynamic=dynamic)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_view_of_an_intermediate_filled_in_place_with_its_base(backend: str) -> None:
    def f(a):
        v = torch.maximum(a, a)
        v[..., :1].fill_(3)
        return v, v[..., :1]

    _check(f, lambda n: [torch.arange(4 * n, dtype=torch.int32).reshape(4, n).t()], backend, dynamic=True)


# ---------------------------------------------------------------------------------------------------
# Views of intermediates: with their base, alone with an offset, a step or a broadcast

INTERMEDIATE: dict[str, Callable[[torch.Tensor], Any]] = {
    "base_and_slice": lambda a: (lambda y: (y, y[1:]))(a * 2),
    "filled_view_and_base": lambda a: (lambda y: (y[..., :1].fill_(3), y, y[..., :1])[1:])(torch.maximum(a, a)),
    "rows_step": lambda a: (a * 2)[::2],
    "expand": lambda a: (a + 1).expand(2, *a.shape),
    "unbind": lambda a: (a * 3).unbind(0),
    "transpose": lambda a: (a * 2).t(),
    "select": lambda a: (a * 2)[1],
    "diagonal": lambda a: (a - 1).diagonal(),
    "two_views": lambda a: (lambda y: (y[0], y[:, 1]))(a.sin()),
    "detached_pair": lambda a: (lambda y: (y, y.detach()))(a.cos()),
    "as_strided": lambda a: (lambda y: (y, y.as_strided((2, 2), (1, 2), 1)))(a * 5),
    # as_strided addresses memory: the intermediate must be stored as eager lays it out (transposed)
    "as_strided_of_transposed": lambda a: (lambda y: (y.as_strided((2, 2), (1, 2)), y.sum()))(
        a.t().contiguous().t().sin()),
    # reshape of a strided slice copies through _unsafe_view, whose recorded sizes are raw
    # numbers under dynamic shapes: the chunk is rebuilt from the copy, at its offset
    "chunk_of_a_reshaped_copy": lambda a: (lambda t: (t.chunk(2, 0)[-1], t.sum()))(a.t()[::2].reshape(-1)),
    # ... and a broadcast of one, detached (no _base leads to the copy: found in the traced graph)
    "expand_of_a_reshaped_copy": lambda a: (a.t().flatten().expand(2, -1).detach(), a.sum()),
    # a result realized because it is used twice is stored in eager's (transposed) strides
    "transposed_result_used_twice": lambda a: (lambda y: (y, y.sum()))(a.t().contiguous().t().sin().cos().exp().tanh()),
}


def _intermediate_slice() -> list[tuple[str, str, bool | None]]:
    """Each program on two layouts, one static then automatic dynamic, one dynamic=True."""
    layouts = ["contiguous", "transposed", "strided_rows", "offset"]
    return [case for k, name in enumerate(INTERMEDIATE)
            for case in ((name, layouts[k % 4], None), (name, layouts[(k + 1) % 4], True))]


@pytest.mark.parametrize("name, layout, dynamic", _intermediate_slice())
def test_views_of_intermediates_aot_eager(name: str, layout: str, dynamic: bool | None) -> None:
    _check(INTERMEDIATE[name], lambda n: [LAYOUTS[layout](n)], "aot_eager", dynamic=dynamic)


@pytest.mark.cpp
@pytest.mark.parametrize("name", list(INTERMEDIATE))
def test_views_of_intermediates_inductor(name: str) -> None:
    layout = ["transposed", "strided_rows", "offset"][len(name) % 3]
    _check(INTERMEDIATE[name], lambda n: [LAYOUTS[layout](n)], "inductor", dynamic=len(name) % 2 == 0 or None)


@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_views_of_intermediates_every_layout(backend: str) -> None:
    for name, fn in INTERMEDIATE.items():
        for layout in LAYOUTS:
            for dynamic in (None, True):
                _check(fn, lambda n: [LAYOUTS[layout](n)], backend, dynamic=dynamic)


# ---------------------------------------------------------------------------------------------------
# Gradients, dtypes, complex views, channels-last, empty and shared inputs, metadata updates

def _seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _train_mutated_non_leaf(x, w):
    x.mul_(2)
    return (x @ w).sum(), x[1:], x.t()


def _train_mutated_through_view(x, w):
    x[:, 0].add_(1)
    y = x @ w
    return y.sum(), y[0], y, x.unbind(0)


def _update(a):
    if a.dtype is torch.bool:
        a.logical_not_()
    else:
        a.add_(1)
    return a[:, :2], a.t()[1], a.sum()


def _complex_update(a):
    a.mul_(2)
    return a.real, a.imag[1:], torch.view_as_real(a)


def _channels_last_update(a):
    a.add_(1)
    return a[:, :, 1:], a.flatten(2), a.contiguous()


def _same_tensor_twice(a, b):
    a.add_(1)
    return b[1:], a.t(), b.sum()


def _t_(a):
    a.t_()
    return a[0], a.sum(0)


def _unsqueeze_then_update(a):
    a.unsqueeze_(0)
    a.mul_(2)
    return a[0, 1:], a.sum(), a


def _transpose_then_update(a):
    a.transpose_(0, 1)
    a.add_(1)
    return a[:, 1:], a.sum()


def _as_strided_(a):
    a.as_strided_((2, 2), (1, 2))
    return a + 1


def _two_updated(a, b):
    a.add_(b[:, :1])
    b.mul_(2)
    return a[::2], b.t(), (a * b).sum()


def _contiguous_then_update(a):
    # the functional value of an updated strided input must keep its strides: contiguous() then
    # copies as in eager, and so does reshape, so the later updates do not reach the input
    a.add_(1)
    y = a.contiguous()
    y.mul_(2)
    z = a.reshape(-1)
    z.add_(5)
    return a.sum(), y, z


def _strided_pair(n: int) -> list[torch.Tensor]:
    b = torch.arange(n * 6.0).reshape(2 * n, 3)
    return [b[::2], b[1::2]]


def _twice(n: int) -> list[torch.Tensor]:
    t = torch.arange(7 + n * 3.0)[7:].view(n, 3)
    return [t, t]


def _complex_rows(n: int) -> list[torch.Tensor]:
    return [torch.complex(torch.arange(n * 6.0).reshape(2 * n, 3), torch.ones(2 * n, 3))[::2]]


def _channels_last(n: int) -> list[torch.Tensor]:
    return [torch.arange(2 * 3 * n * 4.0).reshape(2, 3, n, 4).to(memory_format=torch.channels_last)]


# name -> (program, inputs of size n, with gradients)
OTHER: dict[str, tuple[Callable, Make, bool]] = {
    "train_views_of_a_leaf": (lambda x, w: ((x @ w).sum(), x.t(), x[:, :1]),
                              lambda n: [_leaf(_seeded(n, 3, seed=n)), _leaf(_seeded(3, 2, seed=3))], True),
    "train_views_of_an_offset_leaf": (lambda x, w: ((x @ w).sum(), x.transpose(0, 1), x[1:]),
                                      lambda n: [_leaf(_seeded(7 + 3 * n, seed=1))[7:].view(n, 3),
                                                 _leaf(_seeded(3, 2, seed=3))], True),
    "train_views_of_strided_rows": (lambda x, w: ((x @ w).relu().sum(), x[::2], x.diagonal()),
                                    lambda n: [_leaf(_seeded(2 * n, 3, seed=n))[::2], _leaf(_seeded(3, 2, seed=3))],
                                    True),
    "train_updated_non_leaf": (_train_mutated_non_leaf,
                               lambda n: [(_leaf(_seeded(2 * n, 3, seed=2)) * 1)[::2], _leaf(_seeded(3, 2, seed=3))],
                               True),
    "train_updated_through_a_view": (_train_mutated_through_view,
                                     lambda n: [(_leaf(_seeded(n, 5, seed=2)) * 1)[:, 1:4],
                                                _leaf(_seeded(3, 2, seed=3))], True),
    **{f"update_{str(dtype)[6:]}": (_update, lambda n, dtype=dtype: [_offset(n, torch.int64).to(dtype)
                                                                     if dtype is not torch.bool else
                                                                     _offset(n, torch.int64) % 2 == 0], False)
       for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool)},
    **{f"views_{str(dtype)[6:]}": (lambda a: (a[::2], a.unsqueeze(0).expand(2, -1, -1), a.sum()),
                                   lambda n, dtype=dtype: [_strided_rows(n, dtype)], False)
       for dtype in (torch.bfloat16, torch.float16)},
    "complex_real_imag": (lambda a: (a.real, a.imag, torch.view_as_real(a), a.abs()), _complex_rows, False),
    "complex_updated": (_complex_update, _complex_rows, False),
    "view_as_complex": (lambda a: (torch.view_as_complex(a), a.sum()),
                        lambda n: [torch.arange(8 + 4.0 * n)[8:].view(2 * n, 2)], False),
    "channels_last": (lambda a: (a[:, 1], a.permute(0, 2, 3, 1), a.flatten(2), a.sum()), _channels_last, False),
    "channels_last_updated": (_channels_last_update, _channels_last, False),
    "empty": (lambda a: (a.t(), a[:, 1:], a.reshape(-1), a.sum()), lambda n: [torch.zeros(n, 5)[:, 1:1]], False),
    "two_inputs_one_buffer": (lambda a, b: (a.t(), b[1:], a + b), _strided_pair, False),
    "same_tensor_twice": (_same_tensor_twice, _twice, False),
    "two_updated_inputs": (_two_updated, lambda n: [_strided_rows(n), _offset(n)], False),
    "t_": (_t_, lambda n: [_offset(n)], False),
    "unsqueeze_then_update": (_unsqueeze_then_update, lambda n: [_strided_rows(n)], False),
    "transpose_then_update": (_transpose_then_update, lambda n: [_strided_rows(n)], False),
    "as_strided_": (_as_strided_, lambda n: [_contiguous(n)], False),
    "contiguous_then_update": (_contiguous_then_update, lambda n: [_strided_rows(n)], False),
}


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", list(OTHER))
def test_other_inputs_aot_eager(name: str, dynamic: bool | None) -> None:
    fn, make, grad = OTHER[name]
    _check(fn, make, "aot_eager", dynamic=dynamic, grad=grad)


@pytest.mark.cpp
@pytest.mark.parametrize("name", list(OTHER))
def test_other_inputs_inductor(name: str) -> None:
    fn, make, grad = OTHER[name]
    _check(fn, make, "inductor", dynamic=True if len(name) % 2 else None, grad=grad)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_mark_dynamic_on_an_offset_input(backend: str) -> None:
    _check(lambda x: (x.t(), x[1:], x.sum()), lambda n: [_offset(n)], backend, dynamic=False,
           mark=lambda inputs: kiln.mark_dynamic(inputs[0], 0))


def test_an_updated_input_viewed_by_as_strided_runs_eagerly() -> None:
    # Inside the graph the input's new value is a fresh tensor, which an as_strided view
    # regenerated from it would address instead of the input's storage: the frame runs eagerly.
    def f(a):
        d = a.diagonal().as_strided((2, 2), (1, 2))
        a.add_(1.5)
        return d, d.sum()

    kiln.reset()
    a, b = _transposed(4), _transposed(4)
    got, expected = kiln.compile(f, backend="aot_eager")(a), f(b)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]) and torch.equal(a, b)
    assert kiln.stats()["fallbacks"] == 1


@pytest.mark.cpp
def test_backward_reads_the_symbols_of_a_chunked_tangent() -> None:
    # chunk's second part has s0 - (s0 + 1) // 2 rows: its tangent binds no s0, which the backward
    # (zeros for the first part, cat) needs; the forward now hands s0 over as a saved size
    def f(x):
        part = x.squeeze().chunk(2, 0)[-1]
        return part * 2 + 1, part.detach(), (part.detach().sum() * 2).abs()

    _check(f, lambda n: [_leaf(torch.arange(7 + n * 6.0)[7:]).view(n, 2, 3).detach().requires_grad_(True)],
           "inductor", dynamic=True, sizes=(5, 3), grad=True)


def test_view_ops_whose_arguments_torch_cannot_hand_back_are_recorded_by_name_only() -> None:
    # torch 2.13's ViewMeta of _unsafe_view (and resize_) returns its sizes through a reference to
    # a temporary: reading them gave raw numbers and now and then crashed the process (tracing
    # transformers models); the step keeps its name, matches its kind, and is never replayed
    from kiln.runtime.views import UNREADABLE, ViewStep, apply_chain, view_steps

    x = torch.arange(24.0).reshape(4, 6)
    torch._enable_functionalization(reapply_views=True)
    try:
        wrapper = torch._to_functional_tensor(x)
        copy = wrapper.t()[::2].reshape(-1)  # not viewable: clone, then _unsafe_view
        steps = view_steps(copy[1:])
    finally:
        torch._disable_functionalization()
    assert [s.meta for s in steps] == ["_unsafe_view_ViewMeta", "slice_Tensor_ViewMeta"]
    assert steps[0].fields == () and "_unsafe_view_ViewMeta" in UNREADABLE
    with pytest.raises(ValueError, match="cannot be replayed"):
        apply_chain(x, steps)
    with pytest.raises(ValueError, match="not a view op"):
        apply_chain(x, (ViewStep("system", ()),))


# ---------------------------------------------------------------------------------------------------
# Programs that read where an input starts in its storage

def _reads_offset(x):
    return x * x.storage_offset()


def _as_strided_from_own_offset(x):
    return x.as_strided((2, 2), (1, 2), x.storage_offset() + 1) * 2


def _as_strided_absolute(x):
    return x.as_strided((2, 2), (1, 2), 11) * 2


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("fn", [_reads_offset, _as_strided_from_own_offset, _as_strided_absolute],
                         ids=lambda f: f.__name__)
def test_programs_reading_the_storage_offset_of_an_input(fn: Callable, backend: str, dynamic: bool | None) -> None:
    # The offset was neither guarded (a slice at another offset reused the graph with the old one)
    # nor kept under dynamic shapes (the fake of a dynamic input started at offset 0).
    buf = torch.arange(40.0)
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic, options=_options(backend))
    for start, n in ((10, 4), (5, 4), (8, 6)):
        x = buf[start:start + 3 * n].view(n, 3)
        assert torch.equal(compiled(x), fn(x)), (start, n)


def test_the_storage_offset_is_guarded_only_where_the_program_reads_it() -> None:
    buf = torch.arange(40.0)
    kiln.reset()
    compiled = kiln.compile(lambda x: x * 2, backend="aot_eager")
    for start in (10, 5, 3):
        compiled(buf[start:start + 12].view(4, 3))
    assert kiln.stats()["compiles"] == 1
    kiln.reset()
    compiled = kiln.compile(_reads_offset, backend="aot_eager")
    for start in (10, 5, 10):
        compiled(buf[start:start + 12].view(4, 3))
    assert kiln.stats()["compiles"] == 2 and kiln.stats()["recompiles"] == 1


# ---------------------------------------------------------------------------------------------------
# Inputs that share memory, one of them updated in place

def _update_first_read_second(a, b):
    a.add_(1)
    return b * 2


def _update_second_read_first(a, b):
    b.mul_(3)
    return a.sum(), b.t()


def _rows(buf: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return buf[3 * start:3 * (start + n)].view(n, 3)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("fn", [_update_first_read_second, _update_second_read_first], ids=lambda f: f.__name__)
def test_inputs_sharing_memory_with_an_updated_one(fn: Callable, backend: str) -> None:
    # the graph traces each input as its own tensor: an update of one did not show through the other.
    # Overlapping inputs now run the captured graph op by op (first call or later, any layout);
    # disjoint slices of one buffer, and separate tensors, keep the compiled graph.
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, options=_options(backend))
    for a_rows, b_rows in (((0, 3), (1, 3)), ((0, 2), (2, 2)), ((0, 3), (2, 2)), ((1, 3), (0, 3))):
        buf_eager, buf = torch.arange(24.0), torch.arange(24.0)
        want = fn(_rows(buf_eager, *a_rows), _rows(buf_eager, *b_rows))
        got = compiled(_rows(buf, *a_rows), _rows(buf, *b_rows))
        want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
        assert all(torch.equal(g, w) for g, w in zip(got, want)) and torch.equal(buf, buf_eager), (a_rows, b_rows)
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    a2, b2 = a.clone(), b.clone()
    for g, w in zip(_flat(compiled(a, b)), _flat(fn(a2, b2))):
        torch.testing.assert_close(g, w)


def _flat(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def test_overlap_is_decided_by_address_ranges() -> None:
    from kiln.runtime.views import overlapping

    buf = torch.arange(24.0)
    assert overlapping([buf[:12], buf[6:18]], [0]) and overlapping([buf[:12], buf[6:18]], [1])
    assert not overlapping([buf[:12], buf[12:]], [0])  # disjoint slices of one buffer
    assert overlapping([buf[::2], buf[1::2]], [0])  # interleaved: counted (the ranges meet)
    rows = buf[:12]
    assert not overlapping([rows, rows], [0])  # one object twice: the aliasing guard's case
    assert overlapping([rows, buf[:12]], [0])  # two objects over the same elements
    assert not overlapping([buf[:0], buf], [0])  # nothing to update


def test_an_update_of_a_view_whose_elements_overlap_runs_eagerly() -> None:
    # functionalization cannot express it (eager updates an element reached twice twice): capture
    # breaks the graph at the write (reason overlapping_write) and it runs eagerly, no internal error
    def f(x):
        t = x.clone()
        t.unfold(0, 2, 1).add_(1)
        return t, x.sum()

    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = kiln.compile(f, backend="aot_eager")(torch.arange(12.0).reshape(4, 3))
    assert torch.equal(got[0], f(torch.arange(12.0).reshape(4, 3))[0]) and kiln.stats()["graph_breaks"] >= 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_detached_input_is_a_new_tensor_object(backend: str) -> None:
    """`w.detach()` returned from the frame shares w's memory but is another tensor, as in eager:
    marking it as requiring grad does not change the caller's w (inductor once returned w itself)."""
    kiln.reset()
    w = torch.randn(3)
    out = kiln.compile(lambda t: t.detach(), backend=backend)(w)
    assert out is not w and out.data_ptr() == w.data_ptr()
    out.requires_grad_()
    assert not w.requires_grad
    out2 = kiln.compile(lambda t: (t.detach(), t.view(3)), backend=backend)(w)
    assert out2[0] is not w and out2[1] is not w and out2[0] is not out2[1]
