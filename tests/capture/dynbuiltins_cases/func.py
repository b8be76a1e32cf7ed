"""Programs for test_dynbuiltins_programs.py: functools and operator."""
import itertools, functools, operator, torch
X = lambda: (torch.ones(3),)

def _mul(a, b, c=1):
    return a * b * c
def partial1(x):
    return functools.partial(_mul, 2)(x)
def partial_kw(x):
    p = functools.partial(_mul, c=3)
    return p(x, 2), p(x, 2, c=5)
def partial_nested(x):
    p = functools.partial(functools.partial(_mul, 2), c=4)
    return p(x), p.args, sorted(p.keywords)
def partial_torch(x):
    f = functools.partial(torch.add, alpha=2)
    return f(x, x)
_glob_partial = functools.partial(_mul, c=7)
def partial_global(x):
    return _glob_partial(x, 1)
def reduce1(x):
    return functools.reduce(operator.add, [x, x, x])
def reduce_init(x):
    return functools.reduce(lambda a, b: a * b, [1, 2, 3], x)
def reduce_mul_ints(x):
    return x + functools.reduce(operator.mul, range(1, 5))
@functools.lru_cache(maxsize=None)
def _cached(n):
    return n * 2
def lru_call(x):
    return x * _cached(3)
@functools.lru_cache
def _cached2(n, k=1):
    return list(range(n * k))
def lru_call2(x):
    return x + len(_cached2(2, k=2))
def _deco(fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        return fn(*a, **k) + 1
    return inner
@_deco
def _wrapped(x):
    return x * 2
def wraps1(x):
    return _wrapped(x), _wrapped.__name__, _wrapped.__wrapped__(x)
class _CP:
    def __init__(self, t):
        self.t = t
    @functools.cached_property
    def dbl(self):
        return self.t * 2
def cached_prop(x):
    o = _CP(x)
    a = o.dbl
    b = o.dbl
    return a + b, "dbl" in o.__dict__
@functools.singledispatch
def _sd(v):
    return "obj"
@_sd.register
def _(v: int):
    return "int"
@_sd.register(list)
def _(v):
    return "list"
def singledispatch1(x):
    return x + 1, _sd(1), _sd([1]), _sd("a")
def partial_method(x):
    class A:
        def f(self, a, b):
            return a + b
        g = functools.partialmethod(f, 10)
    return A().g(x)
def cmp_to_key1(x):
    return sorted([3, 1, 2], key=functools.cmp_to_key(lambda a, b: b - a)), x
def total_ordering1(x):
    @functools.total_ordering
    class V:
        def __init__(self, v): self.v = v
        def __eq__(self, o): return self.v == o.v
        def __lt__(self, o): return self.v < o.v
    return V(1) <= V(2), V(3) >= V(2), x * 2
def partial_repr_free(x):
    p = functools.partial(_mul, x)
    return p.func is _mul, p(2)
def partial_in_map(x):
    return list(map(functools.partial(torch.mul, x), [1, 2]))
def reduce_empty(x):
    try:
        functools.reduce(operator.add, [])
    except TypeError as e:
        return x, str(e)
def itemgetter1(x):
    g = operator.itemgetter(1)
    return g([x, x + 1]), operator.itemgetter(0, 2)([1, 2, 3])
def itemgetter_dict(x):
    return operator.itemgetter("a")({"a": x})
def attrgetter1(x):
    return operator.attrgetter("shape")(x), operator.attrgetter("real.shape", "ndim")(x)
def methodcaller1(x):
    return operator.methodcaller("add", 2)(x), operator.methodcaller("split", ",")("a,b")
def iadd_list(x):
    l = [x]
    l2 = l
    l2 = operator.iadd(l2, [x + 1])
    return l is l2, len(l)
def iadd_tensor(x):
    y = x.clone()
    z = operator.iadd(y, 1)
    return y, z is y
def iadd_stmt_list(x):
    a = [1]
    b = a
    b += [x]
    return a
def imul_list(x):
    a = [x]
    a *= 3
    return a
def op_funcs(x):
    return operator.add(x, 1), operator.neg(x), operator.truediv(x, 2), operator.getitem([1, 2], 1), operator.contains([1, 2], 2)
def op_sorted_itemgetter(x):
    d = [("b", 2), ("a", 3), ("c", 1)]
    return sorted(d, key=operator.itemgetter(1)), x
def op_index(x):
    return operator.index(3), x + operator.length_hint([1, 2, 3])
def op_setitem(x):
    l = [0, 0]
    operator.setitem(l, 1, x)
    operator.delitem(l, 0)
    return l
def op_truth(x):
    return operator.truth([]), operator.not_(0), operator.is_(None, None), x
def max_attrgetter(x):
    class P:
        def __init__(self, v): self.v = v
    ps = [P(1), P(5), P(3)]
    return max(ps, key=operator.attrgetter("v")).v * x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n != "X"]
