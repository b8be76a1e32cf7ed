"""Builtins and the standard library inside a compiled function, as PyTorch tests its own Dynamo
(test_functions.py, test_misc.py, test_builtins.py): each program of tests/capture/dynbuiltins_cases
runs eagerly and through kiln.compile(backend="eager") over its calls; the values returned (or the
exceptions raised, type and text), the arguments as the calls left them and the state read from
outside must agree, with no fallback to eager.

Where a class of calls used to break the graph (heapq's and bisect's C functions, operator.setitem /
delitem / length_hint, a builtin method bound to an immutable value, `Counter.most_common`), the
programs of _WHOLE also count the breaks: none.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import importlib.util
import operator
import os
import random
import warnings
from typing import Any

import pytest
import torch

import kiln
from semantics_oracle import same

_CASES = os.path.join(os.path.dirname(__file__), "dynbuiltins_cases")
_MODULES = ("iters", "func", "coll", "dc", "text", "bi", "hard", "args", "new")


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"dynbuiltins_cases_{name}", os.path.join(_CASES, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _programs(sample: bool = False) -> list[Any]:
    """Every program; with `sample`, the ones outside a fixed sample (every 10th, and the programs of
    _WHOLE) are marked slow, so `make test` runs about a sixth of them."""
    out = []
    for name in _MODULES:
        for prog in _load(name).PROGS:
            ident = f"{name}.{prog[0]}"
            marks = [pytest.mark.slow] if sample and ident not in _WHOLE and len(out) % 10 else []
            out.append(pytest.param(ident, prog, id=ident, marks=marks))
    return out


# the programs of classes that used to break the graph: traced whole now
_WHOLE = ("new.heap_push_pop", "new.heapify_layout", "new.heap_user_lt", "new.heap_arg", "new.nlargest_key",
          "new.merge_list", "new.counter_most_common", "new.bisect_ops", "new.bisect_key", "new.bisect_shape",
          "new.op_setitem_del", "new.op_setitem_arg", "new.op_length_hint", "new.frozenset_method",
          "new.str_method_bound", "new.int_method_bound", "new.tuple_method_bound", "new.sort_const_tuples",
          "new.sort_then_unpack", "coll.counter1", "args.heapq_local", "args.bisect_local", "func.op_setitem",
          "func.op_index", "new.tuple_order_tensors", "new.heap_of_entries", "new.heap_tensors_tuples")


def _args(make: Any, i: int) -> tuple:
    return make(i) if make.__code__.co_argcount else make()


def _norm(v: Any) -> Any:
    """Containers of collections and dataclasses as plain structures `same` compares."""
    if isinstance(v, collections.deque):
        return ("deque", [_norm(a) for a in v], v.maxlen)
    if isinstance(v, collections.defaultdict):
        return ("defaultdict", v.default_factory is None, {k: _norm(a) for k, a in v.items()})
    if isinstance(v, collections.ChainMap):
        return ("chainmap", [_norm(m) for m in v.maps])
    if isinstance(v, collections.OrderedDict):
        return ("ordereddict", [(k, _norm(a)) for k, a in v.items()])
    if isinstance(v, collections.Counter):
        return ("counter", dict(v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__, [_norm(getattr(v, f.name)) for f in dataclasses.fields(v)])
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return (type(v).__name__, [_norm(a) for a in v])
    if isinstance(v, (list, tuple)):
        return type(v)(_norm(a) for a in v)
    if type(v) is dict:
        return {k: _norm(a) for k, a in v.items()}
    return v


def _outcome(fn: Any, args: tuple) -> tuple:
    try:
        return ("ok", _norm(fn(*args)))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc), str(exc))


def _same_outcome(got: tuple, want: tuple) -> bool:
    if got[0] != want[0]:
        return False
    return bool(same(got[1], want[1])) if want[0] == "ok" else got[1:] == want[1:]


@pytest.mark.parametrize("ident,prog", _programs(sample=True))
def test_program_matches_eager(ident: str, prog: Any) -> None:
    name, fn, make, *rest = prog
    calls = rest[0] if rest else 1
    reset = rest[1] if len(rest) > 1 else None
    if reset:
        reset()
    eager = []
    for i in range(calls):
        args = _args(make, i)
        eager.append((_outcome(fn, args), _norm(args)))
    if reset:
        reset()
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            args = _args(make, i)
            got = _outcome(compiled, args)
            want, want_args = eager[i]
            assert _same_outcome(got, want), f"call {i}: compiled {got!r}, eager {want!r}"
            assert same(_norm(args), want_args), f"call {i}: arguments left {args!r}, eager {want_args!r}"
    fallbacks = [str(w.message) for w in caught if type(w.message).__name__ == "KilnWarning"]
    assert not fallbacks, fallbacks
    if ident in _WHOLE:
        assert kiln.stats()["graph_breaks"] == 0, kiln.explain(fn)(*_args(make, 0))


def test_every_whole_program_exists() -> None:
    ids = {p.values[0] for p in _programs()}
    assert set(_WHOLE) <= ids, set(_WHOLE) - ids


# ---- Python's random module seeded inside the frame (kiln/capture/variables/python_random.py) ----

def _seeded_draws(x):
    random.seed(0)
    return x * random.random() + random.randint(1, 10), random.uniform(-1, 1)


def _seeded_loop(x):
    random.seed(3)
    for _ in range(3):
        x = x * random.uniform(0.5, 1.5)
    return x


def _seeded_choices(x):
    random.seed("text")
    return x * random.choice([1, 2, 3]), random.sample([5, 6, 7, 8], 2), random.choices("xyz", k=3), \
        random.gauss(0.0, 1.0), random.randrange(0, 100, 7), random.getrandbits(12)


def _reseeded(x):
    random.seed(1)
    a = random.random()
    random.seed(1)
    return x + a - random.random()


def _seeded_then_break(x):
    random.seed(7)
    y = x + random.gauss(0, 1)
    print("", end="")  # a graph break: the generator is left where eager leaves it before the call
    return y + random.random()


def _draw_before_seed(x):
    a = random.random()  # the caller's state: a break, made for real
    random.seed(2)
    return x * a + random.random()


def _seeded_shuffle(x):
    random.seed(4)
    items = [1, 2, 3, 4]
    random.shuffle(items)  # writes into a list: made for real (a break), from the seeded state
    return x * items[0], items, random.random()


@pytest.mark.parametrize("fn,whole", [(_seeded_draws, True), (_seeded_loop, True), (_seeded_choices, True),
                                      (_reseeded, True), (_seeded_then_break, False), (_draw_before_seed, False),
                                      (_seeded_shuffle, False)])
def test_random_seeded_in_frame(fn: Any, whole: bool) -> None:
    """Each call returns eager's values and leaves the module's generator where eager leaves it
    (the next draw after the call agrees), from a caller's state that differs between calls."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for outer in (11, 12, 11):
        random.seed(outer)
        want = _outcome(fn, (torch.ones(3),))
        want_next = random.random()
        random.seed(outer)
        got = _outcome(compiled, (torch.ones(3),))
        assert _same_outcome(got, want), (got, want)
        assert random.random() == want_next
    assert kiln.stats()["fallbacks"] == 0
    assert (kiln.stats()["graph_breaks"] == 0) == whole, kiln.stats()


def _bisected_scale(x):
    bounds = [1, 3, 5]
    bisect.insort(bounds, 4)
    return x * bisect.bisect_left(bounds, 4) + operator.length_hint(bounds)


@pytest.mark.parametrize("fn", [_seeded_loop, _seeded_draws, _bisected_scale])
def test_graph_count_matches_dynamo(fn: Any) -> None:
    """One graph, as torch.compile makes (it models a seeded generator and runs bisect's Python)."""
    from torch_oracle import torch_graph_count

    calls = [(torch.ones(3),), (torch.ones(3),)]
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for args in calls:
        compiled(*args)
    assert backend.frame_count == torch_graph_count(fn, calls) == 1
