"""Graph inputs whose sources differ only in case or punctuation (`w` and `W`, `d["a-b"]` and `d["a_b"]`,
`x_y` and `x.y`): their readable placeholder names coincide, and the graph's code must still take each
as its own argument (was: "duplicate argument 'l_w'", an internal error and the frame run eagerly)."""
from __future__ import annotations

import types

import pytest
import torch

import kiln
from kiln.backends import CountingBackend


def _case_only(w, W):
    return w * 2 + W


def _dict_keys(d):
    return d["a-b"] * 3 - d["a_b"] + d["a.b"]


def _attr_and_name(x_y, x):
    return x_y + x.y * 2


def _three_cases(v, V, v_):
    return v - V * 2 + v_ * 3


CASES = {
    "case_only": (_case_only, lambda: (torch.randn(3), torch.randn(3))),
    "dict_keys": (_dict_keys, lambda: ({"a-b": torch.randn(2), "a_b": torch.randn(2), "a.b": torch.randn(2)},)),
    "attr_and_name": (_attr_and_name, lambda: (torch.randn(4), types.SimpleNamespace(y=torch.randn(4)))),
    "three_cases": (_three_cases, lambda: (torch.randn(2), torch.randn(2), torch.randn(2))),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_inputs_with_colliding_names_are_separate_arguments(name, backend):
    fn, make = CASES[name]
    args = make()
    kiln.reset()
    if backend == "eager":
        counter = CountingBackend()
        got = kiln.compile(fn, backend=counter, fullgraph=True)(*args)
        assert counter.frame_count == 1
    else:
        got = kiln.compile(fn, backend=backend, fullgraph=True)(*args)
    torch.testing.assert_close(got, fn(*args))  # inductor may contract a*3 - b into one rounding
    assert kiln.stats()["fallbacks"] == 0
