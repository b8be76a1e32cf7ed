"""Programs of Python control flow and frame semantics, compared by test_dynmisc_programs.py with
eager (value or exception, arguments, side effects in LOG) and with recorded graph counts.

Generators (yield, yield from, send, throw, close, generator expressions consumed by builtins),
exceptions (handlers, raise from, re-raise, exceptions crossing inlined calls and torch ops),
context managers (user classes, @contextmanager, ExitStack, grad modes), closures and cells,
globals, comprehensions, match, calls with *args/**kwargs, classes and super() chains defined in
or outside the frame. Each program is registered by `case(make_args, calls)`: `make_args()` gives
fresh arguments (torch's seed is reset first), `calls` how many times the program is called.
RESETS put the module's state (globals, closure cells, default arguments) back before a run.
"""
# ruff: noqa
# mypy: ignore-errors

import contextlib
import dataclasses
import functools

import torch

LOG: list = []  # what a program did besides returning: compared between eager and compiled
RESETS: list = []  # put module state back before eager's run and before the compiled run
PROGRAMS: list = []  # (name, fn, make_args, calls)

T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d

# ---------- generators
@case()
def g_sum_genexp(x):
    return sum(x[i] * i for i in range(3))
@case()
def g_list_genexp(x):
    return list(t + 1 for t in x)
@case()
def g_any_all(x):
    a = any(v > 100 for v in [1, 2, 3])
    b = all(v < 100 for v in [1, 2, 3])
    return x + a + b
@case()
def g_zip_gen(x):
    out = []
    for a, b in zip((i for i in range(3)), (x[j] for j in range(3))):
        out.append(a * b)
    return torch.stack(out)
def gen1(x):
    yield x + 1
    yield x + 2
    return 7
@case()
def g_yield_from(x):
    def outer():
        r = yield from gen1(x)
        yield x * r
    return list(outer())
@case()
def g_send(x):
    def acc():
        total = 0
        while True:
            v = yield total
            if v is None: break
            total = total + v
    g = acc(); next(g)
    g.send(x); r = g.send(x * 2)
    return r
@case()
def g_passed_in(x):
    return sum(x)
@case(mk=lambda: ((t for t in torch.ones(3, 2)),))
def g_arg_gen(g):
    return sum(g)
@case(mk=lambda: ((t for t in torch.ones(3, 2)), torch.ones(2)))
def g_arg_gen_next(g, y):
    a = next(g)
    return a + y
@case()
def g_stopiteration(x):
    g = iter([x])
    next(g)
    try:
        next(g)
    except StopIteration:
        return x - 1
    return x
@case()
def g_next_default(x):
    g = (i for i in range(0))
    return x + next(g, 5)
@case()
def g_gen_close_finally(x):
    def g():
        try:
            yield x
            yield x + 1
        finally:
            LOG.append("fin")
    it = g()
    a = next(it)
    it.close()
    return a
@case()
def g_gen_throw(x):
    def g():
        try:
            yield x
        except ValueError as e:
            yield x * 2
    it = g(); next(it)
    return it.throw(ValueError("boom"))
@case()
def g_return_value(x):
    def g():
        yield 1
        return x * 3
    it = g(); next(it)
    try:
        next(it)
    except StopIteration as e:
        return e.value
@case()
def g_gen_in_dict_comp(x):
    return {k: v for k, v in zip("abc", (x * i for i in range(3)))}
@case()
def g_enumerate_gen(x):
    s = 0
    for i, v in enumerate(x[j] for j in range(3)):
        s = s + i * v
    return s
@case()
def g_nested_genexp(x):
    return sum(sum(x[i][j] for j in range(2)) for i in range(2))
@case()
def g_generator_state_escape(x):
    def g():
        yield x
        yield x + 1
    it = g()
    next(it)
    return it
@case()
def g_sorted_gen(x):
    return sorted(v for v in [3, 1, 2]), x + 1
@case()
def g_max_gen(x):
    return max(x[i].sum() for i in range(3))
@case()
def g_yield_side_effect(x):
    def g():
        for i in range(3):
            LOG.append(i)
            yield x * i
    it = g()
    return next(it) + next(it)
@case()
def g_tuple_gen(x):
    return tuple(x[i] for i in range(2))
@case()
def g_dict_gen(x):
    return dict((str(i), x[i]) for i in range(2))
@case()
def g_infinite_gen_break(x):
    def count():
        i = 0
        while True:
            yield i
            i += 1
    for i in count():
        if i > 3: break
        x = x + i
    return x
@case()
def g_gen_expression_filter(x):
    return sum(v for v in range(10) if v % 2) + x
# ---------- exceptions
@case()
def e_try_except_else_finally(x):
    try:
        y = x + 1
    except Exception:
        y = x - 1
    else:
        y = y * 2
        LOG.append("else")
    finally:
        LOG.append("fin")
    return y
@case()
def e_raise_catch(x):
    try:
        raise ValueError("bad", 3)
    except ValueError as e:
        return x + e.args[1], e.args[0]
@case()
def e_raise_from(x):
    try:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise ValueError("v") from e
    except ValueError as e2:
        return x, type(e2.__cause__).__name__, e2.__cause__.args
@case()
def e_reraise(x):
    try:
        try:
            raise TypeError("t")
        except TypeError:
            LOG.append(1)
            raise
    except TypeError as e:
        return x + 1, str(e)
@case()
def e_uncaught(x):
    x = x + 1
    raise RuntimeError("out " + str(x.shape))
@case()
def e_custom_exc(x):
    class MyErr(Exception):
        def __init__(self, v):
            super().__init__("my")
            self.v = v
    try:
        raise MyErr(x * 2)
    except MyErr as e:
        return e.v + 1
class GErr(Exception):
    pass
@case()
def e_custom_global(x):
    try:
        raise GErr("a", 2)
    except GErr as e:
        return x * e.args[1]
def _raiser(x):
    if x.sum() > -1e9:
        raise IndexError("inner")
    return x
@case()
def e_across_inline(x):
    try:
        _raiser(x)
    except IndexError as e:
        return x - 1, str(e)
@case()
def e_torch_shape(x):
    try:
        return x @ x
    except RuntimeError:
        return x + 100
@case()
def e_torch_shape_uncaught(x):
    return x + torch.ones(5)
@case()
def e_suppress(x):
    with contextlib.suppress(ZeroDivisionError):
        x = x + 1
        1 / 0
        x = x + 100
    return x
@case()
def e_finally_return_override(x):
    def f():
        try:
            return x + 1
        finally:
            LOG.append("f")
    return f()
@case()
def e_exc_in_loop(x):
    out = []
    for i in range(4):
        try:
            if i % 2:
                raise ValueError(i)
            out.append(x * i)
        except ValueError as e:
            out.append(x - e.args[0])
    return out
@case()
def e_exception_var_cleared(x):
    e = 5
    try:
        raise KeyError
    except KeyError as e:
        pass
    try:
        return e
    except NameError:
        return x
@case()
def e_except_tuple(x):
    try:
        {}["missing"]
    except (IndexError, KeyError) as e:
        return x + 1, repr(e)
@case()
def e_isinstance_exc(x):
    try:
        raise NotImplementedError("ni")
    except RuntimeError as e:
        return x, isinstance(e, NotImplementedError)
@case()
def e_assert(x):
    try:
        assert x.shape[0] == 5, "shape"
    except AssertionError as e:
        return x + 1, str(e)
@case()
def e_nested_finally_order(x):
    try:
        try:
            LOG.append("a")
            raise ValueError
        finally:
            LOG.append("b")
    except ValueError:
        LOG.append("c")
    finally:
        LOG.append("d")
    return x
@case()
def e_exception_context(x):
    try:
        try:
            raise KeyError(1)
        except KeyError:
            raise ValueError(2)
    except ValueError as e:
        return x, type(e.__context__).__name__
@case()
def e_attr_error_getattr(x):
    class A: pass
    a = A()
    try:
        a.missing
    except AttributeError:
        return x + 2
@case()
def e_hasattr(x):
    class A:
        y = 1
    return x + hasattr(A(), "y") + hasattr(A(), "z")
@case()
def e_raise_class(x):
    try:
        raise ValueError
    except ValueError as e:
        return x, e.args
@case()
def e_with_traceback_none(x):
    try:
        raise ValueError("q").with_traceback(None)
    except ValueError as e:
        return x, str(e)
@case()
def e_exceptiongroup_free(x):
    try:
        int("abc")
    except ValueError as e:
        return x + 1, str(e)
@case()
def e_tensor_item_error(x):
    try:
        return x.item()
    except RuntimeError as e:
        return x * 0
@case()
def e_raise_in_finally_after_return(x):
    def f():
        try:
            return 1
        finally:
            raise KeyError("fin")
    try:
        f()
    except KeyError:
        return x

T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d

class Swallow:
    def __init__(self): self.entered = 0
    def __enter__(self):
        self.entered += 1; LOG.append("enter"); return self
    def __exit__(self, et, ev, tb):
        LOG.append(("exit", et.__name__ if et else None))
        return True
class NoSwallow:
    def __enter__(self): LOG.append("in"); return 5
    def __exit__(self, *a): LOG.append("out"); return False
@case()
def c_swallow(x):
    with Swallow() as s:
        x = x + 1
        raise ValueError("x")
    return x * s.entered
@case()
def c_noswallow_value(x):
    with NoSwallow() as v:
        y = x + v
    return y
@case()
def c_noswallow_raise(x):
    try:
        with NoSwallow():
            raise KeyError("k")
    except KeyError:
        return x - 1
@case()
def c_contextmanager(x):
    @contextlib.contextmanager
    def cm(v):
        LOG.append("pre")
        yield v * 2
        LOG.append("post")
    with cm(x) as y:
        z = y + 1
    return z
@contextlib.contextmanager
def gcm(n):
    LOG.append(("pre", n))
    try:
        yield n
    finally:
        LOG.append(("post", n))
@case()
def c_global_cm(x):
    with gcm(1) as a, gcm(2) as b:
        x = x * a + b
    return x
@case()
def c_cm_exception_swallow(x):
    @contextlib.contextmanager
    def cm():
        try:
            yield
        except ValueError:
            LOG.append("caught")
    with cm():
        x = x + 1
        raise ValueError
    return x
@case()
def c_no_grad(x):
    with torch.no_grad():
        y = x * 2
    return y, y.requires_grad
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_no_grad_rg(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y.requires_grad, z.requires_grad, y + z
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 2
    return y.requires_grad, z.requires_grad
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_set_grad_enabled(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    torch.set_grad_enabled(True)
    return y.requires_grad, torch.is_grad_enabled()
@torch.no_grad()
def _ng(x):
    return x * 2
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_no_grad_decorator(x):
    y = _ng(x)
    return y, y.requires_grad, torch.is_grad_enabled()
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_no_grad_exception_restores(x):
    try:
        with torch.no_grad():
            raise ValueError
    except ValueError:
        pass
    return (x * 2).requires_grad, torch.is_grad_enabled()
@case()
def c_exitstack(x):
    with contextlib.ExitStack() as st:
        a = st.enter_context(gcm(3))
        st.callback(LOG.append, "cb")
        x = x + a
    return x
@case()
def c_nested_with_order(x):
    with gcm("a"):
        with gcm("b"):
            x = x + 1
    return x
@case()
def c_cm_return_inside(x):
    def f():
        with gcm(7):
            return x + 1
    return f()
@case()
def c_nullcontext(x):
    with contextlib.nullcontext(x) as y:
        return y + 1
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y, y.requires_grad
@case()
def c_user_cm_with_tensor_state(x):
    class Scale:
        def __init__(self, t): self.t = t
        def __enter__(self): self.t.mul_(2); return self.t
        def __exit__(self, *a): self.t.div_(2)
    with Scale(x) as t:
        y = t + 0
    return y, x
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def c_grad_mode_break(x):
    with torch.no_grad():
        y = x * 2
        print_ = LOG.append("in")
        z = y + 1
    return z.requires_grad, z
# ---------- closures
@case()
def cl_nonlocal(x):
    n = 0
    def inc():
        nonlocal n
        n += 1
    inc(); inc()
    return x + n
@case()
def cl_nonlocal_tensor(x):
    acc = x
    def add(v):
        nonlocal acc
        acc = acc + v
    for i in range(3):
        add(i)
    return acc
@case()
def cl_return_closure(x):
    def mk(k):
        def f(t):
            return t * k
        return f
    return mk(3)
@case()
def cl_return_closure_tensor(x):
    y = x + 1
    def f(t):
        return t + y
    return f
@case()
def cl_lambda_loop(x):
    fs = [lambda t: t * i for i in range(3)]
    return [f(x) for f in fs]
@case()
def cl_lambda_loop_default(x):
    fs = [lambda t, i=i: t * i for i in range(3)]
    return [f(x) for f in fs]
def make_counter():
    c = [0]
    def f(x):
        c[0] += 1
        return x + c[0]
    return f
_counter = make_counter()
@case(n=2)
def cl_outer_closure_list(x):
    return _counter(x)
def make_nl():
    n = 0
    def f(x):
        nonlocal n
        n += 1
        return x * n
    return f
_nl = make_nl()
@case(n=3)
def cl_outer_nonlocal(x):
    return _nl(x)
@case()
def cl_cell_shared(x):
    v = 1
    def get(): return v
    def setv(a):
        nonlocal v
        v = a
    setv(5)
    r = get()
    setv(7)
    return x + r + get()
@case()
def cl_nested_three(x):
    def a():
        y = 2
        def b():
            def c():
                return x * y
            return c()
        return b()
    return a()
@case()
def cl_closure_modified_after_def(x):
    k = 1
    f = lambda t: t + k
    k = 10
    return f(x)
# ---------- globals
G_N = 0
G_LIST = []
G_T = torch.ones(3, 4)
@case(n=2)
def gl_write(x):
    global G_N
    G_N += 1
    return x + G_N
@case()
def gl_list_append(x):
    G_LIST.append(len(G_LIST))
    return x + len(G_LIST)
def _r():
    global G_N, G_T, G_LIST
    G_N = 0; G_T = torch.ones(3, 4); G_LIST.clear(); NS.a = 1
    _counter.__closure__[0].cell_contents[0] = 0
    _nl.__closure__[0].cell_contents = 0
RESETS.append(_r)
@case()
def gl_tensor_rebind(x):
    global G_T
    G_T = G_T + x
    return G_T.clone()
@case()
def gl_new_global(x):
    global G_NEW
    G_NEW = x * 2
    return G_NEW + 1
import math as _m
@case()
def gl_module_attr(x):
    return x * _m.pi
import types as _types
NS = _types.SimpleNamespace(a=1)
@case(n=2)
def gl_module_attr_write(x):
    NS.a = NS.a + 1
    return x * NS.a
@case()
def gl_del_global(x):
    global G_TMP
    G_TMP = 3
    y = x + G_TMP
    del G_TMP
    return y, "G_TMP" in globals()

T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d

@case()
def m_listcomp_side_effect(x):
    out = []
    r = [out.append(i) or x * i for i in range(3)]
    return r, out
@case()
def m_listcomp_log(x):
    return [LOG.append(i) for i in range(3)], x + 1
@case()
def m_walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x
@case()
def m_walrus_comp(x):
    total = 0
    ys = [(total := total + i) for i in range(4)]
    return x + total, ys
@case()
def m_match_int(x):
    out = []
    for v in (1, 2, 3, 9):
        match v:
            case 1: out.append(x + 1)
            case 2 | 3: out.append(x * v)
            case _: out.append(x - v)
    return out
@case()
def m_match_seq(x):
    match x.shape:
        case (a, b):
            return x * a + b
        case _:
            return x
@case()
def m_match_dict(x):
    d = {"op": "add", "v": 3}
    match d:
        case {"op": "add", "v": v}:
            return x + v
        case {"op": "mul", "v": v}:
            return x * v
@case()
def m_match_class(x):
    @dataclasses.dataclass
    class P:
        a: int
        b: int
    p = P(2, 3)
    match p:
        case P(a=2, b=bb):
            return x * bb
        case _:
            return x
@case()
def m_match_tensor_type(x):
    match x:
        case torch.Tensor():
            return x + 1
        case int():
            return x
@case()
def m_args_kwargs(x):
    def inner(a, b=2, *rest, c, d=4, **kw):
        return a * b + c + d + sum(rest) + sum(kw.values())
    def fwd(*args, **kwargs):
        return inner(*args, **kwargs)
    return fwd(x, 3, 5, 6, c=1, e=10, f=20)
@case()
def m_kwonly_default(x):
    def f(a, *, scale=2.0):
        return a * scale
    return f(x), f(x, scale=3)
@case()
def m_kwargs_dict_order(x):
    def f(**kw):
        return list(kw.keys()), [v for v in kw.values()]
    return f(b=x, a=x + 1)
def _defmut(x, acc=[]):
    acc.append(1)
    return x * len(acc)
@case(n=3)
def m_default_mut(x):
    return _defmut(x)
def _r():
    _defmut.__defaults__[0].clear()
RESETS.append(_r)
@case()
def m_recursion(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(5)
def _rec_t(x, n):
    if n == 0:
        return x
    return _rec_t(x * 2, n - 1) + 1
@case()
def m_recursion_tensor(x):
    return _rec_t(x, 4)
@case()
def m_mutual_recursion(x):
    def even(n): return True if n == 0 else odd(n - 1)
    def odd(n): return False if n == 0 else even(n - 1)
    return x + even(6) + odd(3)
@case()
def m_inner_def_defaults(x):
    def f(t, k=x.shape[1]):
        return t * k
    return f(x)
@case()
def m_class_in_fn(x):
    class A:
        k = 3
        def __init__(self, v): self.v = v
        def go(self): return self.v * self.k
    return A(x).go()
@case()
def m_class_in_fn_inherit(x):
    class A:
        def f(self, t): return t + 1
    class B(A):
        def f(self, t): return super().f(t) * 2
    return B().f(x)
class Base:
    def __init__(self, s): self.s = s
    def f(self, t): return t + self.s
class Mid(Base):
    def __init__(self, s):
        super().__init__(s * 2)
    def f(self, t): return super().f(t) * 3
class Leaf(Mid):
    def f(self, t): return super().f(t) - 1
@case()
def m_super_chain(x):
    return Leaf(2).f(x)
class MA:
    def f(self, t): LOG.append("MA"); return t + 1
class MB(MA):
    def f(self, t): LOG.append("MB"); return super().f(t) * 2
class MC(MA):
    def f(self, t): LOG.append("MC"); return super().f(t) - 3
class MD(MB, MC):
    def f(self, t): LOG.append("MD"); return super().f(t)
@case()
def m_super_diamond(x):
    return MD().f(x)
@case()
def m_super_explicit(x):
    class Q(Leaf):
        def f(self, t): return super(Mid, self).f(t)
    return Q(1).f(x)
@case()
def m_early_return_loop(x):
    for i in range(10):
        x = x + 1
        if i == 3:
            return x
    return x * 0
@case()
def m_for_else(x):
    for i in range(3):
        if i == 5: break
    else:
        x = x + 100
    for i in range(3):
        if i == 1: break
    else:
        x = x - 1000
    return x
@case()
def m_while_tensor_int(x):
    n = int(x.shape[0])
    i = 0
    while True:
        if i >= n: break
        x = x * 2
        i += 1
    return x
@case()
def m_while_item(x):
    n = 0
    s = x.abs().sum()
    while s > 1:
        s = s / 2
        n += 1
    return s, n
@case()
def m_while_item_int(x):
    k = int((x > 0).sum())
    out = x
    while k > 0:
        out = out + 1
        k -= 1
    return out
@case()
def m_data_dep_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1
@case()
def m_nested_func_closure_loop(x):
    res = []
    for i in range(3):
        def f(t, i=i):
            return t + i
        res.append(f(x))
    return res
@case()
def m_functools_partial(x):
    def f(a, b, c=1): return a * b + c
    p = functools.partial(f, c=5)
    return p(x, 2)
@case()
def m_functools_reduce(x):
    return functools.reduce(lambda a, b: a + b, [x, x * 2, x * 3])
@case()
def m_lru_cache(x):
    @functools.lru_cache
    def sq(n): return n * n
    return x * sq(3)
@case()
def m_decorator_in_fn(x):
    def deco(f):
        @functools.wraps(f)
        def w(*a): LOG.append(f.__name__); return f(*a) + 1
        return w
    @deco
    def g(t): return t * 2
    return g(x), g.__name__
@case()
def m_star_unpack(x):
    a, *b, c = [x, x + 1, x + 2, x + 3]
    return a + c, len(b)
@case()
def m_dict_unpack_merge(x):
    d1 = {"a": x}
    d2 = {**d1, "b": x + 1}
    return d2 | {"c": 3}
@case()
def m_staticmethod_classmethod(x):
    class K:
        base = 2
        @staticmethod
        def s(t): return t * 3
        @classmethod
        def c(cls, t): return t * cls.base
    return K.s(x) + K.c(x) + K().c(x)
@case()
def m_property(x):
    class P:
        def __init__(self, t): self._t = t
        @property
        def t2(self): return self._t * 2
        @t2.setter
        def t2(self, v): self._t = v / 2
    p = P(x)
    p.t2 = x + 4
    return p.t2, p._t
@case()
def m_generator_method(x):
    class C:
        def __init__(self, t): self.t = t
        def __iter__(self):
            for i in range(3):
                yield self.t * i
    return sum(C(x))
@case()
def m_dunder_call(x):
    class C:
        def __call__(self, t, k=1): return t + k
    return C()(x, k=4)
@case()
def m_getattr_dunder(x):
    class C:
        def __getattr__(self, name): return len(name)
    return x * C().abcd
@case()
def m_setattr_obj_arg(x):
    class O: pass
    o = O()
    o.a = x
    setattr(o, "b", x + 1)
    return o.a + o.b, getattr(o, "c", 5)
@case()
def m_nested_tuple_unpack(x):
    (a, (b, c)), d = (1, (2, 3)), 4
    return x * a + b + c + d
@case()
def m_chained_compare(x):
    n = x.shape[0]
    return x + (1 < n < 5) + (n < 1 < 5)
@case()
def m_ternary_chain(x):
    n = x.shape[1]
    r = "a" if n == 3 else "b" if n == 4 else "c"
    return x, r
@case()
def m_global_fn_redefine(x):
    def f(t): return t + 1
    y = f(x)
    def f(t): return t + 2
    return y + f(x)
@case()
def m_try_in_loop_continue(x):
    s = x
    for i in range(5):
        try:
            if i == 2:
                continue
            if i == 4:
                break
            s = s + i
        finally:
            LOG.append(i)
    return s
@case()
def m_isinstance_user(x):
    class A: pass
    class B(A): pass
    b = B()
    return x + isinstance(b, A) + issubclass(B, A) + isinstance(b, (int, B))
@case()
def m_sorted_key_lambda(x):
    items = [(3, "c"), (1, "a"), (2, "b")]
    s = sorted(items, key=lambda p: -p[0])
    return x * s[0][0], [p[1] for p in s]
@case()
def m_iter_dict_mutate_copy(x):
    d = {"a": 1, "b": 2}
    for k in list(d):
        d[k + k] = d.pop(k) * 2
    return x + sum(d.values()), d
@case()
def m_yield_in_comprehension_like(x):
    def pairs():
        for i in range(2):
            for j in range(2):
                yield i, j
    return [x * i + j for i, j in pairs()]
@case()
def m_lambda_default_capture_tensor(x):
    f = lambda t, y=x: t + y
    return f(x)
@case()
def m_closure_in_class_body(x):
    k = 5
    class C:
        v = k * 2
        def f(self): return k
    return x + C.v + C().f()
@case()
def m_dunder_add(x):
    class V:
        def __init__(self, t): self.t = t
        def __add__(self, o): return V(self.t + o.t)
        def __radd__(self, o): return V(self.t + o)
    r = sum([V(x), V(x * 2)], V(x * 0))
    r2 = 1 + V(x)
    return r.t, r2.t
@case()
def m_exc_in_comprehension(x):
    def f(i):
        if i == 2: raise ValueError(i)
        return x * i
    try:
        return [f(i) for i in range(4)]
    except ValueError as e:
        return e.args[0]

T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d
def _lvl2(x):
    raise ValueError("deep")
def _lvl1(x):
    y = x * 2
    return _lvl2(y)
@case()
def x_two_levels(x):
    try:
        return _lvl1(x)
    except ValueError as e:
        return x + 1, str(e)
@case()
def x_two_levels_tensor_after(x):
    y = x * 3
    try:
        _lvl1(x)
    except ValueError:
        y = y + 1
    return y
@case()
def x_listcomp_raise_direct(x):
    try:
        return [x * i if i < 2 else 1 / 0 for i in range(4)]
    except ZeroDivisionError:
        return x - 1
@case()
def x_listcomp_raise_call(x):
    def f(i):
        if i == 2: raise ValueError(i)
        return x * i
    try:
        return [f(i) for i in range(4)]
    except ValueError as e:
        return x * e.args[0]
@case()
def x_genexp_raise(x):
    def f(i):
        if i == 2: raise KeyError(i)
        return x * i
    try:
        return sum(f(i) for i in range(4))
    except KeyError as e:
        return x * 7
@case()
def x_method_raise(x):
    class A:
        def g(self, t):
            raise TypeError("tt")
        def f(self, t):
            return self.g(t * 2)
    try:
        A().f(x)
    except TypeError:
        return x * 5
@case()
def x_finally_in_inlined(x):
    def f(t):
        try:
            raise ValueError
        finally:
            LOG.append("f")
    try:
        f(x)
    except ValueError:
        return x + 2
@case()
def x_except_in_inlined_reraise(x):
    def f(t):
        try:
            raise ValueError("a")
        except ValueError as e:
            raise RuntimeError("b") from e
    try:
        f(x)
    except RuntimeError as e:
        return x * 2, str(e.__cause__)
@case()
def x_stopiteration_in_gen_to_runtime(x):
    def g():
        yield 1
        raise StopIteration
    try:
        list(g())
    except RuntimeError as e:
        return x + 1, str(e)
@case()
def x_next_exhausted_in_inline(x):
    def f(it):
        return next(it)
    it = iter([1])
    f(it)
    try:
        f(it)
    except StopIteration:
        return x * 3
@case()
def x_shape_error_caught_inline(x):
    def f(t):
        return t @ t
    try:
        return f(x)
    except RuntimeError as e:
        return x + 1
@case()
def x_shape_error_caught_after_op(x):
    y = x.sin()
    try:
        z = y.view(5, 5)
    except RuntimeError:
        z = y.cos()
    return z
@case()
def x_index_error_tensor(x):
    try:
        return x[10]
    except IndexError:
        return x[0]
@case()
def x_raise_in_with_in_loop(x):
    import contextlib
    for i in range(3):
        with contextlib.suppress(ValueError):
            if i == 1:
                raise ValueError
            x = x + i
    return x
@case()
def x_exc_attribute_custom(x):
    class E(Exception):
        code = 7
    try:
        raise E("m")
    except E as e:
        return x * e.code, e.args
@case()
def x_exc_args_tensor(x):
    try:
        raise ValueError(x * 2)
    except ValueError as e:
        return e.args[0] + 1
@case()
def x_exc_str_repr(x):
    e = KeyError("a", 1)
    return x, str(e), repr(e), e.args
@case()
def x_exception_in_else(x):
    try:
        try:
            pass
        except ValueError:
            return x
        else:
            raise KeyError("else")
    except KeyError:
        return x + 9
@case()
def x_return_in_finally_swallows(x):
    def f():
        try:
            raise ValueError
        finally:
            return x + 1
    return f()
@case()
def x_break_in_finally(x):
    for i in range(3):
        try:
            raise ValueError
        finally:
            break
    return x + i
@case()
def x_generic_except(x):
    try:
        x.foo_bar
    except Exception as e:
        return x + 1, type(e).__name__
@case()
def x_base_exception(x):
    try:
        raise KeyboardInterrupt
    except BaseException as e:
        return x, type(e).__name__
@case()
def x_exc_from_none(x):
    try:
        try:
            raise KeyError
        except KeyError:
            raise ValueError from None
    except ValueError as e:
        return x, e.__suppress_context__, e.__cause__
@case()
def x_exc_uncaught_after_mutation(x):
    LOG.append(1)
    x.add_(1)
    raise ValueError("after")
@case()
def x_exc_uncaught_in_inline_after_mutation(x):
    def f(t):
        t.mul_(2)
        raise KeyError("k")
    y = x + 1
    f(x)
    return y
@case()
def x_sys_exc_info(x):
    import sys
    try:
        raise ValueError("q")
    except ValueError:
        t, v, tb = sys.exc_info()
        return x, t.__name__, str(v)
@case()
def x_raise_non_exception(x):
    try:
        raise 5
    except TypeError as e:
        return x + 1
@case()
def x_unbound_local(x):
    try:
        if x.shape[0] == 99:
            z = 1
        return z
    except UnboundLocalError:
        return x - 1
@case()
def x_nameerror(x):
    try:
        return undefined_name_xyz
    except NameError:
        return x * 2
@case()
def x_zero_div(x):
    n = x.shape[0] - 3
    try:
        return x / n, 1 // n
    except ZeroDivisionError as e:
        return x, str(e)
@case()
def x_gen_finally_on_exc(x):
    def g():
        try:
            yield 1
            yield 2
        finally:
            LOG.append("gf")
    try:
        for v in g():
            raise ValueError
    except ValueError:
        pass
    return x
@case()
def x_except_star_like(x):
    try:
        raise ValueError("v")
    except (TypeError, ValueError) as e:
        msg = e.args
    return x, msg
