"""Python object protocols on a traced tensor (copy.deepcopy, dataclasses.asdict/astuple, pickling
hooks) never run as graph nodes: Tensor.__deepcopy__ as a node of the graph ran on fake tensors in
AOT autograd and failed (an internal error, the frame run eagerly). copy.deepcopy of a plain tensor
is a clone in the graph (kiln/capture/variables/object_copy.py); one that requires grad is a break."""
from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning


@dataclasses.dataclass
class _State:
    w: torch.Tensor
    scale: float = 1.0


def _deepcopy_then_mutate(x, w):
    c = copy.deepcopy(w)
    c.add_(1)
    return x + c, w


def _asdict_then_mutate(x, s):
    d = dataclasses.asdict(s)
    d["w"].mul_(3)
    w, scale = dataclasses.astuple(s)
    return x + d["w"] * scale, s.w, w


def _deepcopy_list_of_tensors(x, ws):
    copies = copy.deepcopy(ws)
    copies[0].zero_()
    return x + copies[0] + copies[1], copies[0] is copies[1], ws[0]


@pytest.mark.cpp
@pytest.mark.parametrize("fn, make", [
    (_deepcopy_then_mutate, lambda: (torch.ones(3),)),
    (_asdict_then_mutate, lambda: (_State(torch.ones(3), 2.0),)),
    (_deepcopy_list_of_tensors, lambda: ([torch.full((3,), 2.0)] * 2,)),
])
def test_deepcopy_of_tensors_in_the_frame_matches_eager_with_no_fallback(fn, make) -> None:
    kiln.reset()
    compiled = kiln.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error warns and runs the frame eagerly
        for _ in range(2):
            x = torch.arange(3.0)
            got, expected = compiled(x, *make()), fn(x, *make())
            assert repr(got) == repr(expected)


def test_deepcopy_of_a_plain_tensor_is_a_clone_in_the_graph() -> None:
    kiln.reset()
    explained = kiln.explain(_deepcopy_then_mutate)(torch.zeros(3), torch.ones(3))
    assert explained.graph_break_count == 0 and ".clone()" in str(explained), explained


def test_deepcopy_of_a_leaf_that_requires_grad_is_a_break_naming_why() -> None:
    # eager makes the copy a new leaf of its own, which no graph op makes
    kiln.reset()
    explained = kiln.explain(lambda x, w: x + copy.deepcopy(w))(torch.zeros(3), torch.ones(3, requires_grad=True))
    assert "requires grad: eager makes a new leaf" in str(explained), explained
