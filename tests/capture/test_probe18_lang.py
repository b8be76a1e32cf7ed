"""Python-language classes of bug found by the 18th probe (Dynamo-style programs kept outside the
repository, /work/scratch/probelang5): each test runs eagerly and through
kiln.compile(backend="eager") and compares values and raised exceptions, and where it matters the
number of graphs.

- `size in (3, 4)` (and operator.countOf / indexOf, `in dict.values()`) with a symbolic size
  compared each item by the trace's "a size never equals a constant" rule: always False, with no
  guard, so after automatic dynamic a size in the list took the wrong branch (a wrong answer);
  the ShapeEnv now decides `s0 == 3` and guards it;
- iterating or unpacking a 0-d tensor (a for loop, list(), `a, b = t`) was an internal error
  (IndexError in the trace) and len() of one a graph break: eager's TypeError is raised where the
  program can catch it;
"""
from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Sequence

import torch

import kiln
from kiln.log import KilnWarning
from semantics_oracle import same


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc))


def run(fn: Callable[..., Any], calls: Sequence[tuple], graphs: int | None = None,
        fallbacks: bool = False) -> None:
    """Each call eager then compiled; no internal error (a KilnWarning), no graph break, no frame
    run eagerly unless `fallbacks`; `graphs`: how many graphs."""
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for i, args in enumerate(calls):
        want = outcome(fn, *args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = outcome(compiled, *args)
        assert not [w for w in caught if issubclass(w.category, KilnWarning)], [str(w.message) for w in caught]
        assert want[0] == got[0] and (same(got[1], want[1]) if want[0] == "ok" else got[1] is want[1]), \
            f"call {i}: compiled gave {got!r}, eager {want!r}"
    assert (fallbacks or kiln.stats()["fallbacks"] == 0) and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    if graphs is not None:
        assert backend.frame_count == graphs, f"{backend.frame_count} graphs, expected {graphs}"


SIZES = [(torch.zeros(n),) for n in (3, 5, 4, 7, 6, 3)]


# ---- a symbolic size compared with the items of a container --------------------------------------
def test_size_in_list_after_automatic_dynamic() -> None:
    def f(x):
        if x.shape[0] in [3, 4]:
            return x + 1
        return x - 1
    run(f, SIZES)


def test_size_in_tuple_three_items() -> None:
    def f(x):
        if x.shape[0] in (3, 4, 7):
            return x * 2
        return x - 1
    run(f, SIZES)


def test_size_not_in_list() -> None:
    def f(x):
        if x.shape[0] not in [4, 6]:
            return x + 5
        return x - 1
    run(f, SIZES)


def test_size_countof_and_indexof() -> None:
    def f(x):
        n = operator.countOf((4, 4, 3), x.shape[0])
        i = operator.indexOf([5, 4, 3], x.shape[0]) if x.shape[0] in (3, 4, 5) else -1
        return x + n * 10 + i
    run(f, SIZES)


def test_size_in_dict_values() -> None:
    def f(x):
        d = {"a": 3, "b": 4}
        if x.shape[0] in d.values():
            return x + 1
        return x - 1
    run(f, SIZES)


# ---- a 0-d tensor iterated ---------------------------------------------------------------------
def test_for_over_0d_tensor_raises_catchable() -> None:
    def f(x):
        try:
            for v in x.sum():
                x = x + v
        except TypeError:
            return x - 1
        return x
    run(f, [(torch.ones(3),)], graphs=1)


def test_list_of_0d_tensor_raises() -> None:
    def f(x):
        try:
            return list(x.sum())
        except TypeError as e:
            return x + len(str(e))
    run(f, [(torch.ones(3),)], graphs=1)


def test_len_of_0d_tensor_raises_catchable() -> None:
    def f(x):
        try:
            return x + len(x.sum())
        except TypeError:
            return x * 3
    run(f, [(torch.ones(3),)], graphs=1)


def test_unpack_0d_tensor_escapes() -> None:
    def f(x):
        a, b = (x * 2).sum()
        return a
    run(f, [(torch.ones(3),)], fallbacks=True)
