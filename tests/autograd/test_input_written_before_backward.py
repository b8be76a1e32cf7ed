"""The caller writes a graph input in place after the forward and before the backward: eager's
backward raises autograd's version-counter error exactly when one of its nodes kept that input (or
a view of it), and gives grads when its nodes kept only values computed from it (sigmoid keeps its
output, a matmul of a transposed input and a batch_first LSTM a contiguous copy). The min-cut
partitioner saved the input itself (it costs no memory) and recomputed from it: the backward
raised where eager's gives grads. Parameters and buffers keep that saving (tested in
test_partition's causal mask).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln


class _Apply(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


PROGRAMS = {
    # eager gives grads
    "sigmoid": (lambda: _Apply(lambda x: x.sigmoid() * 2), (3, 4)),
    "scaled_sigmoid": (lambda: _Apply(lambda x: (x * 2).sigmoid()), (3, 4)),
    "exp_squared": (lambda: _Apply(lambda x: x.exp() ** 2), (3, 4)),
    "relu_of_view": (lambda: _Apply(lambda x: x[1:].relu() * 3), (3, 4)),
    "clones_multiplied": (lambda: _Apply(lambda x: x.clone() * x.clone()), (3, 4)),
    "contiguous_transpose_sin": (lambda: _Apply(lambda x: x.t().contiguous().sin()), (3, 4)),
    "lstm_batch_first": (lambda: nn.LSTM(4, 5, batch_first=True), (2, 3, 4)),
    "lstm_batch_first_two_layers": (lambda: nn.LSTM(4, 5, batch_first=True, num_layers=2), (2, 3, 4)),
    "gru_batch_first": (lambda: nn.GRU(4, 5, batch_first=True), (2, 3, 4)),
    "matmul_of_transpose": (lambda: _Apply(lambda x: x.transpose(0, 1) @ torch.ones(4, 2)), (3, 2, 4)),
    # eager raises
    "sin": (lambda: _Apply(lambda x: x.sin()), (3, 4)),
    "square": (lambda: _Apply(lambda x: x * x), (3, 4)),
    "linear": (lambda: nn.Linear(4, 5), (3, 4)),
    "gelu": (lambda: _Apply(F.gelu), (3, 4)),
    "lstm": (lambda: nn.LSTM(4, 5), (3, 2, 4)),
    "gru": (lambda: nn.GRU(4, 5), (3, 2, 4)),
}


def _forward_write_backward(module, shape, compiled):
    torch.manual_seed(1)
    leaf = torch.randn(*shape, requires_grad=True)
    x = leaf * 1.0  # a non-leaf the caller may write in place
    out = (kiln.compile(module, backend="aot_eager") if compiled else module)(x)
    out = out[0] if isinstance(out, tuple) else out
    with torch.no_grad():
        x.add_(1.0)
    for p in module.parameters():
        p.grad = None
    try:
        out.sum().backward()
    except RuntimeError as error:
        assert "modified by an inplace operation" in str(error)
        return "raised", None
    return "grads", [leaf.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_backward_after_input_written_matches_eager(name) -> None:
    make, shape = PROGRAMS[name]
    module = make()
    expected = _forward_write_backward(module, shape, compiled=False)
    kiln.reset()
    got = _forward_write_backward(module, shape, compiled=True)
    assert got[0] == expected[0]
    if expected[1] is not None:
        for a, b in zip(got[1], expected[1], strict=True):
            torch.testing.assert_close(a, b)
