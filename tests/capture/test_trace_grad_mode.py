"""Process-wide modes torch.compile traces whole, traced whole by Kiln (fullgraph=True).

Grad-mode managers used as decorators inside the frame (with and without parentheses, on
lambdas, raising), `torch._C._set_grad_enabled` in user context managers and @contextmanager
generators, `disable_saved_tensors_hooks` blocks, and `torch.set_default_dtype` (factories and type
promotion in the changed default, on every backend, the process left as eager leaves it). Each
program is compared with eager and with torch._dynamo.explain (tests/capture/trace_oracle.py).
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import kiln
from tests.capture.trace_oracle import check_traced, fresh

X = torch.randn(3, requires_grad=True)


def _x() -> tuple:
    return fresh(X)()


# ------------------------------------------------------------------------ decorators in the frame
def no_grad_decorator(x):
    @torch.no_grad()
    def helper(y):
        return y * 2, torch.is_grad_enabled()

    out, inside = helper(x)
    return out, inside, out.requires_grad, torch.is_grad_enabled(), (x * 3).requires_grad


def no_grad_without_parentheses(x):
    @torch.no_grad
    def helper(y):
        return y * 2

    return helper(x).requires_grad, (x + 1).requires_grad


def enable_grad_decorator_under_no_grad(x):
    @torch.enable_grad()
    def helper(y):
        return y * 2

    with torch.no_grad():
        z = helper(x)
        w = x * 2
    return z.requires_grad, w.requires_grad, z


def set_grad_enabled_decorator(x):
    @torch.set_grad_enabled(False)
    def helper(y):
        return y * 2

    before = torch.is_grad_enabled()
    return helper(x).requires_grad, before, torch.is_grad_enabled()


def decorator_on_a_lambda(x):
    f = torch.no_grad()(lambda y: y + 1)
    return f(x).requires_grad, f(x)


def decorated_helper_raises(x):
    @torch.no_grad()
    def helper(y):
        raise ValueError("no")

    try:
        helper(x)
    except ValueError:
        pass
    return torch.is_grad_enabled(), (x * 2).requires_grad


# ------------------------------------------------------------ _set_grad_enabled in user managers
class NoGrad:
    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


def user_manager_sets_grad(x):
    with NoGrad():
        y = x * 2
    return y.requires_grad, (x * 3).requires_grad, torch.is_grad_enabled()


@contextlib.contextmanager
def generator_no_grad():
    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(prev)


def contextmanager_sets_grad(x):
    with generator_no_grad():
        y = x * 2
    return y, y.requires_grad, torch.is_grad_enabled()


def set_grad_enabled_directly(x):
    torch._C._set_grad_enabled(False)
    y = x * 2
    torch._C._set_grad_enabled(True)
    return y.requires_grad, (y * x).requires_grad


def set_grad_enabled_as_a_call(x):
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)
    return y.requires_grad, (x * 2).requires_grad


# --------------------------------------------------------------------- saved-tensor hooks disabled
def saved_hooks_disabled(x):
    with torch.autograd.graph.disable_saved_tensors_hooks("not here"):
        y = x.sin()
    return y, y * x


def saved_hooks_nested(x):
    with torch.autograd.graph.disable_saved_tensors_hooks("outer"):
        with torch.autograd.graph.disable_saved_tensors_hooks("inner"):
            y = x.cos()
        z = y.exp()
    return y, z


def saved_hooks_message_read(x):
    with torch.autograd.graph.disable_saved_tensors_hooks("outer"):
        with torch.autograd.graph.disable_saved_tensors_hooks("inner"):
            inner = torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()
        outer = torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()
    after = torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()
    return x.cos(), inner, outer, after


# ------------------------------------------------------------------------------- default dtype
def default_dtype_factories(x):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    y = torch.ones(2) + 1
    z = torch.arange(3) + torch.zeros(3)
    w = torch.tensor([1.5, 2.0])
    seen = torch.get_default_dtype()
    torch.set_default_dtype(prev)
    return y, z, w, seen, x + 1, torch.ones(1)


def default_dtype_promotion_of_inputs(x):
    torch.set_default_dtype(torch.float64)
    y = x.detach() * 2  # a float32 tensor stays float32
    torch.set_default_dtype(torch.float32)
    return y, torch.full((2,), 1.5)


TRACED = [no_grad_decorator, no_grad_without_parentheses, enable_grad_decorator_under_no_grad,
          decorator_on_a_lambda, decorated_helper_raises, user_manager_sets_grad, contextmanager_sets_grad,
          set_grad_enabled_directly, set_grad_enabled_as_a_call, saved_hooks_disabled, saved_hooks_nested,
          default_dtype_factories, default_dtype_promotion_of_inputs]


@pytest.mark.parametrize("fn", TRACED, ids=lambda f: f.__name__)
def test_traced_whole_like_torch_compile(fn) -> None:
    check_traced(fn, _x)
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("fn", [set_grad_enabled_decorator, saved_hooks_message_read], ids=lambda f: f.__name__)
def test_traced_whole_where_torch_compile_breaks(fn) -> None:
    # torch.compile breaks on set_grad_enabled.__call__ and on reading the saved-tensor hooks' state
    check_traced(fn, _x, oracle=False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_changed_default_dtype_gives_eagers_dtypes_on_every_backend(backend) -> None:
    x = torch.randn(2)
    expected = default_dtype_factories(x)
    kiln.reset()
    got = kiln.compile(default_dtype_factories, backend=backend, fullgraph=True)(x)
    assert [type(g) for g in got] == [type(e) for e in expected]
    for g, e in zip(got, expected):
        if isinstance(e, torch.Tensor):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e)
        else:
            assert g == e
    assert torch.get_default_dtype() == torch.float32


def test_the_default_dtype_a_frame_leaves_changed_stays_changed_as_in_eager() -> None:
    def f(x):
        torch.set_default_dtype(torch.float64)
        return torch.ones(1) + x

    try:
        out = kiln.compile(f, backend="eager", fullgraph=True)(torch.zeros(1, dtype=torch.float64))
        assert out.dtype == torch.float64 and torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


def test_an_op_promoting_by_the_changed_default_without_a_dtype_keyword_breaks() -> None:
    def f(x):
        torch.set_default_dtype(torch.float64)
        y = torch.arange(2) * 1.5  # int tensor times a Python float: the default dtype decides
        torch.set_default_dtype(torch.float32)
        return y, x

    with pytest.raises(kiln.errors.GraphBreakError, match="follows the default dtype"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.zeros(1))
    assert torch.get_default_dtype() == torch.float32
    got = kiln.compile(f, backend="aot_eager")(torch.zeros(1))
    assert got[0].dtype == torch.float64 and torch.get_default_dtype() == torch.float32


def test_disabled_saved_tensor_hooks_at_entry_are_guarded() -> None:
    def f(x):
        return x + 1, torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    assert compiled(torch.zeros(1))[1] is None
    with torch.autograd.graph.disable_saved_tensors_hooks("outside"):
        assert compiled(torch.zeros(1))[1] == "outside"
    assert compiled(torch.zeros(1))[1] is None


def test_saved_tensor_hooks_are_refused_inside_the_traced_block_as_in_eager() -> None:
    def f(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("disabled here"):
            with torch.autograd.graph.save_on_cpu():
                return x * 2

    with pytest.raises(RuntimeError, match="disabled here"):
        f(torch.zeros(1))
    with pytest.raises(RuntimeError, match="disabled here"):
        kiln.compile(f, backend="eager")(torch.zeros(1))
    assert torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() is None


@torch.no_grad()
def _global_no_grad_helper(y):
    return y * 2, torch.is_grad_enabled()


@torch.enable_grad()
def _global_enable_grad_helper(y):
    return y * 3, torch.is_grad_enabled()


def global_decorated_helpers(x):
    a, inside_a = _global_no_grad_helper(x)
    with torch.no_grad():
        b, inside_b = _global_enable_grad_helper(x)
    return a, inside_a, a.requires_grad, b, inside_b, b.requires_grad, torch.is_grad_enabled()


def test_helpers_decorated_outside_the_frame() -> None:
    check_traced(global_decorated_helpers, _x)
