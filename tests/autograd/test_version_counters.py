"""A graph input's version counter moves as far as eager moves it: once per in-place op.

Eager bumps a tensor's `_version` (shared with its views) at every in-place op on it or on a view of
it: `x.add_(1); x.mul_(2)` moves it by two. A functionalized graph computes the new value out of place
and the runtime copies it back once, which moved the counter by one whatever the program did. Code
that reads the counter sees the difference: a tensor saved for a backward made before the call
(autograd's "modified by an inplace operation" check compares the count), user code comparing
`_version`s. Each case runs the program eagerly and compiled (twice: the second call runs the cached
graph) on fresh inputs and compares the values and how far each input's counter moved.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch

import kiln


def _add_mul(x):
    x.add_(1)
    x.mul_(2)
    return x.sum()


def _four_adds(x):
    for _ in range(4):
        x.add_(1)
    return x * 1


def _slices_with_offsets(x):
    x[1:3].add_(1)
    x[0].mul_(2)
    x[:, 1:].sub_(0.5)
    return x.sum()


def _view_then_base(x):
    v = x.view(-1)
    v.add_(1)
    x.sub_(1)
    return v.sum()


def _index_put_and_copy(x):
    x.index_put_((torch.tensor([0, 2]),), torch.ones(3))
    x.copy_(x * 2)
    return x + 0


def _setitem(x):
    x[0] = 5  # fill_ on the row
    x[1:] += 1  # add_ on the slice, then its copy_ back into x[1:]
    return x.sum()


def _diagonal_and_column(x):
    x.diagonal().add_(1)
    x[:, 0].copy_(x[:, 1])
    return x + 0


def _out_variant(x):
    torch.add(x, 1, out=x)
    torch.mul(x, 2, out=x)
    return x + 0


def _fills(x):
    x.zero_()
    x.fill_(2)
    x.clamp_(max=1)
    return x.sum()


def _unsqueeze_view_update(x):
    x.unsqueeze(0).mul_(3)
    x.t().add_(1)
    return x.sum()


def _intermediate_only(x):
    y = x * 2
    y.add_(1)  # not an input: x's counter stays
    return y


def _foreach_two_inputs(x, y):
    torch._foreach_add_([x, y], 1)
    torch._foreach_mul_([x], 2)
    return x + y


def _optimizer_style(p, exp_avg):
    exp_avg.lerp_(p, 0.1)
    p.addcmul_(exp_avg, exp_avg, value=-0.01)
    p.mul_(0.99)
    return p.sum()


def _unequal_counts(x, y):
    x.add_(1)
    y.add_(x)
    y.mul_(2)
    y.div_(3)
    return x.sum() + y.sum()


def _alias_in_frame(x):
    a = x[0]
    b = x[1:]
    a.add_(1)
    b.mul_(2)
    a.sub_(1)
    return x.sum()


CASES: list[tuple[Callable, int]] = [
    (_add_mul, 1), (_four_adds, 1), (_slices_with_offsets, 1), (_view_then_base, 1),
    (_index_put_and_copy, 1), (_setitem, 1), (_diagonal_and_column, 1), (_out_variant, 1), (_fills, 1),
    (_unsqueeze_view_update, 1), (_intermediate_only, 1), (_foreach_two_inputs, 2),
    (_optimizer_style, 2), (_unequal_counts, 2), (_alias_in_frame, 1),
]


def _moves(fn: Callable, args: list[torch.Tensor]) -> tuple[object, list[int]]:
    before = [a._version for a in args]
    out = fn(*args)
    return out, [a._version - v for a, v in zip(args, before)]


def _inputs(count: int, make: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [make() for _ in range(count)]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn,count", CASES, ids=[fn.__name__.strip("_") for fn, _ in CASES])
def test_counter_moves_as_in_eager(fn: Callable, count: int, backend: str) -> None:
    kiln.reset()
    make = lambda: torch.randn(3, 3)  # noqa: E731
    expected, moved = _moves(fn, _inputs(count, make))
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(2):
        args = _inputs(count, make)
        out, got = _moves(compiled, args)
        torch.testing.assert_close(out, expected)
        assert got == moved, f"{fn.__name__}: eager moved the counters by {moved}, compiled by {got}"
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("fn,count", [(_add_mul, 1), (_slices_with_offsets, 1), (_optimizer_style, 2)],
                         ids=["add_mul", "slices_with_offsets", "optimizer_style"])
def test_counter_of_a_view_input_with_an_offset(fn: Callable, count: int) -> None:
    """Inputs that are views (an offset into a bigger base): the base shares the counter and moves too."""
    kiln.reset()

    def make_pair() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(0)
        bases = [torch.randn(5, 4) for _ in range(count)]
        return bases, [b[1:4, 1:] for b in bases]

    bases, views = make_pair()
    _, moved = _moves(fn, views)
    base_moved = [b._version for b in bases]
    compiled = kiln.compile(fn, backend="aot_eager")
    for _ in range(2):
        bases, views = make_pair()
        _, got = _moves(compiled, views)
        assert got == moved
        assert [b._version for b in bases] == base_moved


def test_inductor_counts_as_eager() -> None:
    kiln.reset()
    for fn, count in [(_add_mul, 1), (_setitem, 1), (_unequal_counts, 2)]:
        _, moved = _moves(fn, _inputs(count, lambda: torch.randn(8)))
        compiled = kiln.compile(fn)
        for _ in range(2):
            _, got = _moves(compiled, _inputs(count, lambda: torch.randn(8)))
            assert got == moved, fn.__name__


def test_non_leaf_input_requiring_grad() -> None:
    """A non-leaf input updated in place (the graph clones it to keep the gradient): eager's count,
    and the gradient through the updates."""
    def fn(x):
        x.mul_(2)
        x.add_(1)
        x[0].mul_(3)
        return x.sum()

    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    for run in (fn, compiled, compiled):
        w = torch.randn(4, requires_grad=True)
        x = w * 1
        before = x._version
        run(x).backward()
        assert x._version - before == 3, run
        torch.testing.assert_close(w.grad, torch.tensor([6.0, 2.0, 2.0, 2.0]))


def test_saved_tensor_check_counts_each_update() -> None:
    """A tensor saved by a backward before the call, then updated in place by the graph: the
    version autograd compares is eager's, so restoring the counter by hand is caught as in eager."""
    def fn(x):
        x.add_(1)
        x.mul_(2)

    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    for run in (fn, compiled):
        w = torch.randn(3, requires_grad=True)
        x = torch.randn(3)
        y = w * x  # saves x at version v
        start = x._version
        run(x)
        assert x._version == start + 2
        torch._C._autograd._unsafe_set_version_counter((x,), (start + 1,))  # one update back
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


class _Stats(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("total", torch.zeros(4))
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        self.count += 1
        self.total.add_(x.sum(0))
        self.total.mul_(0.5)
        return self.bn(x)


def test_module_buffers_count_each_update() -> None:
    """Buffers updated twice count two; batch norm's running statistics (written by its kernel,
    which eager does not count) stay put; num_batches_tracked counts one."""
    torch.manual_seed(0)
    eager, model = _Stats(), _Stats()
    compiled = kiln.compile(model, backend="aot_eager")
    for _ in range(3):
        x = torch.randn(5, 4)
        moves = []
        for m, run in ((eager, eager), (model, compiled)):
            before = {k: b._version for k, b in m.named_buffers()}
            run(x)
            moves.append({k: b._version - before[k] for k, b in m.named_buffers()})
        assert moves[0] == moves[1]
        assert moves[0]["total"] == 2 and moves[0]["bn.running_mean"] == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_update_through_data_is_not_counted(backend: str) -> None:
    """`x.data` has a counter of its own (torch.compile puts _get_data_attr in the graph): an update
    through it, or a view of it, leaves x's counter as in eager; `detach()` shares x's."""
    def mixed(x):
        x.data.add_(1)
        x.detach().mul_(2)
        x.data[0] = 3.0
        x.add_(1)
        return x * 1

    def only_data(w, g):  # a hand-written optimizer step
        w.data.add_(g, alpha=-0.1)
        w.data[1:].clamp_(-1, 1)
        return w.data.sum() + w.sum()

    for fn, make in [(mixed, lambda: [torch.randn(3)]),
                     (only_data, lambda: [torch.randn(4, requires_grad=True), torch.randn(4)])]:
        kiln.reset()
        torch.manual_seed(0)
        expected, moved = _moves(fn, make())
        compiled = kiln.compile(fn, backend=backend)
        for _ in range(2):
            torch.manual_seed(0)
            out, got = _moves(compiled, make())
            torch.testing.assert_close(out, expected)
            assert got == moved, fn.__name__
        assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: torch.optim.Adam(ps, lr=0.01),
                                  lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True)],
                         ids=["sgd_momentum", "adam", "adamw_foreach"])
def test_compiled_optimizer_step_counts_as_eager(make: Callable) -> None:
    """A compiled optimizer step: parameters and state (momentum buffers, exp_avg_sq updated twice
    a step, the step counts) move as eager's."""
    def run(compiled: bool) -> list[list[int]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = make(model.parameters())
        step = kiln.compile(opt.step, backend="aot_eager") if compiled else opt.step
        moves = []
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            tensors = list(model.parameters()) + [t for s in opt.state.values() for t in s.values()
                                                  if isinstance(t, torch.Tensor)]
            before = [t._version for t in tensors]
            step()
            moves.append([t._version - b for t, b in zip(tensors, before)])
        return moves

    kiln.reset()
    expected = run(False)
    assert any(2 in m for m in expected)  # some state is updated twice a step
    assert run(True) == expected
