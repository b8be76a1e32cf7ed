import itertools
import torch
from harness import case, fn_program, t, Program, kw

@case("generators")
def g_generator_expression_sum():
    def f(x):
        return sum(x * i for i in range(4))
    return fn_program(f, (t(2),))

@case("generators")
def g_generator_with_return_value():
    def gen(x):
        yield x
        yield x * 2
        return "done"
    def f(x):
        g = gen(x)
        a = next(g); b = next(g)
        try:
            next(g)
        except StopIteration as s:
            return a + b, s.value
    return fn_program(f, (t(2),))

@case("generators")
def g_yield_from_inner():
    def inner(x):
        yield x
        yield x + 1
    def outer(x):
        yield from inner(x)
        yield x * 10
    def f(x):
        return torch.stack(list(outer(x)))
    return fn_program(f, (t(2),))

@case("generators")
def g_send_to_generator():
    def acc():
        total = 0
        while True:
            v = yield total
            total = total + v
    def f(x):
        g = acc()
        next(g)
        g.send(x)
        return g.send(x * 2)
    return fn_program(f, (t(2),))

@case("generators")
def g_generator_side_effect_order():
    log = []
    def gen(x):
        for i in range(3):
            log.append(i)
            yield x * i
    def f(x):
        out = []
        for v in gen(x):
            log.append("got")
            out.append(v)
        return sum(out)
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("generators")
def g_zip_of_generators_early_stop():
    def f(x):
        a = (x * i for i in range(5))
        b = iter([1, 2])
        pairs = list(zip(a, b))
        rest = list(a)
        return len(pairs), len(rest), pairs[1][0]
    return fn_program(f, (t(2),))

@case("generators")
def g_set_comprehension_and_dict_comp():
    def f(x):
        s = {i % 3 for i in range(10)}
        d = {i: i * i for i in s}
        return x * sum(d.values()), sorted(s)
    return fn_program(f, (t(2),))

@case("generators")
def g_comprehension_with_walrus():
    def f(x):
        vals = [y for i in range(4) if (y := i * 2) > 2]
        return x * sum(vals), vals
    return fn_program(f, (t(2),))

@case("generators")
def g_itertools_chain_product():
    def f(x):
        ch = list(itertools.chain([1, 2], (3,)))
        pr = list(itertools.product("ab", range(2)))
        return x * sum(ch), pr
    return fn_program(f, (t(2),))

@case("generators")
def g_itertools_accumulate_islice():
    def f(x):
        acc = list(itertools.accumulate([1, 2, 3, 4]))
        sl = list(itertools.islice(itertools.count(5), 3))
        return x * acc[-1] + sl[-1]
    return fn_program(f, (t(2),))

@case("generators")
def g_itertools_pairwise_zip_longest():
    def f(x):
        pw = list(itertools.pairwise([1, 2, 4]))
        zl = list(itertools.zip_longest([1, 2], [3], fillvalue=0))
        return x + pw[-1][1] + zl[-1][1]
    return fn_program(f, (t(2),))

@case("generators")
def g_generator_over_module_list():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(3))
        def forward(self, x):
            return sum(l(x) for l in self.layers)
    return Program(M(), ((t(2, 3),),))

@case("generators")
def g_generator_passed_to_torch_cat():
    def f(x):
        return torch.cat(tuple(x * i for i in range(3)))
    return fn_program(f, (t(2),))

@case("generators")
def g_infinite_generator_partially_consumed():
    def count_up(x):
        k = 0
        while True:
            yield x + k
            k += 1
    def f(x):
        g = count_up(x)
        return [next(g) for _ in range(3)][-1]
    return fn_program(f, (t(2),))

@case("generators")
def g_generator_close_runs_finally():
    log = []
    def gen(x):
        try:
            yield x
            yield x + 1
        finally:
            log.append("closed")
    def f(x):
        g = gen(x)
        a = next(g)
        g.close()
        return a
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("generators")
def g_enumerate_start_reversed():
    def f(x):
        out = x * 0
        for i, v in enumerate(reversed([1, 2, 3]), start=10):
            out = out + i * v
        return out
    return fn_program(f, (t(2),))

@case("generators")
def g_map_filter_lambda():
    def f(x):
        m = list(map(lambda v: v * 2, filter(lambda v: v % 2, range(6))))
        return x * sum(m), m
    return fn_program(f, (t(2),))

@case("generators")
def g_map_two_iterables_tensors():
    def f(x, y):
        return list(map(torch.add, [x, y], [y, x]))
    return fn_program(f, (t(2), t(2)))

@case("generators")
def g_iter_sentinel_callable():
    def f(x):
        vals = [3, 2, 1, 0, 5]
        it = iter(vals.pop, 1)
        got = list(it)
        return x * len(got), got
    return fn_program(f, (t(2),))
