"""Views of graph inputs under dynamic sizes, updated in place, on the default backend.

A view whose sizes are expressions of the input's (`x.view(-1, 2)` of a size-s0 input has
`2*FloorDiv(s0, 2)` rows times 2) gives, once updated in place, the input a new value whose size
expression differs in form from the input's own (`2*FloorDiv(s0, 2)` against `s0`) though the
guard the view recorded (s0 even) makes them equal. Functionalization compared the two as
expressions, took the input for one whose shape an in-place op changed (`resize_`) and refused the
frame: it ran eagerly on every call (found by the views x externs sweep; torch.compile compiles
these frames whole). Each program runs compiled and eagerly on three sizes, under dynamic=True and
automatic dynamic, with grad on and in no_grad: the outputs, the updated input, which outputs are
the input's memory, the input's version bump and the grads are eager's, and no call ran eagerly.

A view of such a view transposed in place (`x.view(-1, 2).t_()`) has `FloorDiv(2*FloorDiv(s0, 2), 2)`
columns, which the size simplifier left as it was (a term holding a floor was never taken out of
another), so it did not match the `FloorDiv(s0, 2)` of the same view replayed on the input, and the
result was returned as a copy: no longer the input's memory, as eager's is (a silent aliasing loss).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.cpp


def _pairs_bumped(x: torch.Tensor) -> Any:
    x.view(-1, 2)[:, 0].add_(1)
    return x.sum()


def _unflatten_then_mm(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x.unflatten(0, (-1, 3))
    y.mul_(2)
    return y @ w, x


def _reshape_row_zeroed(x: torch.Tensor) -> Any:
    y = x.reshape(-1, 2, x.shape[-1])
    y[:, 1].zero_()
    return y, x


def _rows_index_added(x: torch.Tensor, idx: torch.Tensor) -> Any:
    x.view(-1, 2).index_add_(0, idx, torch.ones(idx.shape[0], 2))
    return x


def _columns_then_linear(x: torch.Tensor, w: torch.Tensor) -> Any:
    x.view(-1, 4)[:, 1:].mul_(2)
    return F.linear(x.view(-1, 4), w)


def _pairs_returned_transposed(x: torch.Tensor) -> Any:
    y = x.view(-1, 2)
    y[:, 0].add_(1)
    return y.t()


def _offset_rows_doubled(x: torch.Tensor) -> Any:
    y = x[1:]
    y.view(-1, 2).mul_(2)
    return y


def _intermediate_pairs(x: torch.Tensor) -> Any:
    y = x * 2
    z = y.view(-1, 2)
    z[:, 1].add_(1)
    return y, z


def _pairs_transposed_in_place(x: torch.Tensor) -> Any:
    v = x.view(-1, 2)
    v.t_()
    v.mul_(2)
    return v, x


def _pairs_transposed_returned(x: torch.Tensor) -> Any:
    v = x.view(-1, 2)
    v.t_()
    return v * 1, v


# name: (function, arguments for call k (0, 1, 2): inputs of three sizes)
PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[int], tuple]]] = {
    "pairs_bumped": (_pairs_bumped, lambda k: (torch.randn(4 + 2 * k),)),
    "unflatten_then_mm": (_unflatten_then_mm,
                          lambda k: (torch.randn(6 + 3 * k), torch.randn(3, 2, requires_grad=True))),
    "reshape_row_zeroed": (_reshape_row_zeroed, lambda k: (torch.randn(4 + 2 * k, 3),)),
    "rows_index_added": (_rows_index_added, lambda k: (torch.randn(6 + 2 * k), torch.tensor([0, 2, 0]))),
    "columns_then_linear": (_columns_then_linear,
                            lambda k: (torch.randn(8 + 4 * k), torch.randn(3, 4, requires_grad=True))),
    "pairs_returned_transposed": (_pairs_returned_transposed, lambda k: (torch.randn(4 + 2 * k),)),
    "offset_rows_doubled": (_offset_rows_doubled, lambda k: (torch.randn(5 + 2 * k),)),
    "intermediate_pairs": (_intermediate_pairs, lambda k: (torch.randn(4 + 2 * k, requires_grad=True),)),
    "pairs_transposed_in_place": (_pairs_transposed_in_place, lambda k: (torch.randn(4 + 2 * k),)),
    "pairs_transposed_returned": (_pairs_transposed_returned, lambda k: (torch.randn(4 + 2 * k),)),
}
CI = ["pairs_bumped", "unflatten_then_mm", "pairs_returned_transposed", "intermediate_pairs",
      "pairs_transposed_in_place"]
CASES = [pytest.param(name, dynamic, grad, marks=() if name in CI and (dynamic, grad) == (True, True)
                      else pytest.mark.slow)
         for name in PROGRAMS for dynamic in (True, None) for grad in (True, False)]


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)] if isinstance(value, (tuple, list)) else []


def _record(fn: Callable[..., Any], args: tuple, grad: bool) -> dict[str, Any]:
    """What a call did: values out, arguments after, aliasing, version bumps, grads."""
    versions = [a._version for a in args if isinstance(a, torch.Tensor)]
    with contextlib.nullcontext() if grad else torch.no_grad():
        outs = _flat(fn(*args))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    alias = [[i for i, a in enumerate(tensors) if o.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()]
             for o in outs]
    shared = [[k for k in range(j) if outs[k].untyped_storage().data_ptr() == o.untyped_storage().data_ptr()]
              for j, o in enumerate(outs)]
    trained = [o for o in outs if o.requires_grad]
    if trained:
        sum((o * (k + 1)).sin().sum() for k, o in enumerate(trained)).backward()
    return dict(outs=[o.detach().clone() for o in outs], args=[a.detach().clone() for a in tensors],
                alias=alias, shared=shared, grad=[o.requires_grad for o in outs],
                bumped=[a._version != v for a, v in zip(tensors, versions)],
                grads=[None if a.grad is None else a.grad.clone() for a in tensors])


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(got, want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return bool(got == want)


@pytest.mark.parametrize("name, dynamic, grad", CASES)
def test_view_of_input_updated_under_dynamic_sizes(name: str, dynamic: bool | None, grad: bool) -> None:
    fn, make = PROGRAMS[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    for k in range(3):
        torch.manual_seed(k)
        want = _record(fn, make(k), grad)
        torch.manual_seed(k)
        got = _record(compiled, make(k), grad)
        for key in want:
            assert _same(got[key], want[key]), f"call {k} {key}: compiled {got[key]}, eager {want[key]}"
    assert kiln.stats()["fallbacks"] == 0, "a call ran eagerly"


def test_a_floor_times_a_multiple_of_the_divisor_leaves_the_floor() -> None:
    """(c*d*F + r) // d is c*F + r // d for an integer F (a floor itself): the simplified forms
    are Python's values for every size, and a coefficient that is no multiple of d stays inside."""
    import sympy

    from kiln.symbolic.expr import FloorDiv, ModularIndexing

    s = sympy.Symbol("s0", integer=True, positive=True)
    assert FloorDiv(2 * FloorDiv(s, 2), 2) == FloorDiv(s, 2)
    assert FloorDiv(3 * FloorDiv(s, 2), 2).func is FloorDiv and FloorDiv(3 * FloorDiv(s, 2), 2).args[0] != s
    cases = [(FloorDiv(2 * FloorDiv(s, 2), 2), lambda n: (2 * (n // 2)) // 2),
             (FloorDiv(4 * FloorDiv(s, 3) + 1, 2), lambda n: (4 * (n // 3) + 1) // 2),
             (FloorDiv(6 * FloorDiv(s, 2) + s, 3), lambda n: (6 * (n // 2) + n) // 3),
             (FloorDiv(3 * FloorDiv(s, 2), 2), lambda n: (3 * (n // 2)) // 2),
             (ModularIndexing(4 * FloorDiv(s, 3) + 1, 2), lambda n: (4 * (n // 3) + 1) % 2)]
    for expr, python in cases:
        for n in range(1, 40):
            assert int(expr.subs(s, n)) == python(n), (expr, n)
