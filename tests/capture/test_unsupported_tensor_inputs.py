"""Tensors capture does not trace (nested, quantized) are refused with a graph break, not an
internal error: the frame runs eagerly with eager's values and no fallback warning."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning


def _nested(layout: torch.layout) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the strided layout's prototype warning
        return torch.nested.nested_tensor([torch.ones(2, 3), torch.arange(12.0).view(4, 3)], layout=layout)


PROGRAMS = {
    "nested_padded": (lambda nt: nt.to_padded_tensor(0.0) * 2, torch.strided),
    "nested_unbind": (lambda nt: [t.sum() for t in nt.unbind()], torch.strided),
    "jagged_padded": (lambda nt: nt.to_padded_tensor(0.0) + 1, torch.jagged),
}


@pytest.mark.parametrize("dynamic", [False, None], ids=["static", "automatic"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_nested_tensor_inputs_break_cleanly(name: str, dynamic: bool | None) -> None:
    # the input's sizes were read (to pick dynamic dims) before its kind was checked: a nested
    # tensor has none, and that RuntimeError became an internal-error fallback
    fn, layout = PROGRAMS[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        for _ in range(2):
            got, expected = compiled(_nested(layout)), fn(_nested(layout))
            for g, e in zip(got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected]):
                torch.testing.assert_close(g, e)
    with pytest.raises(kiln.errors.GraphBreakError, match="nested|NestedTensor"):
        kiln.compile(fn, backend="eager", fullgraph=True)(_nested(layout))


@pytest.mark.cpp
def test_quantize_in_the_frame_breaks_under_the_default_backend() -> None:
    # the meta kernel's float32 result was traced: at run time the extern returned qint8 and the
    # graph fell back to eager with an internal error
    def f(x):
        q = torch.quantize_per_tensor(x * 2, 0.1, 0, torch.qint8)
        return q.dequantize() + x, q.int_repr()

    kiln.reset()
    compiled = kiln.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        for _ in range(2):
            x = torch.randn(5)
            for g, e in zip(compiled(x), f(x)):
                torch.testing.assert_close(g, e)
