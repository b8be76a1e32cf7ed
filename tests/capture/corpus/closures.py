"""Corpus: closures, nonlocal, inner functions and lambdas, globals read and written.

Inner functions made in the frame (and returned out of it), cells written with nonlocal (by the
frame and by its callees), closures over tensors, default arguments, global reads and writes
(the caller sees writes), and functions made per call. Each runs under fullgraph=True unless it
says otherwise.
"""
from __future__ import annotations

import torch

from .program import Program, case, fn_program, t

COUNTER = 0
SCALE = 2.0
HISTORY: list = []


def _bump_counter():
    global COUNTER
    COUNTER += 1
    return COUNTER


@case("closures")
def inner_function_reads_enclosing_tensor():
    def f(x):
        y = x + 1

        def inner(z):
            return z * y

        return inner(x) + inner(2)
    return fn_program(f, (t(3),))


@case("closures")
def nonlocal_written_by_inner_function():
    def f(x):
        total = x * 0

        def add(v):
            nonlocal total
            total = total + v

        add(x)
        add(x * 2)
        return total
    return fn_program(f, (t(3),))


@case("closures")
def nonlocal_counter_of_calls():
    def f(x):
        calls = 0

        def step(v):
            nonlocal calls
            calls += 1
            return v + calls

        return step(step(x)), calls
    return fn_program(f, (t(3),))


@case("closures")
def nested_nonlocal_two_levels():
    def f(x):
        acc = x

        def outer():
            def inner():
                nonlocal acc
                acc = acc * 2
            inner()
            inner()

        outer()
        return acc
    return fn_program(f, (t(3),))


@case("closures")
def closure_returned_from_frame():
    def f(x):
        shift = x.sum()

        def apply(v):
            return v + shift

        return apply, apply(x)

    def drive(compiled):
        fn, value = compiled(torch.ones(3))
        return fn(torch.zeros(3)), value
    return Program(f, drive=drive)


@case("closures")
def lambda_in_sorted_key_and_map():
    def f(x):
        pairs = [(3, "c"), (1, "a"), (2, "b")]
        order = sorted(pairs, key=lambda p: p[0])
        doubled = list(map(lambda v: v * 2, [x, x + 1]))
        return [name for _, name in order], doubled
    return fn_program(f, (t(2),))


@case("closures")
def lambda_closes_over_loop_variable_late_binding():
    def f(x):
        fns = [lambda v: v + k for k in range(3)]
        return [fn(x) for fn in fns]
    return fn_program(f, (t(2),))


@case("closures")
def lambda_default_argument_binds_early():
    def f(x):
        fns = [lambda v, k=k: v + k for k in range(3)]
        return [fn(x) for fn in fns]
    return fn_program(f, (t(2),))


@case("closures")
def closure_over_input_closure():
    def make(scale):
        def g(x):
            return x * scale
        return g

    def f(x, g):
        return g(x) + 1
    return fn_program(f, (t(3), make(4.0)))


@case("closures")
def closure_cell_changed_between_calls():
    scale = [2.0]

    def make():
        value = scale[0]

        def g(x):
            return x * value
        return g

    holder = {"g": make()}

    def f(x):
        return holder["g"](x)

    def swap(_, i):
        scale[0] = 3.0 + i
        holder["g"] = make()
    return Program(f, ((t(2),), (t(2),)), between=swap)


@case("closures", fullgraph=False)
def closure_cell_rebound_after_break_in_outer_frame():
    def f(x):
        one = lambda v: v + 1  # noqa: E731

        def inner(v):
            return one(v) * 2

        first = inner(x)
        print("break")
        one = lambda v: v + 100  # noqa: E731
        return first, inner(x)
    return fn_program(f, (t(2),))


@case("closures", fullgraph=False)
def closure_variable_rebound_after_graph_break():
    def f(x):
        fn = lambda v: v * 2  # noqa: E731

        def call_it(v):
            print("between")
            return fn(v)

        a = call_it(x)
        fn = lambda v: v * 3  # noqa: E731
        b = call_it(x)
        return a, b
    return fn_program(f, (t(2),))


@case("closures")
def global_read_in_frame():
    def f(x):
        return x * SCALE
    return fn_program(f, (t(2),))


@case("closures", counts=True)
def global_changed_between_calls_recompiles():
    def f(x):
        return x * SCALE

    def change(_, i):
        global SCALE
        SCALE = 2.0 + i

    def restore():
        global SCALE
        SCALE = 2.0
    restore()
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=change, observe=lambda: SCALE)


@case("closures")
def global_written_in_frame():
    def f(x):
        global COUNTER
        COUNTER = COUNTER + 1
        return x + COUNTER

    def reset():
        global COUNTER
        COUNTER = 0
    reset()
    return Program(f, ((t(2),), (t(2),)), observe=lambda: COUNTER)


@case("closures")
def global_written_by_callee():
    def f(x):
        n = _bump_counter()
        return x * n

    def reset():
        global COUNTER
        COUNTER = 10
    reset()
    return Program(f, ((t(2),), (t(2),)), observe=lambda: COUNTER)


@case("closures")
def global_list_appended_in_frame():
    def f(x):
        HISTORY.append(x.sum())
        return x * len(HISTORY)

    HISTORY.clear()
    return Program(f, ((t(2),), (t(2),)), observe=lambda: list(HISTORY))


@case("closures")
def function_defined_each_call_same_code():
    def f(x):
        def helper(v):
            return v.sin() + 1
        return helper(x)
    return Program(f, ((t(2),), (t(2),), (t(2),)))


@case("closures", counts=True)
def inner_function_redefined_per_call_counts():
    def make(k):
        def inner(x):
            return x + k
        return inner

    def f(x, g):
        return g(x) * 2
    return Program(f, ((t(2), make(1)), (t(2), make(1)), (t(2), make(1))))


@case("closures")
def inner_function_attributes():
    def f(x):
        def helper(v):
            """doc of helper"""
            return v
        return x + len(helper.__name__), helper.__qualname__.endswith("helper"), helper.__doc__, helper.__module__
    return fn_program(f, (t(2),))


@case("closures")
def recursion_in_closure():
    def f(x):
        def power(v, n):
            if n == 0:
                return v * 0 + 1
            return v * power(v, n - 1)
        return power(x, 3)
    return fn_program(f, (t(3),))


@case("closures")
def default_argument_tensor_captured():
    bias = torch.ones(2) * 5

    def g(v, b=bias):
        return v + b

    def f(x):
        return g(x), g(x, x)
    return fn_program(f, (t(2),))


@case("closures")
def keyword_only_and_varargs():
    def g(*values, scale, offset=1):
        return sum(values) * scale + offset

    def f(x):
        return g(x, x + 1, scale=2), g(x, scale=3, offset=0)
    return fn_program(f, (t(2),))


@case("closures")
def function_passed_as_argument():
    def apply_twice(fn, v):
        return fn(fn(v))

    def f(x):
        return apply_twice(torch.sin, x), apply_twice(lambda v: v * 2, x)
    return fn_program(f, (t(2),))


@case("closures")
def higher_order_compose():
    def compose(*fns):
        def run(v):
            for fn in reversed(fns):
                v = fn(v)
            return v
        return run

    def f(x):
        pipeline = compose(torch.relu, lambda v: v - 1, torch.neg)
        return pipeline(x)
    return fn_program(f, (t(4),))


@case("closures")
def decorator_defined_in_frame():
    def f(x):
        def twice(fn):
            def wrapper(v):
                return fn(fn(v))
            return wrapper

        @twice
        def inc(v):
            return v + 1

        return inc(x)
    return fn_program(f, (t(2),))


@case("closures")
def closure_captures_module():
    lin = torch.nn.Linear(3, 2)

    def f(x):
        def run():
            return lin(x)
        return run()
    return fn_program(f, (t(2, 3),))


@case("closures")
def nonlocal_list_mutation_visible():
    def f(x):
        log = []

        def record(v):
            log.append(v.shape[0])
            return v

        record(x)
        record(x[:1])
        return log
    return fn_program(f, (t(3),))


@case("closures", fullgraph=False)
def closure_cell_inspected():
    def f(x):
        k = 3

        def g(v):
            return v * k
        cell_value = g.__closure__[0].cell_contents
        return g(x), cell_value
    return fn_program(f, (t(2),))


@case("closures")
def callable_checks():
    class WithCall:
        def __call__(self, v):
            return v

    class Plain:
        pass

    def f(x, a, b):
        out = x
        if callable(a):
            out = out + 1
        if callable(b):
            out = out + 10
        if callable(torch.sin) and callable(len) and not callable(3):
            out = out * 2
        return out
    return fn_program(f, (t(2), WithCall(), Plain()))


@case("closures")
def global_function_swapped_between_calls():
    impls = {"act": torch.relu}

    def f(x):
        return impls["act"](x)

    def swap(_, i):
        impls["act"] = torch.tanh
    return Program(f, ((t(3),), (t(3),)), between=swap)


@case("closures")
def closure_over_mutable_counter_across_calls():
    state = {"n": 0}

    def f(x):
        state["n"] += 1
        return x * state["n"]
    return Program(f, ((t(2),), (t(2),), (t(2),)), observe=lambda: state["n"])


@case("closures")
def nested_function_with_nonlocal_and_return_of_cell():
    def f(x):
        value = x

        def set_value(v):
            nonlocal value
            value = v

        def get_value():
            return value

        set_value(x * 3)
        return get_value()
    return fn_program(f, (t(2),))


@case("closures", fullgraph=False)
def nonlocal_bumped_on_both_sides_of_print_break():
    def f(x):
        n = 1

        def bump():
            nonlocal n
            n += 1
        bump()
        y = x * n
        print("mid", n)
        bump()
        return y + n, n
    return fn_program(f, (t(2),))


@case("closures", fullgraph=False)
def two_closures_share_cells_across_break():
    def f(x):
        n = [0]
        k = 1

        def inc():
            nonlocal k
            k += 1
            n[0] += k

        def read():
            return k, n[0]
        inc()
        print("brk")
        inc()
        return x * read()[0] + read()[1]
    return fn_program(f, (t(2),))


@case("closures")
def nonlocal_counter_of_compiled_closure_persists():
    def make():
        count = 0

        def f(x):
            nonlocal count
            count += 1
            return x * count
        return f, lambda: count
    f, get = make()
    return fn_program(f, (t(2),), (t(2),), (t(2),), observe=get)


@case("closures")
def lambdas_in_loop_bind_late():
    def f(x):
        fns = [lambda v: v * i for i in range(3)]
        return [g(x) for g in fns]
    return fn_program(f, (t(2),))


@case("closures", fullgraph=False)
def closure_cell_rebound_between_calls():
    def make():
        k = 1

        def f(x):
            return x * k

        def setk(v):
            nonlocal k
            k = v
        return f, setk
    f, setk = make()
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=lambda s, i: setk(i + 30))


@case("closures")
def closure_list_written_by_property_and_dunder_of_outside_object():
    # a property getter, a setter and an __eq__ of an object from outside append to a list of
    # their closure: each call of the compiled code appends again, as eager does
    log = []

    class C:
        def __init__(self):
            self._k = 2

        @property
        def k(self):
            log.append("get")
            return self._k

        @k.setter
        def k(self, v):
            log.append(("set", v))
            self._k = v

        def __eq__(self, other):
            log.append("eq")
            return other == self._k

        __hash__ = object.__hash__

    c = C()

    def f(x):
        y = x * c.k
        c.k = 3
        return y + (c == 3)
    return fn_program(f, (t(2),), (t(2),), observe=lambda: list(log))
