"""torch's mode managers entered through contextlib.ExitStack (enter_context calls
`type(cm).__enter__(cm)`, not a `with`), and `t.new_tensor(ndarray)`.

ExitStack: torch.compile runs such a frame eagerly; Kiln breaks around each protocol call, so each
runs on the real manager object (its __exit__ found the attributes its __enter__ sets: an autocast
entered through a stack raised AttributeError at the stack's exit). Values, dtypes, grad mode after
the call and exceptions are eager's. new_tensor of a traced ndarray: one graph, as torch.compile
makes, with eager's dtype (the tensor's own, or the one given)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import kiln


def stack_autocast(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        y = x @ x
    return y + 1


def stack_no_grad(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        y = x * 2
    return y + 1, torch.is_grad_enabled()


def stack_two_managers(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        y = x @ x.t()
    return y.float().sum(), torch.is_autocast_enabled("cpu")


AUTOCAST = torch.autocast("cpu", dtype=torch.bfloat16)  # a manager made outside the frame


def stack_outside_manager(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(AUTOCAST)
        y = x @ x
    return y


def stack_raises_inside(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        if x.shape[0] == 3:
            raise KeyError("inside the stack")
    return x


def manual_enter_exit(x):
    cm = torch.autocast("cpu", dtype=torch.bfloat16)
    type(cm).__enter__(cm)
    y = x @ x
    type(cm).__exit__(cm, None, None, None)
    return y + 1


def _outcome(fn, x):
    try:
        out = fn(x)
    except KeyError as exc:
        return ("raised", str(exc), torch.is_autocast_enabled("cpu"))
    outs = out if isinstance(out, tuple) else (out,)
    return tuple((o.dtype, o.tolist()) if isinstance(o, torch.Tensor) else o for o in outs) + (
        torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))


@pytest.mark.parametrize("fn", [stack_autocast, stack_no_grad, stack_two_managers, stack_outside_manager,
                                stack_raises_inside, manual_enter_exit], ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_managers_entered_through_an_exit_stack_behave_as_in_eager(fn, backend):
    x = torch.randn(3, 3)
    expected = _outcome(fn, x)
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    assert _outcome(compiled, x) == expected
    assert _outcome(compiled, x) == expected  # the cached entries too


def new_tensor_default_dtype(x):
    return x + x.new_tensor(np.array([1.0, 2.0, 3.0]))


def new_tensor_given_dtype(x):
    return x.new_tensor(np.arange(3), dtype=torch.float64) * 2


def new_tensor_of_ints(x):
    return x.new_tensor(np.array([1, 2, 3])) * x


def new_tensor_returned_and_used(x):
    t = x.new_tensor(np.ones(3) * 0.5)
    return t, x * t


@pytest.mark.parametrize("fn", [new_tensor_default_dtype, new_tensor_given_dtype, new_tensor_of_ints,
                                new_tensor_returned_and_used], ids=lambda f: f.__name__)
def test_new_tensor_of_an_ndarray_is_one_graph_like_torch_compile(fn):
    x = torch.randn(3)
    expected = fn(x)
    kiln.reset()
    got = kiln.compile(fn)(x)
    for a, b in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        assert a.dtype == b.dtype and not a.requires_grad
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()
    real = torch._dynamo.explain(fn)(x)
    kiln.reset()
    ours = kiln.explain(fn)(x)
    assert (ours.graph_count, ours.graph_break_count) == (real.graph_count, real.graph_break_count) == (1, 0)
