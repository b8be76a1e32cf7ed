"""Programs of the kind PyTorch tests its Dynamo and AOT autograd runtime with (dynrepros_programs.py:
input and metadata mutation, aliased inputs, aliasing outputs, no_grad parameter updates, .data
writes, buffers, views mutated in place, out=, promotion, overflow, division by zero, empty and
dynamic shapes), each run eagerly and through kiln.compile: the same outputs (values, sizes, strides,
offsets, requires_grad, version counters), the same arguments afterwards, the same aliasing among
outputs and arguments (object, storage, data pointer, _base), the same grads after a backward
through the outputs, the same exception type (dynrepros_check.py).

Every program runs under aot_eager (the programs in the CI slice: every fourth; the rest is marked
slow); the programs marked `ind` also run under the default backend (inductor) in CI, and every
program under inductor is a slow sweep. KNOWN lists the differences left, each with its reason; the
test checks they still differ, so a fix shows.
"""
from __future__ import annotations

import pytest
import torch

import dynrepros_programs as P
from dynrepros_check import compare

PROGRAMS = {name: (fn, make, calls, dynamic, ind) for name, fn, make, calls, dynamic, ind in P.PROGRAMS}

# name -> (the backends where Kiln's answer still differs from eager's, why); the test requires it to differ
_BOTH = ("aot_eager", "inductor")
_VIEW_OF_INTERMEDIATE = ("a view of an intermediate returned without its base, after the base (or the view) was "
                         "updated in place or re-laid out: Kiln's output is no view (_is_view False, _base None); "
                         "values, strides and grads agree")
KNOWN = {
    "bw_autograd_grad_create_graph": (_BOTH, "a second backward through gradients a compiled graph computed raises "
                                      "Kiln's clear error (torch.compile raises too): no double backward"),
    "ng_inference_mode": (("aot_eager",), "the sum of an inference tensor outside inference mode: eager's result "
                          "has version 1, Kiln's 0 (values and everything else agree)"),
    "ss_set_then_write": (_BOTH, "`y = torch.empty(0); y.set_(x); y.add_(1)`: eager's y has its own version "
                          "counter, so x's stays 0; Kiln's write to x counts (values and aliasing agree)"),
    "vb_intermediate_view_then_mutate_0": (("inductor",), _VIEW_OF_INTERMEDIATE),
    "vb_intermediate_view_then_mutate_1": (_BOTH, _VIEW_OF_INTERMEDIATE),
    "ow_squeeze_inplace_view_1": (("aot_eager",), _VIEW_OF_INTERMEDIATE),
    "ow_complex_grad": (("aot_eager",), _VIEW_OF_INTERMEDIATE),
    "da_then_set_back": (("aot_eager",), "`w.data = v` (run natively: v is an input) then `w.data = <fresh>` in the "
                         "next graph, whose inputs w and v shared a storage on entry: w's version counter moves to 1 "
                         "(eager 0)"),
}


def _reset() -> None:
    for reset in P.RESETS:
        reset()


def _check(name: str, backend: str) -> None:
    fn, make, calls, dynamic, _ = PROGRAMS[name]
    diffs, _, _ = compare(fn, make, backend=backend, dynamic=dynamic, calls=calls, reset=_reset)
    if backend in KNOWN.get(name, ((), ""))[0]:
        assert diffs, f"{name} now agrees with eager: take it out of KNOWN"
        return
    assert not diffs, "\n".join(diffs)


def _params(select) -> list:
    return [pytest.param(name, marks=() if select(i, name) else pytest.mark.slow)
            for i, name in enumerate(PROGRAMS)]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", _params(lambda i, name: i % 4 == 0))
def test_aot_eager(name: str) -> None:
    _check(name, "aot_eager")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", _params(lambda i, name: PROGRAMS[name][4]))
def test_inductor(name: str) -> None:
    _check(name, "inductor")


def test_program_count() -> None:
    assert len(PROGRAMS) >= 300 and len({fn for fn, *_ in PROGRAMS.values()}) >= 200
