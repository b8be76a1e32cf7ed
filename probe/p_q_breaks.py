import torch, collections, dataclasses, enum, functools, itertools, operator, math, contextlib
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

gb = torch._dynamo.graph_break

@case("q_br")
def q_br_list_iter_append_with_break_in_body():
    def f(x):
        l = [1, 2]
        for v in l:
            x = x + v
            gb()
            if len(l) < 4:
                l.append(v * 10)
        return x, l
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_enumerate_list_break_in_body():
    def f(xs):
        out = []
        for i, v in enumerate(xs):
            out.append(v * i)
            gb()
        return out
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("q_br")
def q_br_dict_mutation_across_break():
    def f(x):
        d = {"a": x}
        d["b"] = x * 2
        gb()
        d["c"] = d["a"] + d["b"]
        del d["a"]
        return d
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_object_attr_mutation_across_break():
    class S:
        def __init__(self):
            self.n = 0
            self.hist = []
    s = S()
    def f(x):
        s.n += 1
        s.hist.append(s.n)
        gb()
        s.n *= 10
        return x * s.n
    return fn_program(f, (t(3),), (t(3),), observe=lambda: (s.n, list(s.hist)))

@case("q_br")
def q_br_generator_consumed_across_break():
    def gen(x):
        for i in range(3):
            yield x * i
    def f(x):
        g = gen(x)
        a = next(g)
        gb()
        b = next(g)
        return a + b
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_with_user_ctx_break_inside():
    log = []
    class C:
        def __enter__(self):
            log.append("in")
            return self
        def __exit__(self, *a):
            log.append("out")
    def f(x):
        with C():
            y = x * 2
            gb()
            y = y + 1
        return y
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_br")
def q_br_try_except_break_inside_try():
    def f(x):
        try:
            y = x * 2
            gb()
            raise ValueError("v")
        except ValueError:
            y = x - 1
        return y
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_nonlocal_after_break_in_nested():
    def f(x):
        c = 0
        def inc():
            nonlocal c
            c += 1
        inc()
        gb()
        inc()
        inc()
        return x * c
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_global_write_before_and_after_break():
    def f(x):
        global _Q_BR_G
        _Q_BR_G = 1
        y = x * _Q_BR_G
        gb()
        _Q_BR_G = _Q_BR_G + 5
        return y * _Q_BR_G
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_identity_compare_after_break():
    class T: pass
    A = T()
    def f(x, o):
        gb()
        return x * (2 if o is A else 3)
    return fn_program(f, (t(3), A), (t(3), T()))

@case("q_br")
def q_br_recursion_with_break():
    def rec(x, n):
        if n == 0:
            return x
        if n == 2:
            gb()
        return rec(x * 2, n - 1)
    def f(x):
        return rec(x, 3)
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_closure_list_mutation_in_loop_with_print():
    log = []
    def f(x):
        for i in range(3):
            log.append(i)
            if i == 1:
                print("", end="")
            x = x + i
        return x
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_br")
def q_br_zip_lists_break_in_body():
    def f(xs, ys):
        out = []
        for a, b in zip(xs, ys):
            out.append(a * b)
            gb()
        return out
    return fn_program(f, ([t(2), t(2)], [t(2), t(2)]))

@case("q_br")
def q_br_deque_across_break():
    def f(x):
        dq = collections.deque([x])
        dq.append(x * 2)
        gb()
        dq.appendleft(x * 3)
        return list(dq)
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_set_across_break():
    def f(x):
        s = {1, 2}
        s.add(3)
        gb()
        s.discard(1)
        return x * len(s), sorted(s)
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_dataclass_across_break():
    @dataclasses.dataclass
    class Acc:
        v: torch.Tensor
        n: int = 0
    def f(x):
        a = Acc(x)
        a.n += 1
        gb()
        a.v = a.v * 2
        a.n += 1
        return a.v, a.n
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_list_iter_remove_with_break():
    def f(x):
        l = [1, 2, 3, 4]
        for v in l:
            l.remove(v)
            gb()
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_enumerate_mutated_across_break():
    def f(x):
        l = [1, 2]
        for i, v in enumerate(l):
            gb()
            if len(l) < 4:
                l.append(v + 5)
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_globals_dict_across_break():
    def f(x):
        g = globals()
        g["_Q_BR_H"] = 2
        gb()
        return x * g["_Q_BR_H"] + _Q_BR_H
    return fn_program(f, (t(3),))

@case("q_br")
def q_br_enum_missing_then_break():
    class E(enum.Enum):
        A = 1
        B = 2
        @classmethod
        def _missing_(cls, v):
            return cls.B
    def f(x):
        e = E(99)
        gb()
        return x * e.value
    return fn_program(f, (t(3),))
