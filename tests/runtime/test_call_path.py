"""The steady-state call path: cheap views in the wrapper, AotRuntime's per-call plan, fast apply.

Each shortcut must give what the general path gives: the wrapper's `t()`/`permute`/`view`/`expand`
the exact sizes, strides and storage of as_strided; the runtime the same outputs, aliasing and
gradients whether or not its outputs pass straight through.
"""
from __future__ import annotations

import pytest
import sympy
import torch
from torch.utils import _pytree as pytree

import kiln
from kiln.lower.codegen.wrapper import _cheap_view
from kiln.lower.ir import Layout
from kiln.runtime.aot import _unflattener


def _layout(sizes: tuple[int, ...], strides: tuple[int, ...]) -> Layout:
    return Layout(torch.float32, tuple(map(sympy.Integer, sizes)), tuple(map(sympy.Integer, strides)))


@pytest.mark.parametrize("base, target, method", [
    (((32, 64), (64, 1)), ((64, 32), (1, 64)), "t()"),
    (((2, 3, 4), (12, 4, 1)), ((4, 2, 3), (1, 12, 4)), "permute(2, 0, 1)"),
    (((2, 8, 32), (256, 32, 1)), ((16, 32), (32, 1)), "view(16, 32)"),
    (((), ()), ((16, 32), (0, 0)), "expand(16, 32)"),
    (((4, 1), (1, 1)), ((4, 5), (1, 0)), "expand(4, 5)"),
    (((6, 4), (4, 1)), ((3, 4), (8, 1)), None),  # every other row: only as_strided makes it
])
def test_cheap_view_matches_as_strided_exactly(base, target, method) -> None:
    got = _cheap_view("x", _layout(*base), _layout(*target))
    assert got == (None if method is None else f"x.{method}")
    if got is None:
        return
    storage = torch.randn(64 * 32 + 8)
    x = storage[8:].as_strided(*base)  # a nonzero storage offset must carry over too
    view = eval(got, {"x": x})
    want = x.as_strided(*target)
    assert view.shape == want.shape and view.stride() == want.stride()
    assert view.storage_offset() == want.storage_offset() == 8
    torch.testing.assert_close(view, want)


def test_unflattener_flat_and_nested_specs() -> None:
    for value in [(1, 2), [1, 2], 3, {"a": (1, [2])}, ()]:
        leaves, spec = pytree.tree_flatten(value)
        assert _unflattener(spec)(list(leaves)) == value
    assert _unflattener(None) is None


def test_views_of_inputs_keep_eager_aliasing_and_strides() -> None:
    def f(x, w):
        return x.reshape(16, 32), w.t(), (x.reshape(16, 32) @ w.t()).relu()

    x, w = torch.randn(2, 8, 32), torch.randn(8, 32)
    with torch.no_grad():
        got = kiln.compile(f)(x, w)
    want = f(x, w)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    assert got[0].data_ptr() == x.data_ptr() and got[1].data_ptr() == w.data_ptr()
    x.add_(1)  # still views: the caller's later write shows through them as in eager
    torch.testing.assert_close(got[0], x.reshape(16, 32))


def test_training_step_gradients_and_mutation_through_the_fast_path() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return self.l2(torch.relu(self.l1(x))).sum(), x.t()

    torch.manual_seed(0)
    eager, model = M(), M()
    model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(model)
    x = torch.randn(8, 32)
    for _ in range(3):
        for m in (eager, compiled):
            loss, xt = m(x)
            loss.backward()
            assert xt.data_ptr() == x.data_ptr() and loss.requires_grad and not xt.requires_grad
    torch.testing.assert_close(model.calls, eager.calls)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)


def test_compiled_function_under_a_functorch_transform_takes_the_python_apply() -> None:
    def f(x, w):
        return (torch.tanh(x @ w) ** 2).sum()

    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = kiln.compile(f)
    compiled(x, w).backward()  # the compiled autograd.Function exists and was applied
    w.grad = None
    # inside torch.func.grad functorch transforms are active: the fast path steps aside to
    # torch's own Function.apply, which reports the missing setup_context as before, no wrong answer
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda w: compiled(x, w))(w.detach())
