"""copy.deepcopy and copy.copy inside a compiled frame (kiln/capture/variables/object_copy.py): user
objects, dataclasses, namedtuples and containers holding tensors are copied while tracing, the
tensors cloned in the graph, a value reached twice copied once, a class's __deepcopy__/__copy__
inlined with its memo; what eager copies some other way (a tensor that requires grad, tensors
sharing storage, a caller's memo dict, a class that pickles itself) is a clean break. Each program
is compared with eager; the graphs Kiln makes are at most the real torch.compile's (which breaks on
every tensor's __deepcopy__ and traces plain objects by inlining the copy module)."""
from __future__ import annotations

import collections
import copy
import dataclasses

import pytest
import torch

import kiln
from eager_compare import dynamo_graphs, outcome, same_outcome


class Box:
    def __init__(self, a, b):
        self.a = a
        self.b = b


@dataclasses.dataclass
class State:
    x: torch.Tensor
    n: int
    tag: str = "t"


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: list


Pair = collections.namedtuple("Pair", "p q")


class Cfg:
    def __init__(self):
        self.scale = 2.0
        self.layers = [1, 2, 3]
        self.opts = {"a": 1, "b": (2, 3)}


class Canonical:
    """The usual hand-written __deepcopy__: a bare instance, entered in the memo, fields copied."""

    def __init__(self, w, n):
        self.w = w
        self.n = n

    def __deepcopy__(self, memo):
        made = self.__class__.__new__(self.__class__)
        memo[id(self)] = made
        for k, v in self.__dict__.items():
            setattr(made, k, copy.deepcopy(v, memo))
        return made


class OwnCopy:
    def __init__(self, w):
        self.w = w

    def __copy__(self):
        return OwnCopy(self.w + 1)


class SelfRef:
    def __init__(self, w):
        self.w = w
        self.me = self
        self.lst = [w]


class Reduces:
    def __init__(self, w):
        self.w = w

    def __reduce_ex__(self, proto):
        return (Reduces, (self.w * 2,))


CFG = Cfg()
OUTSIDE = Box(torch.ones(3), {"k": [1.5, torch.zeros(3)]})


def user_object(x):
    x = x + 1
    b = Box(x, [x, 2])
    c = copy.deepcopy(b)
    c.a.mul_(2)
    return c.a + c.b[0] + c.b[1], c.a is c.b[0], b.a is c.a, x


def dataclass_copy(x):
    x = x + 1
    d = State(x, 3)
    e = copy.deepcopy(d)
    e.x.add_(1)
    e.n += 1
    return e.x * e.n, d.n, x, e.tag, e.x is d.x


def namedtuple_copy(x):
    x = x + 1
    n = Pair(x, {"k": x})
    m = copy.deepcopy(n)
    return m.p + m.q["k"], m.p is m.q["k"], type(m) is Pair, m.p is x


def dict_of_tensors_in_object(x, y):
    x = x * 1
    h = Box({"a": x, "b": y, "c": x}, None)
    g = copy.deepcopy(h)
    g.a["a"].sub_(1)
    return g.a["a"] + g.a["b"] + g.a["c"], x, g.a["a"] is g.a["c"], g.b


def config_from_outside(x):
    x = x + 1
    c = copy.deepcopy(CFG)
    c.layers.append(4)
    c.scale += 1
    return x * c.scale + len(c.layers), len(CFG.layers), CFG.scale, c.opts == CFG.opts, c.opts is CFG.opts


def tensors_from_outside(x):
    x = x + 1
    c = copy.deepcopy(OUTSIDE)
    c.a.add_(x)
    c.b["k"][1].sub_(x)
    return c.a + c.b["k"][1], OUTSIDE.a, OUTSIDE.b["k"][1], c.b["k"][0]


def canonical_override(x):
    x = x + 1
    c = Canonical([x, 1], 2)
    d = copy.deepcopy({"a": c, "b": c})
    d["a"].w[0].mul_(3)
    return d["a"] is d["b"], d["a"].w[0] + d["b"].n, x, type(d["a"]).__name__


def self_reference(x):
    x = x + 1
    s = SelfRef(x)
    c = copy.deepcopy(s)
    return c.me is c, c.lst[0] is c.w, c.w + 1, c is s


def dict_kinds(x):
    x = x + 1
    od = collections.OrderedDict(a=x, b=2)
    dd = collections.defaultdict(list, {"q": [x]})
    a, b = copy.deepcopy((od, dd))
    b["new"].append(1)
    return type(a).__name__, list(a), a["a"] + 1, dict(b), "new" in dd, b.default_factory is list


def sets_and_frozen(x):
    x = x + 1
    s = {1, 2, 3}
    a, b = copy.deepcopy([s, Frozen(1, [2])])
    a.add(9)
    b.b.append(3)
    c = copy.copy(s)
    c.discard(1)
    return x + len(s) + len(a) + len(c), a is s, b == Frozen(1, [2]), b.a


def shallow_copies(x):
    x = x + 1
    b = Box(x, [x])
    c = copy.copy(b)
    c.b.append(x * 2)
    c.a = x + 1
    w = copy.copy(OwnCopy(x))
    d = {"k": [1]}
    e = copy.copy(d)
    e["k"].append(2)
    e["j"] = 3
    return b.a, len(b.b), c.a, c.b is b.b, w.w, len(d["k"]), "j" in d, copy.copy(Pair(x, 1)).p is x


def strided_copies(x):
    y = x.contiguous(memory_format=torch.channels_last)
    z = copy.deepcopy([y, x])
    return z[0].stride(), z[0] * 2, z[1].stride(), z[0] is y


def symbolic_sizes(x):
    cfg = {"n": x.shape[0], "l": [x.shape[0] * 2]}
    c = copy.deepcopy(cfg)
    return x.sum() * c["n"] + c["l"][0]


TRACED = [
    (user_object, lambda: (torch.randn(3),)),
    (dataclass_copy, lambda: (torch.randn(3),)),
    (namedtuple_copy, lambda: (torch.randn(3),)),
    (dict_of_tensors_in_object, lambda: (torch.randn(2), torch.randn(2))),
    (config_from_outside, lambda: (torch.randn(2),)),
    (tensors_from_outside, lambda: (torch.randn(3),)),
    (canonical_override, lambda: (torch.randn(2),)),
    (self_reference, lambda: (torch.randn(2),)),
    (dict_kinds, lambda: (torch.randn(2),)),
    (sets_and_frozen, lambda: (torch.randn(2),)),
    (shallow_copies, lambda: (torch.randn(2),)),
    (strided_copies, lambda: (torch.randn(1, 2, 3, 3),)),
]


def _compare(fn, make, calls=2, fullgraph=False):
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend, fullgraph=fullgraph)
    for i in range(calls):
        torch.manual_seed(i)
        want_args = make()
        torch.manual_seed(i)
        got_args = make()
        want, got = outcome(fn, *want_args), outcome(compiled, *got_args)
        assert same_outcome(got, want, text=False), f"call {i}: compiled gave {got!r}, eager {want!r}"
        assert same_outcome(("ok", got_args), ("ok", want_args), text=False)
    assert kiln.stats()["fallbacks"] == 0
    return backend.frame_count


@pytest.mark.parametrize("fn, make", TRACED, ids=[fn.__name__ for fn, _ in TRACED])
def test_copies_trace_whole_and_match_eager(fn, make) -> None:
    assert _compare(fn, make, fullgraph=True) == 1
    # (outside objects keep their state: the copies' writes did not reach them)
    assert torch.equal(OUTSIDE.a, torch.ones(3)) and CFG.layers == [1, 2, 3]


@pytest.mark.parametrize("fn, make", TRACED[:2] + TRACED[3:6], ids=lambda v: getattr(v, "__name__", ""))
def test_graphs_at_most_torch_compiles(fn, make) -> None:
    ours = _compare(fn, make)
    theirs = dynamo_graphs(fn, lambda compiled: [compiled(*make()) for _ in range(2)])
    assert ours <= theirs, (ours, theirs)


def test_symbolic_sizes_stay_symbolic_in_the_copy() -> None:
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(symbolic_sizes, backend=backend)
    for n in (2, 3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), symbolic_sizes(x))
    assert backend.frame_count == 2 and kiln.stats()["graph_breaks"] == 0


def _grad_leaf(x):
    return x + copy.deepcopy([x])[0]


def _intermediate_needing_grad(x):
    y = x * 2
    return copy.deepcopy([y])[0] + 1


def _views_share_storage(x):
    z = copy.deepcopy([x, x.view(2, 2)])
    z[0].add_(1)
    return z[1] * 2, z[0]


def _offset_view(x):
    z = copy.deepcopy(x[1:])
    return z + 1, z.storage_offset()


def _callers_memo(x):
    memo = {}
    a = copy.deepcopy([x], memo)
    b = copy.deepcopy([x], memo)
    return a[0] is b[0], a[0] + b[0], len(memo) > 0


def _reduces_itself(x):
    return copy.deepcopy(Reduces(x)).w * 2


LINEAR = torch.nn.Linear(2, 2)


def _module_copy(x):
    return copy.deepcopy(LINEAR)(x) + 1


BROKEN = [
    (_grad_leaf, lambda: (torch.randn(2, requires_grad=True),), "requires grad"),
    (_intermediate_needing_grad, lambda: (torch.randn(2, requires_grad=True),), "requires grad"),
    (_views_share_storage, lambda: (torch.randn(4),), "shares storage"),
    (_offset_view, lambda: (torch.randn(4),), "at an offset"),
    (_callers_memo, lambda: (torch.randn(2),), "memo dict of the caller's"),
    (_reduces_itself, lambda: (torch.randn(2),), "defines __reduce_ex__"),
    (_module_copy, lambda: (torch.randn(2),), "copy of .*Linear"),
]


@pytest.mark.parametrize("fn, make, why", BROKEN, ids=[fn.__name__ for fn, _, _ in BROKEN])
def test_what_eager_copies_otherwise_is_a_clean_break(fn, make, why) -> None:
    _compare(fn, make)
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match=why):
        kiln.compile(fn, backend="eager", fullgraph=True)(*make())


def test_a_class_that_gains_deepcopy_recompiles() -> None:
    class K:
        def __init__(self, v):
            self.v = v

    k = K(3)

    def f(x):
        return x * copy.deepcopy(k).v

    kiln.reset()
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.ones(2)
    assert torch.equal(compiled(x), f(x))
    K.__deepcopy__ = lambda self, memo: K(self.v * 10)
    assert torch.equal(compiled(x), f(x)) and f(x)[0] == 30
    del K.__deepcopy__
    k.v = 5
    assert torch.equal(compiled(x), f(x)) and f(x)[0] == 5
