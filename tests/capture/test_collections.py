"""namedtuple and OrderedDict built and used inside the frame stay in one graph.

Each program runs on backend "eager" against eager, and its graph count is compared with the
real torch._dynamo.explain (the oracle): Kiln must not need more graphs or breaks.
"""
from __future__ import annotations

import collections
import typing

import pytest
import torch
import torch._dynamo

import kiln

Pair = collections.namedtuple("Pair", ["a", "b"], defaults=[None])


class Scaled(typing.NamedTuple):
    value: torch.Tensor
    scale: int = 3

    def scaled(self) -> torch.Tensor:
        return self.value * self.scale

    @property
    def doubled(self) -> torch.Tensor:
        return self.value * 2


def replace_fields(x):
    p = Pair(x, x + 1)
    q = p._replace(b=x * 2)
    return q.a + q.b, q


def replace_on_an_input(p, x):
    return p._replace(a=p.a + x)


def typed_namedtuple_methods(x):
    n = Scaled(x)
    m = n._replace(scale=5)
    return m.scaled(), m.doubled, m, Scaled._make((x, 2)), n._fields


def as_dict_and_make(x):
    p = Pair(x, 1)
    q = p._replace(a=x + 1)
    return q._asdict()["a"], Pair._make([x, 2]).b, dict(q._asdict())


def ordered_dict_built_up(x):
    d = collections.OrderedDict()
    d["a"] = x + 1
    d["b"] = x * 2
    d.move_to_end("a")
    return sum(d.values()), list(d.keys()), d


def ordered_dict_from_pairs(x):
    d = collections.OrderedDict([("a", x), ("b", x + 1)])
    d.update(c=x * 3)
    key, value = d.popitem(last=False)
    return key, value + d["c"], tuple(d)


def ordered_dict_in_a_loop(x):
    d = collections.OrderedDict()
    for i in range(3):
        d[f"k{i}"] = x * i
    d.move_to_end("k0", last=True)
    d.move_to_end("k2", last=False)
    key, value = d.popitem()
    return list(d), key, value, dict(d)


def sorted_items(x):
    d = collections.OrderedDict(b=x, a=x + 1)
    e = collections.OrderedDict(sorted(d.items(), reverse=True))
    return e, list(e.items())[0][0], len(e), "a" in e


PROGRAMS = [replace_fields, typed_namedtuple_methods, as_dict_and_make, ordered_dict_built_up,
            ordered_dict_from_pairs, ordered_dict_in_a_loop, sorted_items]


def _args(fn):
    x = torch.randn(3)
    return (Pair(torch.randn(3), 1), x) if fn is replace_on_an_input else (x,)


def _same(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for k in expected:
            _same(got[k], expected[k])
    else:
        assert got == expected


@pytest.mark.parametrize("fn", PROGRAMS + [replace_on_an_input], ids=lambda f: f.__name__)
def test_matches_eager_in_no_more_graphs_than_dynamo(fn) -> None:
    args = _args(fn)
    kiln.reset()
    torch._dynamo.reset()
    explained = kiln.explain(fn)(*args)
    oracle = torch._dynamo.explain(fn)(*args)
    assert explained.break_reasons == [] and oracle.graph_break_count == 0
    assert explained.graph_count <= oracle.graph_count
    kiln.reset()
    _same(kiln.compile(fn, backend="eager")(*args), fn(*args))
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0


def test_popitem_of_an_empty_ordered_dict_raises_eagers_error() -> None:
    def f(x):
        d = collections.OrderedDict()
        d.popitem()
        return x

    with pytest.raises(KeyError):
        kiln.compile(f, backend="eager")(torch.randn(2))


def test_move_to_end_of_a_missing_key_raises_eagers_error() -> None:
    def f(x):
        d = collections.OrderedDict(a=x)
        d.move_to_end("b")
        return x

    with pytest.raises(KeyError):
        kiln.compile(f, backend="eager")(torch.randn(2))


def test_counter_built_and_updated_from_iterables_is_one_graph() -> None:
    # Counter(iterable) and .update(iterable) go through the C helper collections._count_elements,
    # which was a graph break; it is traced item by item (a generator over sizes included).
    def f(x, xs):
        c = collections.Counter("aab")
        c.update(v.shape[0] for v in xs)
        c.subtract({"a": 1})
        return x * c["a"] + c[2] + c["zz"], dict(c)

    args = (torch.ones(2), [torch.ones(2), torch.ones(3), torch.ones(2)])
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    got, expected = compiled(*args), f(*args)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1]
