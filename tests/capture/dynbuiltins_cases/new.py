"""Programs for test_dynbuiltins_programs.py: heapq, bisect, operator.setitem/delitem/length_hint, builtin methods of immutable values, list.sort of constants."""
import heapq, bisect, operator, collections, functools, torch
from collections import Counter, namedtuple
X = lambda: (torch.ones(3),)

class _Lt:
    calls = []
    def __init__(self, v): self.v = v
    def __lt__(self, o):
        _Lt.calls.append((self.v, o.v))
        return self.v < o.v
    def __eq__(self, o): return self.v == o.v
    def __repr__(self): return f"L{self.v}"

def heap_push_pop(x):
    h = []
    for v in [5, 1, 4, 1, 3, 9, 2]:
        heapq.heappush(h, v)
    layout = list(h)
    return layout, [heapq.heappop(h) for _ in range(4)], h, x * h[0]
def heapify_layout(x):
    h = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    heapq.heapify(h)
    r = heapq.heapreplace(h, 11)
    p = heapq.heappushpop(h, -1)
    q = heapq.heappushpop(h, 20)
    return h, r, p, q, x + r
def heap_tensors_tuples(x):
    h = []
    for i, t in enumerate([x * 3, x, x * 2]):
        heapq.heappush(h, (float(i * 7 % 3), i, t))
    return [heapq.heappop(h)[2] for _ in range(3)]
def heap_arg(h, x):
    heapq.heappush(h, 0)
    a = heapq.heappop(h)
    heapq.heapify(h)
    return a + x, heapq.nsmallest(2, h), heapq.nlargest(2, h)
def heap_errors(x):
    out = []
    for f in (lambda: heapq.heappop([]), lambda: heapq.heapreplace([], 1), lambda: heapq.heappush((), 1)):
        try:
            f()
        except Exception as e:
            out.append((type(e).__name__, str(e)))
    return out, x
def heap_user_lt(x):
    _Lt.calls.clear()
    h = [_Lt(v) for v in [4, 2, 6, 1]]
    heapq.heapify(h)
    heapq.heappush(h, _Lt(0))
    m = heapq.heappop(h)
    return m.v * x, [o.v for o in h], list(_Lt.calls)
def nlargest_key(x):
    return heapq.nlargest(2, [3, 1, 4, 1, 5], key=lambda v: -v), heapq.nsmallest(3, "hello"), heapq.merge([1, 3], [2]) is not None, x
def merge_list(x):
    return list(heapq.merge([1, 4, 7], [2, 5], [3])), x + 1
def counter_most_common(x):
    c = Counter("abracadabra")
    return c.most_common(2), c.most_common(), x * c["a"]
def counter_arg_mc(c, x):
    c.update("zz")
    return c.most_common(1), x
def bisect_ops(x):
    l = [1, 3, 3, 5]
    bisect.insort(l, 4)
    bisect.insort_left(l, 3)
    return l, bisect.bisect_left(l, 3), bisect.bisect_right(l, 3), bisect.bisect(l, 3, 1, 3), x + bisect.bisect(l, 10)
def bisect_key(x):
    recs = [("a", 1), ("b", 4), ("c", 9)]
    i = bisect.bisect_left(recs, 5, key=lambda r: r[1])
    bisect.insort(recs, ("d", 5), key=lambda r: r[1])
    return i, recs, x * i
def bisect_err(x):
    try:
        bisect.bisect([1], 1, -1)
    except ValueError as e:
        return str(e), x
def bisect_shape(x):
    bounds = [2, 4, 8]
    return x * bisect.bisect_left(bounds, x.shape[0])
def op_setitem_del(x):
    l = [0, 0, 0]
    operator.setitem(l, 1, x)
    operator.delitem(l, 0)
    d = {}
    operator.setitem(d, "k", x * 2)
    y = x.clone()
    operator.setitem(y, 0, 5.0)
    operator.delitem(d, "k")
    return l, d, y
def op_setitem_arg(l, x):
    operator.setitem(l, 0, x)
    operator.delitem(l, -1)
    return len(l)
def op_length_hint(x):
    return operator.length_hint([1, 2]), operator.length_hint({"a": 1}), operator.length_hint((1,), 5), x * operator.length_hint("abc")
def namedtuple_in_frame(x):
    P = namedtuple("P", "n m")
    p = P(x.shape[0], 2)
    return x.reshape(p.n, 1).expand(p.n, p.m), p.m
def frozenset_method(x):
    keys = frozenset({"a", "b"})
    f = keys.__contains__
    return f("a"), f("z"), x + 1
def str_method_bound(x):
    j = "-".join
    s = "a,b".split
    return j(["a", "b"]), s(","), x * 2
def int_method_bound(x):
    tb = (258).to_bytes
    return tb(2, "big"), x
def tuple_method_bound(x):
    c = (1, 2, 2).count
    return c(2), x * c(2)

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n not in ("X", "heap_arg", "counter_arg_mc", "op_setitem_arg")]
PROGS.append(("heap_arg", heap_arg, lambda: ([3, 1, 2, 8, 5], torch.ones(3))))
PROGS.append(("counter_arg_mc", counter_arg_mc, lambda: (Counter("aab"), torch.ones(3))))
PROGS.append(("op_setitem_arg", op_setitem_arg, lambda: ([1, 2, 3], torch.ones(3))))
PROGS = [p if p[0] not in ("bisect_shape", "namedtuple_in_frame") else (p[0], p[1], lambda i: (torch.ones(i + 2),), 3) for p in PROGS]
def sort_const_tuples(x):
    l = [(2, "b"), (1, "z"), (2, "a")]
    l.sort()
    m = [(3, 1), (1, 2), (3, 0)]
    m.sort(reverse=True)
    a, b = l[0]
    return [p[1] for p in l], m, a * x, b
def sort_then_unpack(x):
    pairs = [(1.5, 2), (0.5, 3)]
    pairs.sort()
    return [w * x + k for w, k in pairs]
PROGS += [("sort_const_tuples", sort_const_tuples, X), ("sort_then_unpack", sort_then_unpack, X)]
_SET_OF_PAIRS = {(1, 2), (3, 4)}
_FS_OF_PAIRS = frozenset({(5, 6)})
def set_of_tuples_global(x):
    out = x
    for a, b in sorted(_SET_OF_PAIRS):
        out = out + a * b
    for p in _FS_OF_PAIRS:
        out = out + p[0] - p[1]
    return out, (1, 2) in _SET_OF_PAIRS
def set_of_tuples_arg(s, x):
    return [x * a + b for a, b in sorted(s)], max(s)[0]
PROGS += [("set_of_tuples_global", set_of_tuples_global, X), ("set_of_tuples_arg", set_of_tuples_arg, lambda: ({(1, 2), (0, 5)}, torch.ones(3)))]
def tuple_order_tensors(x):
    a = (1.0, 0, x)
    b = (2.0, 1, x * 2)
    c = (1.0, 2, x * 3)
    return a < b, b > a, a <= c, c >= a, [a, c] < [a, b], (1, x) < (1, x, 2), max([a, b, c])[2]
def tuple_order_sizes(x):
    return x.shape < (5, 1), (x.shape[0], 2) <= (3, 2), [x.shape[0]] > [1], x * 2
def tuple_order_tensor_tie(x):
    try:
        return (1, x) < (1, x + 1)
    except RuntimeError as e:
        return "ambiguous" in str(e)
def heap_of_entries(x):
    h = []
    for i, t in enumerate([x * 3, x, x * 2]):
        heapq.heappush(h, (float(i * 7 % 3), i, t))
    return [heapq.heappop(h)[2] for _ in range(3)]
PROGS += [("tuple_order_tensors", tuple_order_tensors, X), ("tuple_order_sizes", tuple_order_sizes, lambda i: (torch.ones(i + 2),), 3),
          ("tuple_order_tensor_tie", tuple_order_tensor_tie, X), ("heap_of_entries", heap_of_entries, X)]
