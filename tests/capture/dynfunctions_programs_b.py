"""Programs of the kinds PyTorch's Dynamo tests exercise in test_reconstruct / test_decorators /
test_functions (written here, not copied): values returned from a graph that must be rebuilt
(tuples of tensors and constants, slices, ranges, dict views, functions, partials, bound methods,
classes), decorators (kiln.disable / allow_in_graph / graph_break, functools.wraps, lru_cache,
contextmanager), default and keyword-only arguments, *args/**kwargs forwarding, closures returned
from inlined functions, recursion. The harness is test_dynfunctions_programs.py; `case` as in
dynfunctions_programs_a.py.
"""
# ruff: noqa
# mypy: ignore-errors

import contextlib
import functools

import torch

import kiln

LOG: list = []
RESETS: list = []
PROGRAMS: list = []


def case(mk=None, n=2):
    mk = mk or (lambda i: (torch.randn(3, 4),))
    def d(f):
        PROGRAMS.append((f.__name__, f, mk, n))
        return f
    return d


def state():
    return {k: v for k, v in globals().items() if k.startswith("GV_")}


# ---------------------------------------------------------------- reconstructed values
@case()
def rc_tuple_tensors_consts(x):
    return (x + 1, 3, "s", None, 2.5, (x * 2, True))


@case()
def rc_slice_obj(x):
    s = slice(1, x.shape[1], 2)
    return x[:, s], s


@case()
def rc_range_obj(x):
    r = range(1, x.shape[0] + 1)
    return x * len(r), r, r[1:]


@case()
def rc_dict_keys_view(x):
    d = {"a": x, "b": x + 1}
    return d.keys(), d.values(), d.items()


@case()
def rc_local_function(x):
    def f(t):
        return t * 2
    return x + 1, f


@case()
def rc_closure_over_tensor(x):
    y = x.sum(0)
    def f(t):
        return t + y
    return f


@case()
def rc_lambda_closure(x):
    k = x.shape[1]
    return lambda t: t * k


@case()
def rc_partial_returned(x):
    def scale(t, s, b=0):
        return t * s + b
    return functools.partial(scale, s=x.shape[0], b=1)


@case()
def rc_partial_of_torch(x):
    return functools.partial(torch.add, alpha=2), x * 1


@case()
def rc_partial_with_tensor(x):
    return functools.partial(torch.mul, x.sum(0))


class Scaler:
    def __init__(self, s):
        self.s = s

    def apply(self, t):
        return t * self.s


@case()
def rc_bound_method(x):
    obj = Scaler(x.shape[0])
    return obj.apply


@case()
def rc_bound_method_tensor_state(x):
    obj = Scaler(x.sum())
    return obj.apply, obj


@case()
def rc_class_returned(x):
    return Scaler, x + 1


@case()
def rc_local_class_returned(x):
    class Local:
        k = 3
    return Local.k * x, Local


@case()
def rc_torch_function_returned(x):
    return torch.relu, x * 2


@case()
def rc_builtin_method_returned(x):
    lst = [x]
    return lst.append, lst


@case()
def rc_tensor_method_returned(x):
    return x.add, x.sum


@case()
def rc_nested_containers(x):
    return {"a": [x, (x + 1, {"b": x * 2})], "c": {1, 2}}


@case()
def rc_same_tensor_twice(x):
    y = x + 1
    return y, y, [y]


@case()
def rc_input_returned(x):
    return x, x + 1


@case()
def rc_view_of_input(x):
    return x[1:], x.view(-1), x.t()


@case()
def rc_size_and_dtype(x):
    return x.shape, x.dtype, x.device, x.size(1), x.stride()


@case()
def rc_generator_expression_returned(x):
    return (x * i for i in range(3))


@case()
def rc_iterator_returned(x):
    it = iter([x, x + 1, x + 2])
    next(it)
    return it


GV_IT = None
RESETS.append(lambda: globals().update(GV_IT=None))


class _Holder:
    pass


# iterators made in the frame and returned, stored outside or kept across a break: eager's types
@case()
def rc_list_iterator_stepped(x):
    it = iter([x, x + 1, x + 2])
    next(it)
    return it


@case()
def rc_reversed_iterator(x):
    it = reversed([x, x * 2, x * 3])
    next(it)
    return it, type(it).__name__


@case()
def rc_enumerate_iterator(x):
    it = enumerate([x, x + 1], 3)
    next(it)
    return it


@case()
def rc_zip_iterator(x):
    return zip([x, x + 1], "ab")


@case()
def rc_dict_iterators(x):
    d = {"a": x, "b": x + 1, "c": 3}
    k, v, i = iter(d), iter(d.values()), iter(d.items())
    next(k)
    return k, v, i, reversed(d)


@case()
def rc_set_and_deque_iterators(x):
    import collections
    s = iter({1, 2, 3})
    q = iter(collections.deque([x, x + 1]))
    next(q)
    return s, q


@case()
def rc_iterator_stored_global(x):
    global GV_IT
    GV_IT = iter([x, x + 1])
    next(GV_IT)
    return x + 1


@case(lambda i: (torch.randn(3), _Holder()))
def rc_iterator_stored_on_object(x, h):
    h.it = enumerate([x, x * 2])
    return x * 2


@case()
def rc_iterator_across_break(x):
    it = iter([x, x + 1, x + 2])
    next(it)
    print("", end="")
    next(it)
    return it, x + 1


@case()
def rc_iterator_type_checked(x):
    it = iter([x, x])
    return type(it) is type(iter([])), type(reversed([x])).__name__, x * 2


@case()
def rc_enumerate_zip_returned(x):
    return list(enumerate([x, x])), list(zip("ab", [x, x + 1]))


@case()
def rc_dict_fromkeys(x):
    d = dict.fromkeys(["a", "b"], 0)
    d["a"] = x
    return d


@case()
def rc_method_of_builtin_type(x):
    return str.upper, int.__add__(2, 3) * x


@case()
def rc_object_with_closure_attr(x):
    obj = Scaler(2)
    obj.fn = lambda t: t + 1
    return obj, x


@case()
def rc_partial_of_partial(x):
    p = functools.partial(torch.clamp, min=-0.5)
    return functools.partial(p, max=0.5), x


@case()
def rc_set_of_ints(x):
    return {x.shape[0], x.shape[1], 3}, frozenset([1, 2])


@case()
def rc_tuple_unpack_reconstruct(x):
    a, *rest = [x, x + 1, x + 2]
    return rest, a


@case()
def rc_ellipsis_none(x):
    return x[..., None], Ellipsis, NotImplemented


@case()
def rc_complex_and_bytes(x):
    return x * 2, complex(1, 2), b"ab", bytearray(b"c")


# ---------------------------------------------------------------- decorators
@kiln.disable
def _disabled_helper(t):
    LOG.append("disabled")
    return t * 3


@case()
def dc_disable_callee(x):
    return _disabled_helper(x + 1) + 1


def _allowed(t):
    return t.sin() + t.cos()


_allowed_in_graph = kiln.allow_in_graph(_allowed)


@case()
def dc_allow_in_graph(x):
    return _allowed_in_graph(x) * 2


@case()
def dc_explicit_break(x):
    y = x + 1
    kiln.graph_break()
    return y * 2


def _logging(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        LOG.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


@_logging
def _wrapped_helper(t, k=1):
    return t * k


@case()
def dc_wraps(x):
    return _wrapped_helper(x, k=2), _wrapped_helper.__name__, _wrapped_helper.__wrapped__(x)


@functools.lru_cache(maxsize=None)
def _cached_const(n):
    LOG.append(("cached", n))
    return n * 10


@case(lambda i: (torch.randn(3),), 2)
def dc_lru_cache_int(x):
    return x * _cached_const(x.shape[0])


RESETS.append(_cached_const.cache_clear)


@functools.cache
def _cached_shape_table():
    return {"a": 1, "b": 2}


@case()
def dc_functools_cache(x):
    return x * _cached_shape_table()["b"]


@contextlib.contextmanager
def _scope(tag):
    LOG.append(("enter", tag))
    try:
        yield tag * 2
    finally:
        LOG.append(("exit", tag))


@case()
def dc_contextmanager(x):
    with _scope(3) as v:
        y = x * v
    return y


@case()
def dc_contextmanager_exception(x):
    try:
        with _scope(1):
            raise ValueError("inside")
    except ValueError as e:
        return x + 1, str(e)


@_scope(5)
def _decorated_by_cm(t):
    return t + 1


@case()
def dc_contextmanager_as_decorator(x):
    return _decorated_by_cm(x)


def _twice(fn):
    def w(t):
        return fn(fn(t))
    return w


@_twice
@_twice
def _add1(t):
    return t + 1


@case()
def dc_stacked_decorators(x):
    return _add1(x)


def _with_arg(k):
    def deco(fn):
        def w(t):
            return fn(t) * k
        return w
    return deco


@case()
def dc_decorator_with_arg(x):
    @_with_arg(3)
    def inner(t):
        return t - 1
    return inner(x)


@case()
def dc_no_grad_decorated(x):
    @torch.no_grad()
    def inner(t):
        return t * 2
    y = inner(x.requires_grad_())
    return y, y.requires_grad


class _CountCalls:
    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)


@_CountCalls
def _counted(t):
    return t * 5


RESETS.append(lambda: setattr(_counted, "calls", 0))


@case()
def dc_class_decorator(x):
    return _counted(x), _counted.calls


def _register(registry):
    def deco(fn):
        registry[fn.__name__] = fn
        return fn
    return deco


@case()
def dc_registry_decorator_in_frame(x):
    reg = {}

    @_register(reg)
    def double(t):
        return t * 2
    return reg["double"](x), sorted(reg)


@case()
def dc_staticmethod_property_decorators(x):
    class C:
        @staticmethod
        def s(t):
            return t + 1

        @property
        def p(self):
            return 4

        @classmethod
        def c(cls, t):
            return t * cls.k
        k = 2
    return C.s(x) + C().p + C.c(x)


@case()
def dc_disable_in_loop(x):
    for _ in range(2):
        x = _disabled_helper(x)
    return x


# ---------------------------------------------------------------- arguments
def _mutable_default(t, acc=[]):
    acc.append(1)
    return t * len(acc)


RESETS.append(lambda: _mutable_default.__defaults__[0].clear())


@case(lambda i: (torch.randn(3),), 3)
def ar_mutable_default_list(x):
    return _mutable_default(x)


def _dict_default(t, cache={}):
    cache["n"] = cache.get("n", 0) + 1
    return t + cache["n"]


RESETS.append(lambda: _dict_default.__defaults__[0].clear())


@case(lambda i: (torch.randn(3),), 3)
def ar_mutable_default_dict(x):
    return _dict_default(x)


@case(lambda i: (torch.randn(3), 2), 2)
def ar_kwonly(x, n):
    def f(t, *, scale, shift=1):
        return t * scale + shift
    return f(x, scale=n), f(x, shift=0, scale=3)


@case(lambda i: (torch.randn(3),), 2)
def ar_kwonly_missing(x):
    def f(t, *, scale):
        return t * scale
    try:
        return f(x)
    except TypeError as e:
        return x, "missing" in str(e)


@case(lambda i: (torch.randn(3),), 2)
def ar_args_forward(x):
    def inner(a, b, c=3):
        return a * b + c
    def outer(*args, **kwargs):
        return inner(*args, **kwargs)
    return outer(x, 2), outer(x, b=3, c=0), outer(*(x, 4))


@case(lambda i: (torch.randn(3),), 2)
def ar_kwargs_merge(x):
    def f(**kw):
        return sorted(kw.items(), key=lambda p: p[0])
    base = {"a": 1, "b": 2}
    return f(**base, c=x.shape[0]), f(**{**base, "a": 5})


@case(lambda i: (torch.randn(3),), 2)
def ar_posonly(x):
    def f(a, b, /, c):
        return a + b * c
    return f(x, 2, c=3), f(x, 1, 1)


@case(lambda i: (torch.randn(3),), 2)
def ar_duplicate_kwarg_error(x):
    def f(a, b):
        return a + b
    try:
        return f(x, 1, a=2)
    except TypeError as e:
        return x, str(e)


@case(lambda i: (torch.randn(3),), 2)
def ar_too_many_args(x):
    def f(a):
        return a
    try:
        return f(x, x)
    except TypeError as e:
        return str(e)


@case(lambda i: (torch.randn(3), {"k": 2, "j": torch.ones(3)}), 2)
def ar_dict_splat_input(x, kw):
    def f(t, k, j):
        return t * k + j
    return f(x, **kw)


@case(lambda i: (torch.randn(3), [1, 2]), 2)
def ar_list_splat_input(x, lst):
    def f(t, a, b):
        return t * a + b
    return f(x, *lst)


@case(lambda i: (torch.randn(3),), 2)
def ar_default_tensor(x):
    def f(t, other=torch.ones(3)):
        return t + other
    return f(x)


@case(lambda i: (torch.randn(3),), 2)
def ar_defaults_changed(x):
    def f(t, k=1):
        return t * k
    f.__defaults__ = (5,)
    return f(x)


@case(lambda i: (torch.randn(3),), 2)
def ar_kwdefaults(x):
    def f(t, *, k=1):
        return t * k
    return f(x), f.__kwdefaults__


@case(lambda i: (torch.randn(3),), 2)
def ar_varargs_len_type(x):
    def f(*args, **kwargs):
        return len(args), type(args).__name__, type(kwargs).__name__, list(kwargs)
    return f(x, 1, 2, z=3, y=4), x


@case(lambda i: (torch.randn(3),), 2)
def ar_star_from_generator(x):
    def f(*ts):
        return sum(ts)
    return f(*(x * i for i in range(3)))


@case(lambda i: (torch.randn(3),), 2)
def ar_kwargs_mutated_in_callee(x):
    def f(**kw):
        kw["extra"] = 1
        return kw
    d = {"a": x}
    r = f(**d)
    return r, d


@case(lambda i: (torch.randn(3),), 2)
def ar_keyword_to_torch(x):
    opts = {"dim": 0, "keepdim": True}
    return torch.sum(x, **opts), x.max(**{"dim": 0}).values


# ---------------------------------------------------------------- closures and recursion
def _make_adder(k):
    def add(t):
        return t + k
    return add


@case(lambda i: (torch.randn(3),), 2)
def cr_factory_inlined(x):
    return _make_adder(3)(x), _make_adder(x)(x)


@case(lambda i: (torch.randn(3),), 2)
def cr_factory_returned(x):
    return _make_adder(x * 2)


@case(lambda i: (torch.randn(3),), 2)
def cr_counter_closure(x):
    def make():
        n = 0
        def inc():
            nonlocal n
            n += 1
            return n
        return inc
    c = make()
    c(); c()
    return x * c()


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_list_of_fns(x):
    fns = [lambda t, i=i: t * i for i in range(3)]
    return [f(x) for f in fns]


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_cell_contents(x):
    k = 4
    def f():
        return k
    return x * f.__closure__[0].cell_contents


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


@case(lambda i: (torch.randn(3),), 2)
def cr_recursion_int(x):
    return x * _fact(5)


def _tree_sum(t):
    if isinstance(t, (list, tuple)):
        return sum(_tree_sum(v) for v in t)
    return t


@case(lambda i: ([torch.randn(2), [torch.randn(2), (torch.randn(2),)]],), 2)
def cr_recursion_tree(xs):
    return _tree_sum(xs)


def _halve(t, depth):
    if depth == 0:
        return t
    return _halve(t / 2, depth - 1) + 1


@case(lambda i: (torch.randn(3), 3 + i), 2)
def cr_recursion_depth_arg(x, d):
    return _halve(x, d)


@case(lambda i: (torch.randn(3),), 2)
def cr_nested_closure_3(x):
    def a(k):
        def b(j):
            def c(t):
                return t * k + j
            return c
        return b
    return a(2)(3)(x)


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_captures_loop_var_late(x):
    fns = []
    for i in range(3):
        fns.append(lambda t: t * i)
    return [f(x) for f in fns]


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_over_mutable_list(x):
    acc = []
    def push(t):
        acc.append(t)
        return len(acc)
    push(x); push(x + 1)
    return acc


@case(lambda i: (torch.randn(3),), 2)
def cr_fn_attribute_set(x):
    def f(t):
        return t * f.k
    f.k = 3
    return f(x), f.k


@case(lambda i: (torch.randn(3),), 2)
def cr_nonlocal_rebind_tensor(x):
    y = x
    def upd():
        nonlocal y
        y = y * 2
    upd(); upd()
    return y


def _even(n):
    return True if n == 0 else _odd(n - 1)


def _odd(n):
    return False if n == 0 else _even(n - 1)


@case(lambda i: (torch.randn(3),), 2)
def cr_mutual_recursion(x):
    return x + 1 if _even(6) else x - 1


@case(lambda i: (torch.randn(3),), 2)
def cr_recursive_local(x):
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)
    return x * fib(7)


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_over_function_arg_default(x):
    def outer(t, k=2):
        def inner():
            return t * k
        return inner
    return outer(x)(), outer(x, 5)()


@case(lambda i: (torch.randn(3),), 2)
def cr_closure_name_qualname(x):
    def outer():
        def inner():
            pass
        return inner
    f = outer()
    return x, f.__name__, f.__qualname__.split(".")[-3:]


@case(lambda i: (torch.randn(3),), 2)
def cr_callable_passed_through(x):
    def apply(fn, *a):
        return fn(*a)
    return apply(torch.add, x, 1), apply(lambda t: t.relu(), x), apply(max, 1, 2)


@case(lambda i: (torch.randn(3),), 2)
def cr_map_with_closure(x):
    k = x.sum()
    return list(map(lambda t: t * k, [x, x + 1]))


@case(lambda i: (torch.randn(3),), 2)
def cr_sorted_key_closure(x):
    w = {"a": 3, "b": 1, "c": 2}
    return sorted("abc", key=lambda c: w[c]), x
