import functools
import torch
from harness import case, fn_program, t, Program, kw

@case("closures")
def cl_counter_factory_called_in_frame():
    def make():
        n = 0
        def inc(x):
            nonlocal n
            n += 1
            return x * n
        return inc
    inc = make()
    def f(x):
        return inc(x) + inc(x)
    return fn_program(f, (t(2),), (t(2),), observe=lambda: inc.__closure__[0].cell_contents)

@case("closures")
def cl_closure_made_in_frame_returned():
    def f(x):
        y = x.cos()
        def g(z):
            return z + y
        return g
    def drive(cf):
        x = torch.ones(2)
        g = cf(x)
        return g(torch.ones(2)), g(x * 2)
    return Program(f, drive=drive)

@case("closures")
def cl_nonlocal_tensor_rebound_twice():
    def f(x):
        acc = x
        def step():
            nonlocal acc
            acc = acc * 2 + 1
        step(); step()
        return acc
    return fn_program(f, (t(3),))

@case("closures")
def cl_lambda_in_loop_late_binding():
    def f(x):
        fs = [lambda v: v * i for i in range(3)]
        return sum(g(x) for g in fs)
    return fn_program(f, (t(2),))

@case("closures")
def cl_lambda_default_binding():
    def f(x):
        fs = [lambda v, i=i: v * i for i in range(3)]
        return sum(g(x) for g in fs)
    return fn_program(f, (t(2),))

@case("closures")
def cl_three_level_nesting():
    def f(x):
        a = x + 1
        def g():
            b = a * 2
            def h():
                return a + b
            return h()
        return g()
    return fn_program(f, (t(2),))

@case("closures")
def cl_closure_over_outer_cell_mutated_between_calls():
    box = [1.0]
    def f(x):
        return x * box[0]
    def between(s, i):
        box[0] = 3.0
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("closures")
def cl_outer_cell_int_changes():
    k = 2
    def f(x):
        return x * k
    def between(s, i):
        nonlocal k
        k = 5
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("closures")
def cl_global_int_written():
    def f(x):
        global G_STEP
        G_STEP += 1
        return x + G_STEP
    globals()["G_STEP"] = 0
    return fn_program(f, (t(2),), (t(2),), observe=lambda: G_STEP)
G_STEP = 0

@case("closures")
def cl_global_tensor_rebound():
    def f(x):
        global G_T
        G_T = G_T + x
        return G_T * 2
    globals()["G_T"] = torch.zeros(2)
    return fn_program(f, (t(2),), (t(2),), observe=lambda: G_T)
G_T = None

@case("closures")
def cl_global_dict_mutated_in_place():
    def f(x):
        G_D["calls"] = G_D.get("calls", 0) + 1
        G_D.setdefault("shapes", []).append(tuple(x.shape))
        return x.sum()
    G_D.clear()
    return fn_program(f, (t(2),), (t(3),), observe=lambda: G_D)
G_D = {}

@case("closures")
def cl_global_flag_changes_branch():
    def f(x):
        if G_FLAG:
            return x + 1
        return x - 1
    globals()["G_FLAG"] = True
    def between(s, i):
        globals()["G_FLAG"] = not G_FLAG
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=between)
G_FLAG = True

@case("closures")
def cl_closure_cell_tensor_inplace():
    buf = torch.zeros(3)
    def f(x):
        buf.add_(x)
        return buf * 2
    return fn_program(f, (t(3),), (t(3),), observe=lambda: buf)

@case("closures")
def cl_recursive_inner_function():
    def f(x):
        def rec(v, n):
            if n == 0:
                return v
            return rec(v * 2, n - 1)
        return rec(x, 3)
    return fn_program(f, (t(2),))

@case("closures")
def cl_mutual_recursion():
    def even(n, v):
        return v if n == 0 else odd(n - 1, v + 1)
    def odd(n, v):
        return v * 2 if n == 0 else even(n - 1, v - 1)
    def f(x):
        return even(5, x), odd(4, x)
    return fn_program(f, (t(2),))

@case("closures")
def cl_default_mutable_arg_accumulates():
    def helper(v, acc=[]):
        acc.append(1)
        return v * len(acc)
    def f(x):
        return helper(x)
    return fn_program(f, (t(2),), (t(2),), observe=lambda: len(helper.__defaults__[0]))

@case("closures")
def cl_kwonly_and_defaults():
    def g(a, b=2, *, c=3, d):
        return a * b + c * d
    def f(x):
        return g(x, d=x), g(x, 1, c=0, d=1)
    return fn_program(f, (t(2),))

@case("closures")
def cl_star_args_kwargs_forwarding():
    def g(*args, **kwargs):
        return sum(args) + sum(kwargs.values()), sorted(kwargs)
    def f(x, *rest, **kw):
        return g(x, *rest, scale=x, **kw)
    return fn_program(f, (t(2), t(2)), kw(t(2), t(2), t(2), extra=t(2)))

@case("closures")
def cl_kwargs_dict_mutated_by_callee():
    def g(**kw):
        kw["z"] = 1
        return len(kw)
    def f(x):
        d = {"a": 1}
        n = g(**d)
        return x * n, d
    return fn_program(f, (t(2),))

@case("closures")
def cl_function_attribute_read():
    def g(v):
        return v * g.scale
    g.scale = 3
    def f(x):
        return g(x)
    def between(s, i):
        g.scale = 7
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("closures")
def cl_function_attribute_written_in_frame():
    def g(v):
        return v
    g.calls = 0
    def f(x):
        g.calls += 1
        return g(x) + g.calls
    return fn_program(f, (t(2),), (t(2),), observe=lambda: g.calls)

@case("closures")
def cl_function_name_and_defaults_introspected():
    def g(a, b=4):
        return a
    def f(x):
        return x * g.__defaults__[0], g.__name__, g.__code__.co_argcount
    return fn_program(f, (t(2),))

@case("closures")
def cl_closure_captures_loop_var_after_loop():
    def f(x):
        for i in range(4):
            pass
        def g():
            return x * i
        return g()
    return fn_program(f, (t(2),))

@case("closures")
def cl_nonlocal_across_graph_break():
    def f(x):
        n = 1
        def bump():
            nonlocal n
            n += 10
        bump()
        torch._dynamo.graph_break()
        bump()
        return x * n
    return fn_program(f, (t(2),))

@case("closures")
def cl_inner_function_defaults_tensor():
    def f(x):
        def g(v, w=x * 2):
            return v + w
        return g(x), g(x, x)
    return fn_program(f, (t(2),))

@case("closures")
def cl_decorator_made_in_frame():
    def f(x):
        def deco(fn):
            def wrapper(v):
                return fn(v) + 1
            return wrapper
        @deco
        def sq(v):
            return v * v
        return sq(x)
    return fn_program(f, (t(2),))

@case("closures")
def cl_generator_closure_over_tensor():
    def f(x):
        def gen():
            for k in range(3):
                yield x * k
        return sum(gen())
    return fn_program(f, (t(2),))

@case("closures")
def cl_class_defined_in_closure_uses_outer():
    scale = 3
    class M:
        def go(self, v):
            return v * scale
    m = M()
    def f(x):
        return m.go(x)
    return fn_program(f, (t(2),))

@case("closures")
def cl_nonlocal_list_rebinding_visible_to_caller():
    def outer():
        items = []
        def f(x):
            nonlocal items
            items = items + [x.sum()]
            return x * len(items)
        return f, lambda: items
    f, get = outer()
    return fn_program(f, (t(2),), (t(2),), observe=get)
