"""vars() and an instance `__dict__` during capture: on objects made in the frame (a dict over their
very attributes) and from outside (writes through the dict are side effects the later attribute
reads of the trace see; mixing them with attribute writes breaks cleanly), traced whole as
torch.compile traces them and equal to eager (kiln/capture/variables/instance_dict.py)."""
from __future__ import annotations

import torch

import kiln
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Bag:
    pass


class Holder:
    def __init__(self, value=3):
        self.value = value


def test_dict_update_and_vars_of_an_object_made_in_the_frame() -> None:
    def f(x):
        b = Bag()
        b.__dict__.update(a=1, b=x)
        return b.b * b.a, sorted(vars(b))
    check_traced(f, fresh(X))


def test_writes_through_vars_then_attribute_reads() -> None:
    def f(x):
        b = Bag()
        vars(b)["z"] = x
        b.__dict__["w"] = 3
        del b.__dict__["w"]
        return b.z, hasattr(b, "w"), list(b.__dict__)
    check_traced(f, fresh(X))


def test_write_through_vars_of_an_input_is_seen_by_its_attribute() -> None:
    # the attribute read after the write through __dict__ read the old value (a wrong answer)
    def f(x, h):
        vars(h)["value"] = 7
        return x * h.value, h
    check_traced(f, fresh(X, Holder()), calls=2)


def test_new_key_through_dict_then_len_and_items() -> None:
    def f(x, h):
        d = vars(h)
        d["extra"] = 2
        return x * h.extra + len(vars(h)), sorted(vars(h).items()), hasattr(h, "nothing"), h
    check_traced(f, fresh(X, Holder()))


def test_vars_without_arguments_is_locals() -> None:
    def f(x):
        k = 2
        return x * k, sorted(vars())
    check_traced(f, fresh(X), oracle=False)


def test_attribute_write_then_dict_read_breaks_and_matches_eager() -> None:
    def f(x, h):
        h.value = 5
        seen = dict(vars(h))
        vars(h)["other"] = 1
        h.more = 2
        return x * len(seen), sorted(vars(h))
    kiln.reset()
    h_eager, h_kiln = Holder(), Holder()
    want = f(X, h_eager)
    got = kiln.compile(f, backend="eager")(X, h_kiln)
    assert torch.equal(got[0], want[0]) and got[1] == want[1] and vars(h_kiln) == vars(h_eager)
    assert kiln.stats()["fallbacks"] == 0
