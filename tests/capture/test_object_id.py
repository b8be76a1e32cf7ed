"""id() of values whose identity is known at trace time but whose number is not (a tensor, an object
or a list made in the frame): id(a) == id(b) decides as `a is b` does, traced whole as torch.compile
traces it; the aliasing of inputs is guarded (the same tensor passed twice recompiles), and any use
of the number itself is a clean break or is rebuilt at run time (kiln/capture/variables/object_id.py)."""
from __future__ import annotations

import torch

import kiln
from semantics_oracle import check_calls
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Token:
    pass


def compare_ids(x, y):
    alias = x
    out = x * 0
    if id(alias) == id(x):
        out = out + 1
    if id(y) != id(x):
        out = out + 10
    if id(x) is not None:
        out = out + 100
    return out


def test_ids_of_tensors_compared() -> None:
    check_traced(compare_ids, fresh(X, X + 1))


def test_the_same_tensor_passed_twice_then_two_tensors() -> None:
    x, y = X.clone(), X + 1
    compiled = check_calls(compare_ids, [(x, x), (x, y), (y, y)])
    assert torch.equal(compiled(x, x), compare_ids(x, x))


def test_ids_of_objects_and_lists_made_in_the_frame() -> None:
    def f(x):
        a, b = Token(), [x]
        same = id(a) == id(a)
        other = id(a) == id(b)
        held = id(b[0]) == id(x)
        return x + same + 10 * other + 100 * held
    check_traced(f, fresh(X))


def test_id_used_as_a_number_breaks_and_matches_eager() -> None:
    def f(x):
        a = Token()
        seen = {id(a): 1}
        return x + len(seen), id(x) == 5
    kiln.reset()
    got = kiln.compile(f, backend="eager")(X)
    assert torch.equal(got[0], X + 1) and got[1] is False


def test_id_returned_is_the_id_at_run_time() -> None:
    def f(x):
        return x + 1, id(x)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for t in (X.clone(), X + 5):
        assert compiled(t)[1] == id(t)
