"""Programs for test_dynbuiltins_programs.py: builtins: sorted/min/max/sum, dict/set/list ops, isinstance, conversions, copy, random."""
import torch, collections.abc as cabc, copy, random
X = lambda: (torch.ones(3),)

def sorted_key(x):
    xs = [x * 3, x, x * 2]
    return sorted(xs, key=lambda t: t.sum().item())
def sorted_rev(x):
    return sorted([3, 1, 2], reverse=True), sorted({"b": 1, "a": 2}), x
def min_max_default(x):
    return min([], default=0), max([], default=x), max([1, 5, 3], key=lambda v: -v), min(3, 1, 2)
def max_tensors(x):
    return max(x.sum(), torch.tensor(2.0)), max([x.shape[0], 2])
def min_empty_err(x):
    try:
        min([])
    except ValueError as e:
        return x, str(e)
def sum_start(x):
    return sum([x, x], x), sum([[1], [2]], []), sum((1.5, 2), 10), sum(range(5))
def zip_strict(x):
    return list(zip([x, x], [1, 2], strict=True))
def zip_strict_err(x):
    try:
        list(zip([1, 2], [1], strict=True))
    except ValueError as e:
        return x, str(e)
def enumerate_start(x):
    return [x * i for i, _ in enumerate("ab", start=2)], list(enumerate([5], 1))
def reversed1(x):
    return list(reversed([x, x + 1])), list(reversed(range(3))), list(reversed((1, 2))), list(reversed("ab"))
def dict_views(x):
    d = {"a": x, "b": 2}
    k = d.keys()
    d["c"] = 3
    return list(k), k & {"a", "z"}, list(d.items())[1], "a" in k, len(d.values())
def dict_or(x):
    a = {"a": 1, "b": 2}
    b = {"b": x, "c": 4}
    c = a | b
    a |= {"z": 0}
    return c, a
def dict_setdefault(x):
    d = {}
    d.setdefault("a", []).append(x)
    d.setdefault("a", []).append(1)
    return d, d.setdefault("b", 5)
def dict_pop_default(x):
    d = {"a": x}
    return d.pop("a"), d.pop("b", 7), d, d.get("q", x)
def dict_pop_err(x):
    try:
        {}.pop("k")
    except KeyError as e:
        return x, str(e), e.args
def dict_fromkeys(x):
    return dict.fromkeys(["a", "b"], 0), dict.fromkeys("xy"), x
def dict_comp(x):
    return {k: x * v for k, v in zip("abc", range(3)) if v}
def dict_update_kwargs(x):
    d = dict(a=1)
    d.update(b=2)
    d.update([("c", x)])
    del d["a"]
    return d
def dict_eq_order(x):
    return {"a": 1, "b": 2} == {"b": 2, "a": 1}, list({"b": 1, "a": 2}), x
def dict_copy_clear(x):
    d = {"a": x}
    e = d.copy()
    d.clear()
    return e, d
def dict_arg_mut(d, x):
    d["new"] = x * 2
    d.pop("old")
    return len(d)
def dict_popitem(x):
    d = {"a": 1, "b": x}
    return d.popitem(), d
def set_ops(x):
    a = {1, 2, 3}
    b = frozenset({2, 3, 4})
    return a | b, a & b, a - b, a ^ b, a <= {1, 2, 3, 4}, b.isdisjoint({9}), x
def set_mut(x):
    s = set()
    s.add(1); s.update([2, 3]); s.discard(9); s.remove(1)
    s |= {7}
    s -= {2}
    return sorted(s), len(s) * x
def set_pop_err(x):
    try:
        set().pop()
    except KeyError as e:
        return x, str(e)
def frozenset_key(x):
    d = {frozenset({1, 2}): x}
    return d[frozenset({2, 1})]
def set_comp(x):
    return {v % 3 for v in range(10)}, x
def list_sort_key(x):
    l = [(2, "b"), (1, "z"), (2, "a")]
    l.sort(key=lambda p: p[1])
    m = [3, 1, 2]
    m.sort(reverse=True)
    return l, m, x
def list_ops(x):
    l = [1, 2, 3, 2]
    l.insert(1, 9)
    l.remove(2)
    return l, l.index(2), l.count(2), l.index(3, 1), x
def list_index_err(x):
    try:
        [1].index(5)
    except ValueError as e:
        return x, str(e)
def list_slices(x):
    l = list(range(10))
    a = l[::3]
    b = l[8:2:-2]
    del l[::2]
    l[1:3] = [x, x]
    return a, b, l
def list_del_slice(x):
    l = [x, x + 1, x + 2, x + 3]
    del l[1:3]
    return l
def list_ext_slice_assign(x):
    l = [0, 1, 2, 3]
    l[::2] = [x, x]
    return l
def list_arg_mut(l, x):
    l.append(x)
    l.sort(key=lambda t: -t.sum().item())
    l[0] = l[0] * 2
    return len(l)
def list_reverse_copy(x):
    l = [1, 2, 3]
    m = l.copy()
    l.reverse()
    return l, m, l + m, l * 2, x
def list_pop(x):
    l = [x, 1, 2]
    return l.pop(), l.pop(0), l
def tuple_cmp(x):
    return (1, 2) < (1, 3), (1, 2) == (1, 2.0), (2,) > (1, 5), max([(1, "b"), (1, "a")]), x
def tuple_methods(x):
    t = (1, 2, 2, 3)
    return t.count(2), t.index(3), t[1:], t + (4,), x
def isinstance_tuple(x):
    return isinstance(x, (int, torch.Tensor)), isinstance(3, (str, float)), isinstance(True, int), issubclass(bool, (int,))
def isinstance_abc(x):
    return isinstance({}, cabc.Mapping), isinstance([], cabc.Sequence), isinstance((), cabc.Sequence), isinstance({}, cabc.Sequence), isinstance(x, cabc.Iterable), isinstance(3, cabc.Hashable), x
def issubclass_abc(x):
    return issubclass(dict, cabc.MutableMapping), issubclass(list, cabc.Sized), issubclass(int, cabc.Iterable), x
def callable_checks(x):
    return callable(len), callable(x), callable(lambda: 1), callable(3), callable(torch.nn.Linear), x
def id_type(x):
    a = [1]
    b = a
    return id(a) == id(b), type(x) is torch.Tensor, type(3) == int, type(a).__name__, x
def hash_checks(x):
    return hash(3) == 3, hash("a") == hash("a"), hash((1, 2)) == hash((1, 2)), x
def getattr_default(x):
    class O:
        a = 1
    o = O()
    setattr(o, "b", x)
    return getattr(o, "a"), getattr(o, "zz", 5), hasattr(o, "b"), hasattr(o, "c"), o.b
def vars_obj(x):
    class O:
        def __init__(self):
            self.p = x
            self.q = 2
    return vars(O())
def iter_next_default(x):
    it = iter([x])
    return next(it), next(it, None), next(iter([]), 3)
def iter_callable_sentinel(x):
    vals = [3, 2, 1, 0]
    it = iter(lambda: vals.pop(0), 1)
    return list(it), x
def range_ops(x):
    r = range(2, 20, 3)
    return len(r), r[2], r[-1], list(r[1:4]), 8 in r, r.index(8), list(range(5)[::-1]), x
def range_eq(x):
    return range(0, 3) == range(3), range(0) == range(2, 2), x
def arith_builtins(x):
    return abs(-3), abs(-2.5), round(2.5), round(3.5), round(2.675, 2), round(7, -1), divmod(7, -2), divmod(7.5, 2), pow(2, 5), pow(2, -1), pow(3, 2, 5), x
def abs_tensor(x):
    return abs(x - 2), round(x.sum().item() / 7, 3), pow(x, 2)
def conversions(x):
    return bool(0), bool([1]), int(3.9), int(-3.9), float(3), float("inf"), complex(1, 2), int(True), x
def complex_ops(x):
    c = complex(1, 2) * 2
    return c.real, c.imag, abs(complex(3, 4)), c.conjugate(), x
def any_all_gen(x):
    return any(v > 2 for v in [1, 3]), all(v > 0 for v in []), any([]), all(t.sum() > 0 for t in [x, x]), x
def any_tensor_gen(x):
    if any(t.shape[0] == 3 for t in [x]):
        return x + 1
    return x
def copy_list(x):
    l = [x, [1, 2]]
    c = copy.copy(l)
    c[1].append(3)
    d = copy.deepcopy(l)
    d[1].append(4)
    return l, c is l, c[0] is x, d[0] is x
def deepcopy_dict(x):
    d = {"a": x, "b": {"c": [1]}}
    e = copy.deepcopy(d)
    e["b"]["c"].append(2)
    return d, e["a"] is x, torch.equal(e["a"], x)
def random_seeded(x):
    random.seed(0)
    a = random.random()
    b = random.randint(1, 10)
    return x * a + b
def random_choice(x):
    random.seed(1)
    l = [1, 2, 3, 4]
    random.shuffle(l)
    return l, random.choice(l), x
def random_instance(x):
    r = random.Random(5)
    return x + r.random(), r.uniform(0, 1)
def ord_chr(x):
    return chr(65), ord("z"), x
def bin_hex(x):
    return bin(5), hex(255), oct(8), int("101", 2), (5).bit_length(), x
def len_various(x):
    return len(x), len({"a": 1}), len(range(3)), len("abc"), len(x.shape)
def map_filter(x):
    return list(map(lambda v: v * x, [1, 2])), list(filter(None, [0, 1, 2])), list(map(pow, [2, 3], [2, 2]))
def int_methods(x):
    return (10).to_bytes(2, "big"), int.from_bytes(b"\x00\x10", "big"), (3.5).is_integer(), (0.5).as_integer_ratio(), x
def float_special(x):
    return float("nan") != float("nan"), float("-inf") < -1e308, x * float("0.5")
def none_checks(x, y=None):
    return x if y is None else x + y
def slice_obj(x):
    s = slice(1, None, 2)
    return x[s], s.start, s.stop, s.indices(10)
def globals_builtins(x):
    return isinstance(x, torch.Tensor) and not isinstance(x, list), type(x).__name__
def sorted_tuple_keys(x):
    d = {(1, "b"): 1, (0, "z"): 2}
    return sorted(d), sorted(d.items(), key=lambda kv: kv[1], reverse=True), x
def mixed_numbers(x):
    return 7 // 2, -7 // 2, 7 % -3, 2 ** 0.5, 1 / 4, 3 * 1.5, True + True, x
def int_float_tensor_item(x):
    n = int(x.sum())
    f = float(x.mean())
    return n, f, x * n
def bool_tensor(x):
    return bool(x.sum() > 0), x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n not in ("X", "dict_arg_mut", "list_arg_mut")]
PROGS.append(("dict_arg_mut", dict_arg_mut, lambda: ({"old": 1, "k": torch.ones(2)}, torch.ones(3))))
PROGS.append(("list_arg_mut", list_arg_mut, lambda: ([torch.ones(3), torch.zeros(3) + 5], torch.ones(3) * 2)))
