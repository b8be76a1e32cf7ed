"""Programs for test_dynbuiltins_programs.py: collections (OrderedDict, defaultdict, namedtuple, deque, Counter, ChainMap)."""
import collections, torch
from collections import OrderedDict, defaultdict, namedtuple, deque, Counter, ChainMap
X = lambda: (torch.ones(3),)
Pt = namedtuple("Pt", ["a", "b"])
Pt3 = namedtuple("Pt3", "a b c", defaults=[0])

def od_move(x):
    d = OrderedDict(a=1, b=2, c=3)
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    return list(d), x + d["b"]
def od_popitem(x):
    d = OrderedDict(a=x, b=x + 1)
    k, v = d.popitem()
    k2, v2 = d.popitem(last=False)
    return k, v, k2, v2, len(d)
def od_eq(x):
    return OrderedDict(a=1, b=2) == OrderedDict(b=2, a=1), dict(a=1, b=2) == OrderedDict(b=2, a=1), x
def dd_list(x):
    d = defaultdict(list)
    d["a"].append(x)
    d["a"].append(x + 1)
    d["b"]
    return dict(d), len(d)
def dd_int(x):
    d = defaultdict(int)
    for c in "abca":
        d[c] += 1
    return sorted(d.items()), x * d["a"]
def dd_lambda(x):
    d = defaultdict(lambda: x * 0)
    d[1] = d[1] + x
    return d[1], d[2]
def dd_nested(x):
    d = defaultdict(lambda: defaultdict(int))
    d["a"]["b"] += 2
    return d["a"]["b"] * x
def dd_factory_attr(x):
    d = defaultdict(set)
    d[0].add(1)
    return d.default_factory is set, x
def nt_basic(x):
    p = Pt(x, 2)
    return p.a * p.b, p[0], len(p)
def nt_replace(x):
    p = Pt(x, 2)
    q = p._replace(b=3)
    return q, p
def nt_asdict(x):
    p = Pt(x, 2)
    return p._asdict(), Pt._fields
def nt_defaults(x):
    return Pt3(1, 2), Pt3(x, 1, 2).c
def nt_make(x):
    return Pt._make([x, 1])
def nt_unpack(x):
    a, b = Pt(x, x + 1)
    return a + b
def nt_isinstance(x):
    p = Pt(1, 2)
    return isinstance(p, tuple), p == (1, 2), x
def deque_maxlen(x):
    d = deque(maxlen=2)
    d.append(x)
    d.append(x + 1)
    d.append(x + 2)
    return list(d), d.maxlen
def deque_rotate(x):
    d = deque([1, 2, 3, 4])
    d.rotate(1)
    d.rotate(-2)
    return list(d), x
def deque_ops(x):
    d = deque([x])
    d.appendleft(x - 1)
    d.extend([x + 1])
    d.extendleft([x - 2])
    a = d.popleft()
    b = d.pop()
    return a, b, len(d), d[0]
def deque_arg(d, x):
    d.append(x)
    return d.popleft() + x
def counter1(x):
    c = Counter("abracadabra")
    return c.most_common(2), c["a"] * x
def counter_update(x):
    c = Counter([1, 2, 2])
    c.update([2, 3])
    c2 = c + Counter([1])
    return dict(c2), x
def counter_sub(x):
    c = Counter(a=3, b=1) - Counter(a=1, b=2)
    return dict(c), sum(c.values()) * x
def chainmap1(x):
    cm = ChainMap({"a": 1}, {"a": 2, "b": 3})
    return cm["a"], cm["b"], x * len(cm)
def chainmap_new_child(x):
    cm = ChainMap({"a": x})
    c2 = cm.new_child({"b": 2})
    c2["a"] = 5
    return cm["a"], c2["a"], dict(c2)
def od_from_tensor(x):
    d = OrderedDict()
    d["w"] = x
    d["b"] = x + 1
    return sum(d.values())
def counter_total(x):
    return Counter([1, 1, 2]).total() * x
def deque_index(x):
    d = deque([x, x + 1])
    d[1] = x * 3
    return d[1], d.count(5), 2 in deque([1, 2])
def deque_clear_copy(x):
    d = deque([1, 2])
    e = d.copy()
    d.clear()
    return list(e), len(d), x
def dd_missing_get(x):
    d = defaultdict(int)
    return d.get("z"), "z" in d, x
def nt_attr_tensor(x):
    p = Pt(x, x * 2)
    return p.b - p.a
def od_keys_reversed(x):
    d = OrderedDict(a=1, b=2)
    return list(reversed(d)), list(reversed(d.items())), x
def counter_elements(x):
    return sorted(Counter(a=2, b=1).elements()), x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n not in ("X", "deque_arg")]
PROGS.append(("deque_arg", deque_arg, lambda: (deque([torch.zeros(3)]), torch.ones(3))))
