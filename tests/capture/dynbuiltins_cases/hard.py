"""Programs for test_dynbuiltins_programs.py: several calls with sizes that change, breaks inside stdlib loops, state read from outside."""
import itertools, functools, operator, collections, dataclasses, enum, math, copy, random, torch
from collections import OrderedDict, defaultdict, namedtuple, deque, Counter, ChainMap
X = lambda: (torch.ones(3),)
def V(i):
    return (torch.arange(float(i % 3 + 2)),)
def _brk(*a):
    print("", end="")

def chain_break(x):
    out = []
    for t in itertools.chain([x], [x + 1, x + 2]):
        _brk()
        out.append(t * 2)
    return out
def product_break(x):
    s = x
    for a, b in itertools.product(range(2), "ab"):
        _brk(b)
        s = s + a
    return s
def groupby_break(x):
    res = []
    for k, g in itertools.groupby([1, 1, 2]):
        _brk()
        res.append((k, list(g)))
    return res, x
def zip_break(x):
    s = x
    for i, (a, b) in enumerate(zip([1, 2, 3], "abc"), start=1):
        _brk()
        s = s + i * a
    return s
def deque_global_mut(x):
    _DQ.append(x.sum().item() if False else 1)
    return x + len(_DQ)
_DQ = deque(maxlen=3)
def counter_global(x):
    _CNT["calls"] += 1
    return x * _CNT["calls"]
_CNT = Counter()
def dd_global(x):
    _DD[x.shape[0]].append(1)
    return x + len(_DD[x.shape[0]])
_DD = defaultdict(list)
def od_global_move(x):
    _OD.move_to_end("a")
    return x + list(_OD)[0]
_OD = OrderedDict(a=1, b=2, c=3)
def lru_with_shape(x):
    return x * _lru_shape(x.shape[0])
@functools.lru_cache(maxsize=4)
def _lru_shape(n):
    return n * 10
def partial_closure_var(x):
    k = x.shape[0]
    p = functools.partial(torch.full, (k,))
    return p(2.0) + x
def namedtuple_shape(x):
    P = namedtuple("P", "n m")
    p = P(x.shape[0], 2)
    return x.reshape(p.n, 1).expand(p.n, p.m), p._asdict()
def sorted_shape_keys(x):
    ts = [x, x[:2], x[:1]]
    return [t.shape[0] for t in sorted(ts, key=lambda t: t.shape[0])]
def min_max_shape(x):
    return max(x.shape[0], 3), min(x.shape), x.new_zeros(max(x.shape[0] - 1, 1))
def range_shape(x):
    r = range(x.shape[0])
    return [x[i] * i for i in r[::2]], len(r[1:])
def math_shape_dyn(x):
    return x.new_ones(math.ceil(x.shape[0] / 2)), math.floor(x.shape[0] / 2), math.sqrt(x.shape[0])
def fstring_shape_dyn(x):
    return f"{x.shape[0]}-{x.shape[0] * 2:04d}", x
def divmod_shape(x):
    q, r = divmod(x.shape[0], 2)
    return x[:q], r, round(x.shape[0] / 3, 2), abs(-x.shape[0]), pow(x.shape[0], 2)
def dict_shape_key(x):
    d = {x.shape[0]: x}
    d.setdefault(x.shape[0] + 1, x * 2)
    return sorted(d)
def enumerate_tensor(x):
    return [i * t for i, t in enumerate(x, 1)]
def zip_strict_shape(x):
    try:
        return list(zip(x, [1, 2, 3], strict=True))
    except ValueError as e:
        return str(e)
def itertools_tensor_iter(x):
    return list(itertools.accumulate(x)), list(itertools.pairwise(x))
def int_float_of_shape(x):
    n = x.shape[0]
    return float(n), int(n / 2), bool(n), str(n), complex(n).real, x
def hash_of_shape(x):
    return hash(x.shape[0]) == x.shape[0], x
def isclose_shape(x):
    return math.isclose(x.shape[0], 3), x
def deepcopy_tensor_list(x):
    l = [x, x]
    m = copy.deepcopy(l)
    m[0].add_(1)
    return l, m, m[0] is m[1]
def copy_dict_tensor_mut(x):
    d = {"a": x.clone()}
    e = copy.copy(d)
    e["a"].mul_(2)
    e["b"] = 1
    return d, e
def random_in_loop(x):
    random.seed(3)
    for _ in range(3):
        x = x * random.uniform(0.5, 1.5)
    return x
def random_state_side(x):
    y = x + random.random()
    return y
def dataclass_tensor_field_mut(x):
    @dataclasses.dataclass
    class S:
        t: torch.Tensor
        n: int = 0
    s = S(x)
    s.t = s.t + 1
    s.n += 1
    return dataclasses.astuple(s)
def enum_in_dict_loop(x):
    class C(enum.Enum):
        A = "a"
        B = "b"
    d = {c: x * i for i, c in enumerate(C)}
    return d[C.B], C("a").name, C.A.value
def intenum_index(x):
    class I(enum.IntEnum):
        ZERO = 0
        TWO = 2
    return x[I.TWO], [10, 20, 30][I.TWO], x.shape[I.ZERO]
def flag_combo(x):
    class F(enum.Flag):
        A = enum.auto()
        B = enum.auto()
        C = enum.auto()
    f = F.A | F.C
    return x * f.value, F.B in f, [m.name for m in F if m in f]
def str_enum(x):
    class S(str, enum.Enum):
        A = "aa"
    return S.A == "aa", S.A.upper(), x
def sort_stability(x):
    l = [(1, "a"), (0, "b"), (1, "c"), (0, "d")]
    return sorted(l, key=lambda p: p[0]), x
def max_key_tensor_sum(x):
    return max([x, x * 2, x - 1], key=lambda t: float(t.sum()))
def sum_generator_tensors(x):
    return sum(x[i] for i in range(x.shape[0]))
def sum_start_tensor(x):
    return sum([x, x * 2], start=torch.zeros(3))
def all_any_tensor_bool(x):
    return all(x > 0), any(x > 5)
def reversed_tensor(x):
    return list(reversed(x))
def dict_items_tensor_sort(x):
    d = {"b": x, "a": x * 2}
    return [k for k, v in sorted(d.items())], sorted(d.values(), key=lambda t: t.sum().item())
def chainmap_tensor(x):
    cm = ChainMap({"w": x}, {"w": x * 0, "b": x + 1})
    return cm["w"] + cm["b"], list(cm)
def getattr_tensor_default(x):
    return getattr(x, "foo", None), getattr(x, "shape"), hasattr(x, "grad"), hasattr(x, "nope")
def setattr_on_obj_list(x):
    class O: pass
    os = [O(), O()]
    for i, o in enumerate(os):
        setattr(o, "v", x * i)
    return [vars(o) for o in os]
def iter_next_tensor_rows(x):
    it = iter(x.view(3, 1))
    a = next(it)
    rest = list(it)
    return a, rest, next(it, "done")
def pow_mod_neg(x):
    return pow(2, -1, 5), pow(-2, 3), (-2) ** 0.5, x
def round_neg_half(x):
    return round(-0.5), round(1.5), round(-2.5), round(0.125, 2), round(1234, -2), round(5.0), x
def divmod_neg_float(x):
    return divmod(-7, 2), divmod(-7.5, 2), divmod(7, -2.5), -7 % 3, 7.5 // -2, x
def int_conv_edge(x):
    return int(-0.9), int("-12"), int(2 ** 40 + 0.0), float(2 ** 60), int(1e20), x
def bool_conv_containers(x):
    return bool(()), bool({}), bool(" "), bool(0.0), bool(-1), bool(None), x
def complex_conv(x):
    return complex("1+2j"), complex(2), (1 + 2j) * (3 - 1j), (1j) ** 2, x
def big_int_ops(x):
    return 2 ** 100 // 3, (10 ** 20) % 7, -(2 ** 70) >> 3, x
def float_repr(x):
    return str(0.1 + 0.2), repr(1e-7), str(1e16), f"{2/3}", x
def str_int_fmt_edge(x):
    return format(255, "#x"), format(-3.5, "+.1e"), format(1234567, "_"), format(0.0001, "g"), f"{-0.0}", x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n not in ("X", "V")]
# run the shape-dependent ones with varying sizes over 3 calls
def _reset():
    _DQ.clear(); _CNT.clear(); _DD.clear(); _OD.clear(); _OD.update(a=1, b=2, c=3); random.seed(11); _lru_shape.cache_clear()
PROGS = [(n, f, V if "shape" in n or n in ("enumerate_tensor", "reversed_tensor", "itertools_tensor_iter", "sum_generator_tensors") else X, 3, _reset) for n, f, _ in PROGS]
