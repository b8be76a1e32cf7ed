"""`del obj.name` / `delattr` during capture (kiln/capture/variables/attribute_deletion.py): on objects
made in the frame and from outside, seen by later reads of the trace (hasattr, getattr's default, a
caught AttributeError), replayed on the real object, and guarded so that a later call on an object
that lacks the attribute raises eager's AttributeError."""
from __future__ import annotations

import pytest
import torch

import kiln
from trace_oracle import check_traced, fresh


class Holder:
    def __init__(self, value=3):
        self.value = value


class WithProperty:
    def __init__(self):
        self._v = 1

    @property
    def v(self):
        return self._v

    @v.deleter
    def v(self):
        del self._v


X = torch.arange(3.0)


def test_set_then_delattr_on_an_input_object() -> None:
    def f(x, obj):
        setattr(obj, "extra", 5)
        out = x + obj.extra + getattr(obj, "nothing", 7)
        delattr(obj, "extra")
        return out, hasattr(obj, "extra"), getattr(obj, "extra", -1), obj
    check_traced(f, fresh(X, Holder()), calls=2)


def test_del_of_an_attribute_that_was_there() -> None:
    def f(x, obj):
        y = x * obj.value
        del obj.value
        try:
            obj.value
        except AttributeError:
            y = y + 1
        return y, obj
    check_traced(f, fresh(X, Holder(4)), calls=2)


def test_deleted_then_set_again() -> None:
    def f(x, obj):
        del obj.value
        obj.value = x.sum()
        return x * obj.value, obj
    check_traced(f, fresh(X, Holder()))


def test_delete_on_object_made_in_the_frame_then_returned() -> None:
    def f(x):
        b = Holder(x)
        b.other = 2
        del b.value
        return hasattr(b, "value"), b.other * x, b
    got = kiln.compile(f, backend="eager", fullgraph=True)(X)
    assert got[0] is False and vars(got[2]) == {"other": 2}
    check_traced(lambda x: f(x)[:2], fresh(X))


def test_a_later_call_on_an_object_without_it_raises_as_eager() -> None:
    def f(x, obj):
        del obj.value
        return x + 1

    obj = Holder()
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    compiled(X, obj)
    assert not hasattr(obj, "value")
    with pytest.raises(AttributeError):
        compiled(X, obj)
    obj.value = 3
    assert torch.equal(compiled(X, obj), X + 1) and not hasattr(obj, "value")


def test_delete_through_a_property_deleter_breaks_cleanly_and_matches_eager() -> None:
    def f(x, obj):
        del obj.v
        return x + hasattr(obj, "_v")
    kiln.reset()
    obj_eager, obj_kiln = WithProperty(), WithProperty()
    want = f(X, obj_eager)
    got = kiln.compile(f, backend="eager")(X, obj_kiln)
    assert torch.equal(got, want) and vars(obj_kiln) == vars(obj_eager)
