"""Programs with graph breaks inside frames (in try blocks, with blocks, loops, inlined calls,
comprehensions), data-dependent control flow over several calls, and ops that raise only at run
time (an index out of range, bad probabilities: fake tensors cannot tell) inside try and with
blocks, registered in the PROGRAMS list of dynmisc_programs_flow (test_dynmisc_programs.py
compares them with eager).
"""
# ruff: noqa
# mypy: ignore-errors

import contextlib
import functools
import itertools

import torch
from torch._dynamo import graph_break as gb  # Kiln's capture treats it as kiln.graph_break()

from dynmisc_programs_flow import LOG, PROGRAMS, RESETS

T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d

# generators interacting with graph breaks / state
@case()
def s_gen_break_inside(x):
    def g():
        for i in range(3):
            print_like = LOG.append(i)
            yield x * i
    return list(g())
@case()
def s_gen_with_tensor_cond(x):
    def g(t):
        while t.sum() > -100 and t.abs().max() < 1000:
            t = t * 2
            yield t
    out = []
    for v in g(x):
        out.append(v)
        if len(out) == 3: break
    return out
@case()
def s_gen_obj_mutation(x):
    class S:
        def __init__(self): self.n = 0
    s = S()
    def g():
        for i in range(3):
            s.n += 1
            yield i
    r = [x * v for v in g()]
    return r, s.n
@case()
def s_gen_send_tensor(x):
    def g():
        t = yield
        while True:
            t = yield t * 2
    it = g(); next(it)
    a = it.send(x)
    b = it.send(a + 1)
    return b
@case()
def s_gen_yield_from_return(x):
    def inner():
        yield x
        return x * 5
    def outer():
        v = yield from inner()
        LOG.append("outer")
        return v
    it = outer()
    first = next(it)
    try:
        next(it)
    except StopIteration as e:
        return first, e.value
@case()
def s_gen_yield_from_list(x):
    def g():
        yield from [x, x + 1]
        yield from (x * i for i in range(2))
    return list(g())
@case()
def s_gen_zip_strict(x):
    try:
        return list(zip([1, 2], (x for _ in range(3)), strict=True))
    except ValueError as e:
        return x, str(e)
@case()
def s_itertools_chain_gen(x):
    return list(itertools.chain((x * i for i in range(2)), [x]))
@case()
def s_itertools_islice_gen(x):
    def nat():
        i = 0
        while True:
            yield x + i
            i += 1
    return list(itertools.islice(nat(), 3))
@case()
def s_map_filter(x):
    return list(map(lambda t: t * 2, filter(lambda t: t.shape[0] == 4, [x[0], x[1]])))
@case()
def s_reversed_enumerate(x):
    return [x * i + j for i, j in reversed(list(enumerate([5, 6])))]
@case()
def s_gen_close_no_finally(x):
    def g():
        yield x
        yield x + 1
    it = g(); v = next(it); it.close()
    try:
        next(it)
    except StopIteration:
        return v * 2
@case()
def s_gen_throw_uncaught(x):
    def g():
        yield x
    it = g(); next(it)
    try:
        it.throw(KeyError("z"))
    except KeyError as e:
        return x + 1, str(e)
@case()
def s_gen_running_state(x):
    import inspect
    def g(): yield 1
    it = g()
    a = inspect.getgeneratorstate(it)
    next(it)
    b = inspect.getgeneratorstate(it)
    return x, a, b
@case()
def s_gen_fn_arg_list(x):
    def g(items):
        for it in items:
            yield it * 2
    return torch.stack(list(g([x, x + 1])))
@case()
def s_genexp_over_tensor(x):
    return sum(row.sum() for row in x)
@case()
def s_genexp_captures_late(x):
    k = 1
    g = (x * k for _ in range(2))
    k = 10
    return list(g)
@case()
def s_gen_in_class_iter_break(x):
    class R:
        def __iter__(self):
            yield 1; yield 2; yield 3
    for v in R():
        if v == 2: break
    return x * v
# grad modes and contexts across graph breaks
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        LOG.append(torch.is_grad_enabled())
        z = y * x
    return z, z.requires_grad
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_enable_grad_fn(x):
    @torch.enable_grad()
    def f(t): return t * 2
    with torch.no_grad():
        y = f(x)
    return y.requires_grad, y
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_set_grad_enabled_decorator(x):
    @torch.set_grad_enabled(False)
    def f(t): return t * 2
    y = f(x)
    return y.requires_grad, torch.is_grad_enabled(), y
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_grad_mode_in_cm(x):
    @contextlib.contextmanager
    def off():
        with torch.no_grad():
            yield
    with off():
        y = x + 1
    return y.requires_grad, y
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_grad_backward_inside(x):
    y = (x * x).sum()
    g, = torch.autograd.grad(y, x)
    return g
@case(mk=lambda: (torch.randn(3, requires_grad=True),))
def s_no_grad_return_early(x):
    def f(t):
        with torch.no_grad():
            return t * 2
    y = f(x)
    return y.requires_grad, (x * 2).requires_grad
@case()
def s_autocast_cm(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x.t()
    return y.dtype, y.float()
@case()
def s_cm_enter_exit_manual(x):
    cm = contextlib.nullcontext(3)
    v = cm.__enter__()
    cm.__exit__(None, None, None)
    return x * v
@case()
def s_cm_exit_sees_exc(x):
    class CM:
        def __enter__(self): return self
        def __exit__(self, et, ev, tb):
            LOG.append((et.__name__, str(ev)))
            return isinstance(ev, KeyError)
    with CM():
        raise KeyError("abc")
    try:
        with CM():
            raise ValueError("def")
    except ValueError:
        return x + 1
@case()
def s_exitstack_unwind_on_error(x):
    try:
        with contextlib.ExitStack() as st:
            st.callback(LOG.append, "a")
            st.callback(LOG.append, "b")
            raise ValueError
    except ValueError:
        return x * 2
@case()
def s_contextdecorator(x):
    class D(contextlib.ContextDecorator):
        def __enter__(self): LOG.append("e"); return self
        def __exit__(self, *a): LOG.append("x"); return False
    @D()
    def f(t): return t + 1
    return f(x)
@case()
def s_cm_yields_tensor_mutated(x):
    @contextlib.contextmanager
    def cm(t):
        t.add_(1)
        yield t
        t.sub_(1)
    with cm(x) as y:
        r = y * 2
    return r
@case()
def s_cm_generator_raises_in_exit(x):
    @contextlib.contextmanager
    def cm():
        yield
        raise RuntimeError("on exit")
    try:
        with cm():
            x = x + 1
    except RuntimeError as e:
        return x, str(e)
@case()
def s_redirect_like_cm(x):
    state = {"v": 0}
    @contextlib.contextmanager
    def setv(v):
        old = state["v"]; state["v"] = v
        try:
            yield
        finally:
            state["v"] = old
    with setv(5):
        y = x * state["v"]
    return y, state["v"]
# closures & cells
@case()
def s_cell_in_loop_late_binding(x):
    fs = []
    for i in range(3):
        fs.append(lambda: x * i)
    return [f() for f in fs]
@case()
def s_closure_over_arg_rebound(x):
    def f(): return x + 1
    x = x * 10
    return f()
@case()
def s_nonlocal_in_genexp(x):
    c = 0
    def bump():
        nonlocal c
        c += 1
        return c
    vals = [bump() for _ in range(3)]
    return x * c, vals
@case()
def s_closure_returned_called_twice(x):
    def mk():
        n = [0]
        def f(t):
            n[0] += 1
            return t * n[0]
        return f
    f = mk()
    return f(x), f(x)
@case()
def s_fn_attribute(x):
    def f(t): return t * f.k
    f.k = 3
    return f(x), f.k
@case()
def s_closure_cell_del(x):
    v = 3
    def f(): return v
    a = f()
    del v
    try:
        f()
    except NameError as e:
        return x * a, type(e).__name__
@case()
def s_class_closure_method(x):
    scale = 4
    class C:
        def f(self, t): return t * scale
    return C().f(x)
@case()
def s_lambda_recursion_y(x):
    fib = lambda n: n if n < 2 else fib(n - 1) + fib(n - 2)
    return x * fib(7)
@case()
def s_global_statement_in_nested(x):
    def f():
        global G_Z
        G_Z = 9
    f()
    return x * G_Z
G_CFG = {"scale": 2}
@case()
def s_global_dict_mutation(x):
    G_CFG["scale"] += 1
    return x * G_CFG["scale"], dict(G_CFG)
def _r():
    G_CFG["scale"] = 2
RESETS.append(_r)
@case()
def s_recursion_depth_tensor(x):
    def f(t, n):
        if n == 0: return t
        return f(t.sin(), n - 1)
    return f(x, 10)
@case()
def s_kwargs_mutation(x):
    def f(**kw):
        kw["z"] = 1
        return kw
    d = {"a": x}
    r = f(**d)
    return r, d
@case()
def s_args_tuple_identity(x):
    def f(*a): return a
    t = (x, 1)
    return f(*t) == t, len(f(*t))
@case()
def s_default_arg_eval_once(x):
    def mk():
        LOG.append("mk")
        return 5
    def f(t, k=mk()):
        return t * k
    return f(x), f(x)
@case()
def s_annotations(x):
    def f(t: torch.Tensor, k: int = 2) -> torch.Tensor:
        return t * k
    return f(x), f.__annotations__["k"] is int
@case()
def s_dunder_name_qualname(x):
    def inner(): pass
    return x, inner.__name__, inner.__qualname__.split(".")[-1]
@case()
def s_while_else(x):
    i = 0
    while i < 3:
        i += 1
    else:
        x = x + i
    return x
@case()
def s_nested_break_continue(x):
    acc = x
    for i in range(4):
        for j in range(4):
            if j > i: break
            if (i + j) % 2: continue
            acc = acc + i * j
    return acc
@case()
def s_loop_over_tensor_size(x):
    out = x
    for d in x.shape:
        out = out * d
    return out
@case()
def s_range_from_tensor_int(x):
    n = x.size(0)
    return sum(x[i] for i in range(n - 1, -1, -1))
@case()
def s_item_loop(x):
    k = int(x[0, 0] > 0) + 2
    y = x
    for _ in range(k):
        y = y + 1
    return y

T = lambda: (torch.randn(3, 4),)
TG = lambda: (torch.randn(3, requires_grad=True),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d
@contextlib.contextmanager
def gcm(n):
    LOG.append(("pre", n))
    try:
        yield n
    finally:
        LOG.append(("post", n))
class UCM:
    def __init__(self, n): self.n = n
    def __enter__(self): LOG.append(("in", self.n)); return self.n
    def __exit__(self, et, ev, tb): LOG.append(("out", self.n, et.__name__ if et else None)); return False
@case()
def b_break_in_try(x):
    try:
        y = x + 1
        gb()
        y = y * 2
    except ValueError:
        y = x
    return y
@case()
def b_break_in_try_then_raise(x):
    try:
        y = x + 1
        gb()
        raise ValueError("after break")
    except ValueError as e:
        y = y * 3
    return y
@case()
def b_break_in_finally(x):
    try:
        y = x + 1
    finally:
        gb()
        LOG.append("fin")
    return y * 2
@case()
def b_break_in_except(x):
    try:
        raise KeyError
    except KeyError:
        y = x + 1
        gb()
        y = y * 2
    return y
@case()
def b_break_in_loop(x):
    for i in range(3):
        x = x + i
        gb()
        x = x * 2
    return x
@case()
def b_break_in_while_break(x):
    i = 0
    while True:
        x = x + 1
        gb()
        i += 1
        if i == 2: break
    return x
@case()
def b_break_in_user_cm(x):
    with UCM(1) as n:
        y = x + n
        gb()
        y = y * 2
    return y
@case()
def b_break_in_contextmanager(x):
    with gcm(2) as n:
        y = x + n
        gb()
        y = y * 2
    return y
@case(mk=TG)
def b_break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        gb()
        z = y + x
    return z.requires_grad, z, (x * 1).requires_grad
@case(mk=TG)
def b_break_in_enable_grad_in_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
            gb()
            z = y + x
        w = x * 3
    return z.requires_grad, w.requires_grad, z
@case()
def b_break_in_inlined(x):
    def f(t):
        t = t + 1
        gb()
        return t * 2
    return f(x) + 1
@case()
def b_break_in_inlined_in_try(x):
    def f(t):
        t = t + 1
        gb()
        raise ValueError("f")
    try:
        f(x)
    except ValueError:
        return x - 1
@case()
def b_break_in_nested_with(x):
    with UCM(1):
        with gcm(2):
            y = x + 1
            gb()
            y = y * 3
    return y
@case()
def b_break_then_exception_in_cm(x):
    try:
        with UCM(5):
            y = x + 1
            gb()
            raise KeyError("k")
    except KeyError:
        return x * 2
@case()
def b_break_in_genexp(x):
    def f(i):
        gb()
        return x * i
    return sum(f(i) for i in range(3))
@case()
def b_break_in_listcomp(x):
    def f(i):
        gb()
        return x * i
    return [f(i) for i in range(3)]
@case()
def b_break_closure_nonlocal(x):
    n = 0
    def inc():
        nonlocal n
        n += 1
    inc()
    gb()
    inc()
    return x * n
@case()
def b_break_closure_created_before(x):
    k = x.sum()
    def f(t): return t + k
    gb()
    return f(x)
@case()
def b_break_closure_created_after(x):
    gb()
    k = x.sum()
    def f(t): return t + k
    return f(x)
@case()
def b_break_global_write(x):
    global BG
    BG = 1
    gb()
    BG += 1
    return x * BG
@case()
def b_break_in_for_else(x):
    for i in range(2):
        x = x + 1
    else:
        gb()
        x = x * 2
    return x
@case()
def b_break_iter_dict(x):
    d = {"a": 1, "b": 2, "c": 3}
    for k, v in d.items():
        x = x + v
        if k == "b": gb()
    return x
@case()
def b_break_generator_iter_list(x):
    out = []
    for t in (x * i for i in range(3)):
        out.append(t)
    gb()
    return out
@case()
def b_break_in_match(x):
    match x.shape[0]:
        case 3:
            y = x + 1
            gb()
            y = y + 2
        case _:
            y = x
    return y
@case()
def b_break_walrus(x):
    if (y := x + 1).shape[0] == 3:
        gb()
        return y * 2
    return y
@case()
def b_break_kwargs_call(x):
    def f(a, *, b):
        gb()
        return a + b
    return f(x, b=2) * 3
@case()
def b_break_super(x):
    class A:
        def f(self, t):
            gb()
            return t + 1
    class B(A):
        def f(self, t):
            return super().f(t) * 2
    return B().f(x)
@case()
def b_break_recursion(x):
    def f(t, n):
        if n == 0:
            gb()
            return t
        return f(t + 1, n - 1)
    return f(x, 3)
@case()
def b_break_in_exitstack(x):
    with contextlib.ExitStack() as st:
        st.callback(LOG.append, "cb")
        y = x + 1
        gb()
        y = y * 2
    return y
@case()
def b_break_suppress(x):
    with contextlib.suppress(KeyError):
        y = x + 1
        gb()
        raise KeyError
    return y
@case()
def b_break_in_class_method_state(x):
    class C:
        def __init__(self): self.items = []
        def add(self, t):
            self.items.append(t)
            gb()
            self.items.append(t + 1)
    c = C()
    c.add(x)
    return c.items
@case()
def b_break_deep_stack(x):
    return x + (x * (x + (gb() or 1)))
@case()
def b_break_in_with_return(x):
    with UCM(3):
        y = x + 1
        gb()
        return y
@case()
def b_break_two_with_exc_inside_swallow(x):
    class Sw:
        def __enter__(self): return self
        def __exit__(self, *a): LOG.append("sw"); return True
    with Sw():
        y = x + 1
        gb()
        raise ValueError
    return x * 4
@case()
def b_break_in_try_finally_return(x):
    def f(t):
        try:
            t = t + 1
            gb()
            return t
        finally:
            LOG.append("fin")
    return f(x) * 2

_seq = [0]
def varied():
    _seq[0] += 1
    g = torch.Generator().manual_seed(_seq[0])
    return (torch.randn(4, 3, generator=g),)
def case(mk=varied, n=4):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d
def _r(): _seq[0] = 0
RESETS.append(_r)

@case()
def l_data_break(x):
    acc = x[0] * 0
    for row in x:
        if row.sum() > 0:
            break
        acc = acc + row
    return acc
@case()
def l_data_continue(x):
    acc = x[0] * 0
    n = 0
    for row in x:
        if row.sum() < 0:
            continue
        acc = acc + row
        n += 1
    return acc, n
@case()
def l_while_data(x):
    i = 0
    s = x.sum()
    while s.abs() > 0.5 and i < 6:
        s = s / 2
        i += 1
    return s, i
@case()
def l_item_count(x):
    k = int((x > 0).sum().item())
    out = []
    for i in range(k % 4):
        out.append(x[i])
    return out
@case()
def l_tolist_loop(x):
    total = 0.0
    for v in x[:, 0].tolist():
        if v > 0:
            total += v
    return x * total
@case()
def l_for_else_data(x):
    for row in x:
        if row.max() > 2:
            r = row
            break
    else:
        r = x[-1] * 100
    return r
@case()
def l_nested_data_break(x):
    hits = []
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if x[i, j] > 1:
                hits.append((i, j))
                break
    return hits
@case()
def l_early_return_data(x):
    for i, row in enumerate(x):
        if row.mean() > 0.3:
            return i, row * 2
    return -1, x[0]
@case()
def l_try_in_data_loop(x):
    out = []
    for row in x:
        try:
            if row.sum() > 0:
                raise ValueError("pos")
            out.append(row)
        except ValueError:
            out.append(-row)
    return torch.stack(out)
@case()
def l_with_in_data_loop(x):
    out = x[0] * 0
    for row in x:
        with torch.no_grad():
            if row.sum() > 0:
                out = out + row
    return out
@case()
def l_gen_data_filter(x):
    return sum(r for r in x if r.sum() > 0) if (x.sum(1) > 0).any() else x[0]
@case()
def l_any_data(x):
    return any(r.sum() > 1 for r in x), all(r.sum() > -5 for r in x)
@case()
def l_closure_data(x):
    count = 0
    def visit(r):
        nonlocal count
        if r.sum() > 0:
            count += 1
    for r in x:
        visit(r)
    return x * count
@case()
def l_recursion_data(x):
    def f(t, d):
        if d == 0 or t.sum() < 0:
            return t, d
        return f(t - 1, d - 1)
    return f(x, 5)
@case()
def l_list_mutation_data(x):
    lst = [x[0]]
    for r in x[1:]:
        if r.sum() > lst[-1].sum():
            lst.append(r)
    return lst
@case()
def l_dict_data(x):
    d = {}
    for i, r in enumerate(x):
        d["pos" if r.sum() > 0 else "neg"] = i
    return d
@case()
def l_global_data(x):
    global LG
    LG = 0
    for r in x:
        if r.sum() > 0:
            LG += 1
    return x * LG
@case()
def l_cm_data(x):
    @contextlib.contextmanager
    def cm():
        LOG.append("in")
        yield
        LOG.append("out")
    with cm():
        y = x + 1
    if y.sum() > 12:
        return y
    return -y
@case()
def l_break_in_user_cm_data(x):
    class C:
        def __enter__(self): LOG.append("e"); return self
        def __exit__(self, *a): LOG.append("x"); return False
    with C():
        if x.sum() > 0:
            y = x * 2
        else:
            y = x * 3
    return y
@case()
def l_gen_consumed_partially_data(x):
    g = (r for r in x)
    first = next(g)
    if first.sum() > 0:
        second = next(g)
    else:
        second = first
    return first + second, list(g)
@case()
def l_exception_data(x):
    try:
        if x.sum() > 0:
            raise ValueError("p")
        return x
    except ValueError as e:
        return x * 2, str(e)
@case()
def l_bool_tensor_while(x):
    y = x.clone()
    n = 0
    while (y > 0).any():
        y = y - 1
        n += 1
        if n > 10: break
    return y, n
@case()
def l_walrus_data(x):
    res = [s for r in x if (s := r.sum()) > 0]
    return res
@case()
def l_match_data(x):
    n = int(x.sum() > 0) + int(x.mean() > 0.2)
    match n:
        case 0: return x
        case 1: return x + 1
        case _: return x + 2


# ---------------------------------------------------------------- ops that raise at run time
T = lambda: (torch.randn(3, 4),)
def case(mk=T, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_runtime_index_caught(x, i):
    try:
        y = x + 1
        return y[i]
    except IndexError:
        return x - 1
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_runtime_index_mutation_uncaught(x, i):
    x.add_(1)
    return x[i]
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_runtime_index_mutation_caught(x, i):
    x.add_(1)
    try:
        return x[i]
    except IndexError:
        return x * 2
@case(mk=lambda: (torch.zeros(3), torch.tensor([0, 7])))
def r_index_select_oob(x, i):
    try:
        return torch.index_select(x, 0, i)
    except (IndexError, RuntimeError) as e:
        return x + 3
@case(mk=lambda: (torch.zeros(3), torch.tensor([0, 7])))
def r_gather_oob_after_mut(x, i):
    x.mul_(2).add_(1)
    return x.gather(0, i)
@case(mk=lambda: (torch.zeros(3), torch.tensor([0.0, float("nan")])))
def r_multinomial_err(x, p):
    try:
        return torch.multinomial(p.abs(), 1)
    except RuntimeError:
        return x
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_item_index(x, i):
    try:
        return x[i.item()]
    except IndexError:
        return x + 1
@case(mk=lambda: (torch.zeros(3),))
def r_check_in_graph(x):
    try:
        torch._check(x.sum() > 1, lambda: "small")
        return x
    except RuntimeError as e:
        return x + 1
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_cm_exit_on_runtime_error(x, i):
    class CM:
        def __enter__(self): LOG.append("in")
        def __exit__(self, et, ev, tb):
            LOG.append(("out", et.__name__ if et else None)); return True
    with CM():
        y = x + 1
        z = y[i]
    return x * 5
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_finally_on_runtime_error(x, i):
    try:
        return x[i]
    finally:
        LOG.append("fin")
@case(mk=lambda: (torch.zeros(3, requires_grad=True), torch.tensor(5)))
def r_no_grad_restored_after_runtime_error(x, i):
    try:
        with torch.no_grad():
            y = x[i]
    except IndexError:
        pass
    return (x * 2).requires_grad
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_global_write_before_runtime_error(x, i):
    global RG
    RG = 1
    LOG.append("before")
    return x[i]
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_list_arg_mutation_runtime_error(x, i):
    return x[i]
@case(mk=lambda: ([torch.zeros(3)], torch.tensor(5)))
def r_list_mutated_then_error(lst, i):
    lst.append(lst[0] + 1)
    return lst[0][i]
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_gen_runtime_error(x, i):
    def g():
        yield x + 1
        yield x[i]
    out = []
    try:
        for v in g():
            out.append(v)
    except IndexError:
        out.append(x - 1)
    return out
@case(mk=lambda: (torch.zeros(3), torch.tensor(5)))
def r_inline_runtime_error(x, i):
    def f(t):
        return t[i] + 1
    try:
        return f(x)
    except IndexError as e:
        return x * 7
@case(mk=lambda: (torch.zeros(3), torch.tensor(1)))
def r_no_error(x, i):
    try:
        return x[i] + 1
    except IndexError:
        return x
@case(mk=lambda: (torch.zeros(2, 3), torch.tensor(9)))
def r_setitem_oob_after_mut(x, i):
    x.add_(1)
    x[i] = 5.0
    return x
@case(mk=lambda: (torch.zeros(3),))
def r_assert_async(x):
    try:
        torch._assert_async(x.sum() > 1)
    except RuntimeError:
        return x + 1
    return x
@case(mk=lambda: (torch.zeros(3),))
def r_nonzero_static(x):
    try:
        return torch.nonzero(x)
    except RuntimeError:
        return x

def case(mk, n=1):
    def d(f): PROGRAMS.append((f.__name__, f, mk, n)); return f
    return d
BAD = lambda: (torch.zeros(3), torch.tensor([0, 7]))
_k = [0]
def alternating():
    _k[0] += 1
    return (torch.arange(3.0), torch.tensor([0, 7 if _k[0] % 2 == 0 else 1]))
def _r(): _k[0] = 0
RESETS.append(_r)
@case(BAD)
def h_suppress_gather(x, i):
    with contextlib.suppress(RuntimeError, IndexError):
        y = x.gather(0, i)
        return y
    return x + 5
@case(BAD)
def h_user_cm_swallow(x, i):
    class Sw:
        def __enter__(self): LOG.append("in"); return self
        def __exit__(self, et, ev, tb): LOG.append(("out", et.__name__ if et else None)); return True
    with Sw():
        y = torch.index_select(x, 0, i) + 1
        LOG.append("not reached")
    return x - 2
@case(BAD)
def h_inlined_in_try(x, i):
    def pick(t):
        return t.index_select(0, i) * 2
    try:
        return pick(x)
    except IndexError as e:
        return x + 11
@case(BAD)
def h_raise_inside_inlined_try(x, i):
    def pick(t):
        try:
            return t.index_select(0, i) * 2
        except IndexError:
            return t * 0 + 4
    return pick(x) + 1
@case(BAD)
def h_side_effects_before(x, i):
    LOG.append("before")
    lst = [1]
    try:
        lst.append(2)
        y = x.index_select(0, i)
    except IndexError:
        lst.append(3)
        y = x
    return y, lst
@case(BAD)
def h_random_before(x, i):
    try:
        r = torch.rand(3)
        return r + x.index_select(0, i).sum()
    except IndexError:
        return torch.rand(3)
@case(alternating, 4)
def h_alternating(x, i):
    try:
        return x.index_select(0, i)
    except IndexError:
        return x * -1
@case(BAD)
def h_mutation_then_caught(x, i):
    x.add_(1)
    try:
        return x.index_select(0, i)
    except IndexError:
        return x * 2
@case(BAD)
def h_mutation_in_try_caught(x, i):
    try:
        x.add_(1)
        return x.index_select(0, i)
    except IndexError:
        return x * 2
@case(BAD)
def h_after_break(x, i):
    from torch._dynamo import graph_break
    y = x + 1
    graph_break()
    try:
        return y.index_select(0, i)
    except IndexError:
        return y * 3
@case(BAD)
def h_finally_log(x, i):
    try:
        return x.index_select(0, i)
    except IndexError:
        LOG.append("caught")
        return x
    finally:
        LOG.append("finally")
@case(BAD)
def h_no_grad_block(x, i):
    try:
        with torch.no_grad():
            y = x.index_select(0, i)
    except IndexError:
        y = x + 9
    return y, torch.is_grad_enabled()
@case(lambda: (torch.zeros(3), torch.tensor([0.0, -1.0])))
def h_multinomial(x, p):
    try:
        return torch.multinomial(p, 1)
    except RuntimeError:
        return x
@case(lambda: (torch.zeros(3, 4), torch.tensor([1, 5])))
def h_embedding_oob(w, i):
    try:
        return torch.nn.functional.embedding(i, w)
    except IndexError:
        return w.sum()
@case(lambda: (torch.zeros(3), torch.tensor([0, 1])))
def h_good_indices(x, i):
    try:
        return x.index_select(0, i) + 1
    except IndexError:
        return x
@case(BAD)
def h_uncaught_in_with(x, i):
    with torch.no_grad():
        y = x.index_select(0, i)
    return y
@case(lambda: (torch.zeros(3, requires_grad=True), torch.tensor([0, 7])))
def h_requires_grad(x, i):
    try:
        return x.index_select(0, i) * 2
    except IndexError:
        return x * 3
