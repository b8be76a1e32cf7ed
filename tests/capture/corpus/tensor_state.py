"""Corpus: a tensor's state read as a value and guarded: Python attributes a program sets on a
tensor (present, absent, set later), .grad, requires_grad, and metadata (strides, storage offset,
contiguity) that branch the program.
"""
from __future__ import annotations

import torch

from .program import Program, case


def _attr_calls(f):
    """Calls f on one tensor before and after the program gives it an attribute, then changes it."""
    def drive(sub):
        x = torch.ones(2)
        before = sub(x)
        x.scale = 5.0
        set_once = sub(x)
        x.scale = 7.0
        changed = sub(x)
        del x.scale
        return before, set_once, changed, sub(x)
    return Program(f, drive=drive)


@case("tensor_state", fullgraph=False)
def tensor_python_attribute_getattr_default():
    return _attr_calls(lambda x: x * getattr(x, "scale", 1.0))


@case("tensor_state", fullgraph=False)
def tensor_python_attribute_hasattr():
    return _attr_calls(lambda x: x * x.scale if hasattr(x, "scale") else x - 1)


@case("tensor_state", fullgraph=False)
def tensor_class_attribute_hasattr_is_not_guarded_away():
    return _attr_calls(lambda x: (x * 2, hasattr(x, "grad_fn"), hasattr(x, "is_leaf"), hasattr(x, "nope")))


@case("tensor_state", fullgraph=False)
def parameter_python_attribute_hasattr():
    w = torch.nn.Parameter(torch.ones(3))

    def f(x):
        return x * w * (w.lr_scale if hasattr(w, "lr_scale") else 1.0)

    def drive(sub):
        a = sub(torch.ones(3))
        w.lr_scale = 0.5
        return a, sub(torch.ones(3))
    return Program(f, drive=drive)


@case("tensor_state", fullgraph=False)
def is_leaf_of_leaf_nonleaf_and_detached_inputs():
    # a non-leaf input and a leaf that requires grad pass the same tensor guard: the read of
    # is_leaf needs its own
    def f(x):
        return (x * 2 if x.is_leaf else x * 3), x.is_leaf

    def drive(sub):
        leaf = torch.randn(3, requires_grad=True)
        return sub(leaf), sub(leaf * 1), sub(leaf.detach()), sub(leaf)
    return Program(f, drive=drive)
