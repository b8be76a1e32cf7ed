"""Code that asks `torch.compiler.is_compiling()` takes another path under capture than in eager
(transformers: `if mask is None and not is_torchdynamo_compiling(): mask = torch.ones(...)`, then
`mask[:, None, None, :]`). Where that path raises, eager (is_compiling() False) may never raise:
as torch.compile, the frame runs eagerly instead of raising the trace's error through a break.
Before: the glue raised TypeError ('NoneType' object is not subscriptable) to the caller, where
eager and torch.compile return a value.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln


class _MaskedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones_like(x)
        return self.lin(x * mask[:, :])


def _fn_default_filled_in_eager(x, m=None):
    if not torch.compiler.is_compiling():
        m = x + 1
    return x * m[0]


def _fn_attribute_of_none(x, cfg=None):
    if not torch._utils.is_compiling():
        cfg = {"scale": 2.0}
    return x * cfg["scale"]


def _fn_dynamo_spelling(x, m=None):
    if m is None and not torch.compiler.is_dynamo_compiling():
        m = torch.zeros_like(x)
    return (x + m).sum(0) + len(m)


def _fn_attribute_read_of_none(x, m=None):
    if not torch.compiler.is_compiling():
        m = x
    return x + len(m.shape)  # None.shape on the compiling path: AttributeError


def _fn_method_of_none(x, m=None):
    if not torch.compiler.is_compiling():
        m = x
    return m.mul(2) + x


CASES = {
    "module_mask": (lambda: _MaskedLinear(), (torch.randn(2, 4),)),
    "attribute_read_of_none": (lambda: _fn_attribute_read_of_none, (torch.randn(3),)),
    "method_of_none": (lambda: _fn_method_of_none, (torch.randn(3),)),
    "default_filled_in_eager": (lambda: _fn_default_filled_in_eager, (torch.randn(3, 2),)),
    "subscript_of_none": (lambda: _fn_attribute_of_none, (torch.randn(3),)),
    "dynamo_spelling": (lambda: _fn_dynamo_spelling, (torch.randn(3, 2),)),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_error_on_the_compiling_path_runs_the_frame_eagerly(name, backend) -> None:
    make, args = CASES[name]
    fn = make()
    kiln.reset()
    got = kiln.compile(fn, backend=backend)(*args)
    # eager's value (torch.compile agrees on module_mask, default_filled_in_eager, subscript_of_none;
    # on dynamo_spelling's `x + None` it raises TorchRuntimeError)
    torch.testing.assert_close(got, fn(*args))
    assert kiln.stats()["fallbacks"] >= 1


def test_the_fallback_reason_names_is_compiling() -> None:
    kiln.reset()
    report = kiln.explain(_fn_default_filled_in_eager)(torch.randn(3, 2))
    assert "is_compiling()" in str(report)


def test_eagers_own_error_still_breaks_and_raises() -> None:
    """Without an is_compiling() read the path is eager's: the graph before the error is compiled
    and the error is eager's."""
    def f(x):
        y = x * 2
        return y[None][5]

    kiln.reset()
    with pytest.raises(IndexError):
        f(torch.ones(2))
    with pytest.raises(IndexError):
        kiln.compile(f)(torch.ones(2))
    assert kiln.stats()["graphs"] == 1


def test_an_error_eager_raises_too_is_eagers_after_an_is_compiling_read() -> None:
    def f(x):
        scale = 2.0 if torch.compiler.is_compiling() else 2.0
        return (x * scale)[None][7]

    kiln.reset()
    with pytest.raises(IndexError):
        kiln.compile(f)(torch.ones(2))


def test_an_error_handled_inside_the_frame_keeps_the_graph() -> None:
    def f(x, m=None):
        if not torch.compiler.is_compiling():
            m = x
        try:
            return x + m[0]
        except TypeError:
            return x - 1

    kiln.reset()
    # the compiled path takes the handler (is_compiling() is True there), as torch.compile does
    torch.testing.assert_close(kiln.compile(f)(torch.ones(2)), torch.compile(f, backend="eager")(torch.ones(2)))
