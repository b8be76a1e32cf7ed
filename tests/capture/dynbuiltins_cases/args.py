"""Programs for test_dynbuiltins_programs.py: stdlib containers given as arguments and mutated, errors raised by stdlib calls."""
import itertools, functools, operator, collections, dataclasses, enum, math, copy, heapq, bisect, torch
from collections import OrderedDict, defaultdict, namedtuple, deque, Counter, ChainMap
Pt = namedtuple("Pt", "a b")
@dataclasses.dataclass
class Cfg:
    w: torch.Tensor
    k: int = 2
    tags: list = dataclasses.field(default_factory=list)
class Mode(enum.Enum):
    A = 1
    B = 2

def dd_arg_read(d, x):
    return d["missing"] + x, len(d)
def dd_arg_int(d, x):
    d["a"] += 1
    return x * d["a"], sorted(d)
def od_arg(d, x):
    d.move_to_end("a")
    d["z"] = x
    return list(d), d.popitem(last=False)
def counter_arg(c, x):
    c.update("aab")
    return x * c["a"], c.most_common(1)
def deque_arg_rot(d, x):
    d.rotate(1)
    d.append(x)
    return d[0], len(d), d.maxlen
def nt_arg(p, x):
    return p._replace(a=p.a + x), p.b * x, p._fields
def dc_arg(c, x):
    c.tags.append(len(c.tags))
    c.k += 1
    return c.w * c.k + x, dataclasses.replace(c, k=0).k
def enum_arg(m, x):
    return {Mode.A: x, Mode.B: x * 2}[m], m.name
def heapq_arg(h, x):
    heapq.heappush(h, 0)
    a = heapq.heappop(h)
    heapq.heapify(h)
    return a + x, heapq.nsmallest(2, h), h
def heapq_local(x):
    h = []
    for v in [5, 1, 3]:
        heapq.heappush(h, v)
    return [heapq.heappop(h) for _ in range(3)], x * 2
def bisect_local(x):
    l = [1, 3, 5]
    bisect.insort(l, 4)
    return bisect.bisect_left(l, 3), bisect.bisect_right(l, 3), l, x + bisect.bisect(l, 10)
def sorted_arg_list(l, x):
    l.sort()
    return sorted(l, reverse=True), x * l[0]
def list_arg_slices(l, x):
    del l[::2]
    l[1:1] = [x.sum().tolist() if False else 9]
    l.extend(reversed(l))
    return x + l[-1]
def dict_arg_ops(d, x):
    d |= {"q": 1}
    v = d.pop("a", None)
    d.setdefault("s", []).append(2)
    return x * len(d), v
def set_arg_ops(s, x):
    s -= {1}
    s.add(7)
    s ^= {8, 2}
    return x * len(s), sorted(s)
def tensor_list_iadd(l, x):
    l += [x]
    l[0] += 1
    return len(l)
def tensor_iadd_op(x, y):
    y = operator.iadd(y, x)
    return y
def imul_arg_tensor(x, y):
    operator.imul(y, 2)
    return y + x
def partial_arg(fn, x):
    return fn(x), fn.keywords
def deepcopy_arg(l, x):
    m = copy.deepcopy(l)
    m[0].add_(1)
    m.append(x)
    return m
def copy_arg_dict(d, x):
    e = copy.copy(d)
    e["t"].mul_(3)
    return e["t"] + x
def itemgetter_arg(g, x):
    return g([x, x + 1, x + 2])
def cm_arg(cm, x):
    cm["new"] = x
    return cm["a"] * x, len(cm)
def error_msgs(x):
    out = []
    for f in (lambda: {}["k"], lambda: [][1], lambda: int("z"), lambda: (1).foo, lambda: 1 / 0, lambda: None + 1,
              lambda: [1].remove(5), lambda: math.sqrt(-1), lambda: next(iter([])), lambda: {1}.remove(2),
              lambda: deque([], maxlen=1).pop(), lambda: "abc".index("z"), lambda: tuple([1]).index(2),
              lambda: Mode(3), lambda: Pt(1), lambda: divmod(1, 0), lambda: float("x"), lambda: chr(-1)):
        try:
            f()
            out.append(None)
        except Exception as e:
            out.append((type(e).__name__, str(e)))
    return out, x
def error_tensor_ops(x):
    out = []
    for f in (lambda: x + "a", lambda: x.view(7), lambda: len(x.sum()), lambda: iter(x.sum())):
        try:
            f()
        except Exception as e:
            out.append(type(e).__name__)
    return out, x + 1
def raise_from_stdlib(x):
    OrderedDict().popitem()
def raise_keyerror_dd(x):
    d = defaultdict(None)
    return d["a"]
def raise_dc_frozen(x):
    @dataclasses.dataclass(frozen=True)
    class F:
        a: int = 0
    F().a = x

PROGS = [
    ("dd_arg_read", dd_arg_read, lambda: (defaultdict(lambda: torch.zeros(3), a=torch.ones(3)), torch.ones(3))),
    ("dd_arg_int", dd_arg_int, lambda: (defaultdict(int, b=2), torch.ones(3))),
    ("od_arg", od_arg, lambda: (OrderedDict(a=1, b=torch.ones(2)), torch.ones(3))),
    ("counter_arg", counter_arg, lambda: (Counter("ab"), torch.ones(3))),
    ("deque_arg_rot", deque_arg_rot, lambda: (deque([torch.zeros(3), torch.ones(3)], maxlen=3), torch.ones(3) * 2)),
    ("nt_arg", nt_arg, lambda: (Pt(torch.ones(3), 3), torch.ones(3))),
    ("dc_arg", dc_arg, lambda: (Cfg(torch.ones(3), tags=[5]), torch.ones(3))),
    ("enum_arg", enum_arg, lambda i: (Mode.A if i % 2 == 0 else Mode.B, torch.ones(3)), 3),
    ("heapq_arg", heapq_arg, lambda: ([3, 1, 2], torch.ones(3))),
    ("heapq_local", heapq_local, lambda: (torch.ones(3),)),
    ("bisect_local", bisect_local, lambda: (torch.ones(3),)),
    ("sorted_arg_list", sorted_arg_list, lambda: ([3, 1, 2], torch.ones(3))),
    ("list_arg_slices", list_arg_slices, lambda: ([1, 2, 3, 4, 5], torch.ones(3))),
    ("dict_arg_ops", dict_arg_ops, lambda: ({"a": torch.ones(2), "b": 2}, torch.ones(3))),
    ("set_arg_ops", set_arg_ops, lambda: ({1, 2, 3}, torch.ones(3))),
    ("tensor_list_iadd", tensor_list_iadd, lambda: ([torch.zeros(3)], torch.ones(3))),
    ("tensor_iadd_op", tensor_iadd_op, lambda: (torch.ones(3), torch.zeros(3))),
    ("imul_arg_tensor", imul_arg_tensor, lambda: (torch.ones(3), torch.ones(3) * 3)),

    ("deepcopy_arg", deepcopy_arg, lambda: ([torch.zeros(3), {"k": [1]}], torch.ones(3))),
    ("copy_arg_dict", copy_arg_dict, lambda: ({"t": torch.ones(3)}, torch.ones(3))),

    ("cm_arg", cm_arg, lambda: (ChainMap({"a": 2}, {"a": 3, "b": 4}), torch.ones(3))),
    ("error_msgs", error_msgs, lambda: (torch.ones(3),)),
    ("error_tensor_ops", error_tensor_ops, lambda: (torch.ones(3),)),
    ("raise_from_stdlib", raise_from_stdlib, lambda: (torch.ones(3),)),
    ("raise_keyerror_dd", raise_keyerror_dd, lambda: (torch.ones(3),)),
    ("raise_dc_frozen", raise_dc_frozen, lambda: (torch.ones(3),)),
]
