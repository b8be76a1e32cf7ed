"""nn.Sequential slices and ModuleList indexing during capture: `seq[a:b](x)` is the children called
in order (kiln/capture/variables/sequential_slice.py), nested slices, negative steps, len and
iteration of a slice, a slice returned from the frame; a ModuleList indexed by an int argument that
changes between calls specializes on it, with torch.compile's graph count."""
from __future__ import annotations

import torch
from torch import nn

import kiln
from semantics_oracle import check_calls, torch_frame_count
from trace_oracle import check_traced

torch.manual_seed(0)
SEQ = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 3), nn.Sigmoid(), nn.Linear(3, 2))


def _x() -> tuple:
    return (torch.arange(4.0).reshape(2, 2) / 4,)


def test_slices_called_and_chained() -> None:
    def f(x):
        return SEQ[:2](x), SEQ[2:](SEQ[:2](x)), SEQ[1:2](x)
    check_traced(f, _x)


def test_nested_slice_len_iteration_and_index() -> None:
    def f(x):
        part = SEQ[1:][:3]
        h = SEQ[0](x)
        for layer in part:
            h = layer(h)
        return h, len(part), part[-1](h), len(SEQ[::-2])
    check_traced(f, _x)


def test_slice_with_a_hook_on_a_child() -> None:
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    seq[2].register_forward_hook(lambda m, i, o: o * 2)

    def f(x):
        return seq[1:](seq[:1](x))
    check_traced(f, _x)


def test_slice_returned_is_a_new_sequential_of_the_same_children() -> None:
    def f(x):
        return SEQ[1:3], x + 1
    kiln.reset()
    part, _ = kiln.compile(f, backend="eager", fullgraph=True)(*_x())
    assert isinstance(part, nn.Sequential) and list(part) == list(SEQ[1:3])


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

    def forward(self, x, i):
        return self.experts[i](x)


def test_module_list_indexed_by_a_changing_int_argument() -> None:
    net = Experts()
    x = _x()[0]
    calls = [(x, 0), (x, 1), (x, 2), (x, 0), (x, -1)]
    check_calls(net, calls, fullgraph=True)
    assert kiln.stats()["graphs"] <= torch_frame_count(net, calls)
