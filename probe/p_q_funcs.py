import torch, functools, itertools, operator, math
from harness import case, fn_program, t, Program, kw

G_COUNTER = 0
G_LIST = []
G_SCALE = 2.0

@case("q_fn")
def q_nonlocal_counter_closure():
    def make():
        n = 0
        def inc(v):
            nonlocal n
            n += 1
            return v * n
        return inc
    inc = make()
    def f(x):
        return inc(x) + inc(x)
    return fn_program(f, (t(3),), (t(3),))

@case("q_fn")
def q_nonlocal_inside_fn_then_read():
    def f(x):
        acc = []
        total = 0
        def push(v):
            nonlocal total
            acc.append(v)
            total += 2
        push(x); push(x + 1)
        return acc[0] + acc[1] * total
    return fn_program(f, (t(3),))

@case("q_fn")
def q_closure_cell_late_binding():
    def f(x):
        fs = [lambda v: v * i for i in range(3)]
        gs = [lambda v, i=i: v * i for i in range(3)]
        return sum(g(x) for g in fs), sum(g(x) for g in gs)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_global_counter_mutated_read_after():
    global G_COUNTER
    G_COUNTER = 0
    def f(x):
        global G_COUNTER
        G_COUNTER += 1
        y = x * G_COUNTER
        G_COUNTER += 10
        return y
    return fn_program(f, (t(3),), (t(3),), observe=lambda: G_COUNTER)

@case("q_fn")
def q_global_list_append_and_len():
    G_LIST.clear()
    def f(x):
        G_LIST.append(x.sum().item() > 100)
        return x + len(G_LIST)
    return fn_program(f, (t(3),), (t(3),), observe=lambda: len(G_LIST))

@case("q_fn")
def q_global_rebind_scale():
    global G_SCALE
    G_SCALE = 2.0
    def f(x):
        global G_SCALE
        old = G_SCALE
        G_SCALE = old * 2
        return x * old
    return fn_program(f, (t(3),), (t(3),), observe=lambda: G_SCALE)

@case("q_fn")
def q_partial_of_partial_kwargs():
    def g(a, b, c=1, *, d=0):
        return a * b + c - d
    p = functools.partial(functools.partial(g, c=3), d=1)
    def f(x):
        return p(x, 2), p.keywords, p.func is g
    return fn_program(f, (t(3),))

@case("q_fn")
def q_partial_created_inside():
    def g(a, b, scale):
        return (a - b) * scale
    def f(x, y):
        h = functools.partial(g, scale=3)
        k = functools.partial(h, x)
        return k(y), k(b=y)
    return fn_program(f, (t(3), t(3)))

@case("q_fn")
def q_reduce_with_initial():
    def f(xs):
        return functools.reduce(lambda a, b: a * 0.5 + b, xs, torch.zeros(3)), functools.reduce(operator.add, [1, 2, 3])
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_fn")
def q_lru_cache_helper():
    @functools.lru_cache(maxsize=None)
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    def f(x):
        return x * fact(5)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_wraps_decorator():
    def deco(fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            return fn(*a, **k) + 1
        return inner
    @deco
    def g(v, k=2):
        "doc"
        return v * k
    def f(x):
        return g(x, k=3), g.__name__, g.__doc__, g.__wrapped__(x)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_decorator_with_args_in_fn():
    def times(n):
        def deco(fn):
            def inner(v):
                for _ in range(n):
                    v = fn(v)
                return v
            return inner
        return deco
    def f(x):
        @times(3)
        def step(v):
            return v * 2 - 1
        return step(x)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_chain_from_iterable():
    def f(xs, ys):
        return sum(itertools.chain.from_iterable([xs, ys])), list(itertools.chain("ab", [1]))
    return fn_program(f, ([t(3), t(3)], [t(3)]))

@case("q_fn")
def q_itertools_product_repeat():
    def f(x):
        acc = x
        for a, b in itertools.product(range(2), repeat=2):
            acc = acc + a * 10 + b
        return acc, list(itertools.product("ab", [0, 1]))
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_accumulate_func():
    def f(x):
        parts = list(itertools.accumulate([x, x * 2, x * 3], lambda a, b: a * b))
        nums = list(itertools.accumulate([1, 2, 3, 4], initial=10))
        return parts[-1], nums
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_zip_longest_fill():
    def f(xs):
        out = []
        for a, b in itertools.zip_longest(xs, [1, 2, 3, 4], fillvalue=0):
            out.append(a * b if isinstance(a, torch.Tensor) else b)
        return out
    return fn_program(f, ([t(3), t(3)],))

@case("q_fn")
def q_itertools_islice_count():
    def f(x):
        vals = list(itertools.islice(itertools.count(5, 2), 1, 4))
        return x * sum(vals), vals
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_groupby():
    def f(x):
        out = []
        for k, g in itertools.groupby([1, 1, 2, 3, 3, 3]):
            out.append((k, len(list(g))))
        return x * len(out), out
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_groupby_key():
    def f(x):
        words = ["aa", "ab", "b", "ca", "cb"]
        res = {k: list(v) for k, v in itertools.groupby(words, key=lambda w: w[0])}
        return x + len(res["c"]), res
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_repeat_starmap():
    def f(x):
        vs = list(itertools.starmap(operator.mul, [(x, 2), (x, 3)]))
        rs = list(itertools.repeat(1.5, 3))
        return vs[0] + vs[1] + sum(rs)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_pairwise_combinations():
    def f(xs):
        s = 0
        for a, b in itertools.pairwise(xs):
            s = s + a * b
        c = list(itertools.combinations(range(4), 2))
        p = list(itertools.permutations([1, 2, 3], 2))
        return s, len(c), p[:3]
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_fn")
def q_itertools_takewhile_dropwhile():
    def f(x):
        a = list(itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1]))
        b = list(itertools.dropwhile(lambda v: v < 3, [1, 2, 3, 1]))
        c = list(itertools.compress("abcd", [1, 0, 1, 0]))
        return x * sum(a) + sum(b), c
    return fn_program(f, (t(3),))

@case("q_fn")
def q_itertools_cycle_islice_tensors():
    def f(x, y):
        out = x
        for i, v in enumerate(itertools.islice(itertools.cycle([x, y]), 5)):
            out = out + v * i
        return out
    return fn_program(f, (t(3), t(3)))

@case("q_fn")
def q_itertools_tee_filterfalse():
    def f(x):
        a, b = itertools.tee([1, 2, 3])
        ff = list(itertools.filterfalse(lambda v: v % 2, range(6)))
        return x + sum(a) * sum(b), ff
    return fn_program(f, (t(3),))

@case("q_fn")
def q_operator_itemgetter_multi():
    def f(d):
        g = operator.itemgetter("a", "c")
        a, c = g(d)
        return a + c, operator.itemgetter(1)([5, 6, 7])
    return fn_program(f, ({"a": t(3), "b": t(3), "c": t(3)},))

@case("q_fn")
def q_operator_attrgetter_dotted():
    class In:
        def __init__(self):
            self.v = 4
    class Out:
        def __init__(self):
            self.inner = In()
            self.w = 2
    def f(x):
        o = Out()
        return x * operator.attrgetter("inner.v")(o) + operator.attrgetter("w", "inner.v")(o)[0]
    return fn_program(f, (t(3),))

@case("q_fn")
def q_operator_methodcaller():
    def f(x):
        mc = operator.methodcaller("clamp", min=0.0)
        s = operator.methodcaller("split", ",")("a,b,c")
        return mc(x), s
    return fn_program(f, (t(3),))

@case("q_fn")
def q_operator_inplace_on_list():
    def f(x):
        a = [x]
        b = operator.iadd(a, [x * 2])
        return b is a, len(a), operator.getitem(a, 1), operator.contains(a, 3)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_operator_truth_not_neg_index():
    def f(x):
        return x * operator.index(3) + operator.neg(2), operator.not_(0), operator.truth([]), operator.is_(None, None)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_lambda_defaults_kwonly():
    def f(x):
        g = lambda v, k=2, *, m=3: v * k + m
        return g(x), g(x, 5), g(x, m=0)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_args_kwargs_forwarding_chain():
    def leaf(a, b, *rest, scale=1, **extra):
        return (a + b + sum(rest)) * scale + len(extra)
    def mid(*args, **kwargs):
        kwargs.setdefault("scale", 2)
        return leaf(*args, **kwargs)
    def f(x):
        return mid(x, x, 1, 2, q=1), mid(x, 1, scale=3)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_kwonly_required_missing_raises():
    def g(a, *, b):
        return a + b
    def f(x):
        try:
            return g(x)
        except TypeError as e:
            return x - 1, "b" in str(e)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_too_many_args_raises():
    def g(a, b=1):
        return a + b
    def f(x):
        try:
            return g(x, 1, 2)
        except TypeError:
            return x * 0
    return fn_program(f, (t(3),))

@case("q_fn")
def q_positional_only_params():
    def g(a, b, /, c=1):
        return a * b + c
    def f(x):
        return g(x, 2, c=3), g(x, 1)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_recursion_tree_sum():
    def tsum(node):
        if isinstance(node, torch.Tensor):
            return node
        return sum(tsum(n) for n in node)
    def f(x, y):
        return tsum([x, [y, [x, y]]])
    return fn_program(f, (t(3), t(3)))

@case("q_fn")
def q_mutual_recursion():
    def even(n):
        return True if n == 0 else odd(n - 1)
    def odd(n):
        return False if n == 0 else even(n - 1)
    def f(x):
        return x * (2 if even(6) else 3) + (1 if odd(3) else 0)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_function_attributes():
    def g(v):
        return v * g.k
    g.k = 3
    def f(x):
        g.k = 4
        return g(x), g.__name__, g.__code__.co_argcount
    return fn_program(f, (t(3),), observe=lambda: g.k)

@case("q_fn")
def q_function_defaults_dunder():
    def g(a, b=2, c=3):
        return a * b + c
    def f(x):
        return g(x), g.__defaults__, g.__kwdefaults__
    return fn_program(f, (t(3),))

@case("q_fn")
def q_map_filter_zip_builtin():
    def f(xs):
        ys = list(map(lambda v: v * 2, filter(lambda v: v is not None, xs)))
        zs = list(map(operator.add, ys, [1, 2]))
        return zs, list(zip(*[(1, 2), (3, 4)]))
    return fn_program(f, ([t(3), None, t(3)],))

@case("q_fn")
def q_map_multiple_uneven():
    def f(x):
        return list(map(lambda a, b: a * b, [x, x, x], [1, 2])), list(zip([1, 2, 3], "ab"))
    return fn_program(f, (t(3),))

@case("q_fn")
def q_zip_strict_raises():
    def f(x):
        try:
            list(zip([1, 2], [1], strict=True))
        except ValueError:
            return x + 1
        return x
    return fn_program(f, (t(3),))

@case("q_fn")
def q_enumerate_start_reversed():
    def f(xs):
        out = 0
        for i, v in enumerate(reversed(xs), start=1):
            out = out + v * i
        return out
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_fn")
def q_sorted_key_reverse_stable():
    def f(x):
        pairs = [("b", 2), ("a", 2), ("c", 1)]
        s = sorted(pairs, key=lambda p: p[1], reverse=True)
        return x * s[0][1], s, sorted("hello"), sorted({3: 1, 1: 2})
    return fn_program(f, (t(3),))

@case("q_fn")
def q_min_max_key_default():
    def f(x):
        return (x * max([3, -7, 2], key=abs) + min([], default=5),
                max("ab", "c", key=len), min((4, 1), (3, 9)), max([], key=len, default="z"))
    return fn_program(f, (t(3),))

@case("q_fn")
def q_min_empty_raises():
    def f(x):
        try:
            return min([])
        except ValueError as e:
            return x + 1, str(e)[:10]
    return fn_program(f, (t(3),))

@case("q_fn")
def q_sum_with_start_lists_floats():
    def f(x):
        return x * sum([0.5, 1.5], 1.0), sum([[1], [2, 3]], []), sum(range(5), start=10)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_sum_tensors_start():
    def f(xs, y):
        return sum(xs, y), sum(x.sum() for x in xs)
    return fn_program(f, ([t(3), t(3)], t(3)))

@case("q_fn")
def q_any_all_generators():
    def f(x):
        return x + (1 if any(v > 2 for v in [1, 3]) else 0) + (10 if all([]) else 0), all(v for v in [1, 0])
    return fn_program(f, (t(3),))

@case("q_fn")
def q_generator_expression_in_call_kwargs():
    def g(*, vals):
        return sum(vals)
    def f(x):
        return g(vals=[x * i for i in range(3) if i != 1])
    return fn_program(f, (t(3),))

@case("q_fn")
def q_nested_closure_three_levels():
    def f(x):
        a = 1
        def l1():
            b = 2
            def l2():
                nonlocal a
                a += b
                return x * a
            return l2()
        r = l1()
        return r + a
    return fn_program(f, (t(3),))

@case("q_fn")
def q_closure_over_loop_var_mutated_later():
    def f(x):
        k = 1
        g = lambda v: v * k
        k = 5
        return g(x)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_callable_returned_from_dict_dispatch():
    ops = {"add": lambda a, b: a + b, "mul": operator.mul, "sub": torch.sub}
    def f(x, name):
        return ops[name](x, 2)
    return fn_program(f, (t(3), "add"), (t(3), "mul"), (t(3), "sub"))

@case("q_fn")
def q_singledispatch():
    @functools.singledispatch
    def conv(v):
        return v
    @conv.register
    def _(v: int):
        return v * 10
    def f(x):
        return x + conv(2) + conv(0.5)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_cmp_to_key_sort():
    def cmp(a, b):
        return (a % 3) - (b % 3) or a - b
    def f(x):
        s = sorted([5, 3, 4, 9, 1], key=functools.cmp_to_key(cmp))
        return x * s[0], s
    return fn_program(f, (t(3),))

@case("q_fn")
def q_partial_method_on_class():
    class C:
        def scale(self, v, k):
            return v * k
        double = functools.partialmethod(scale, k=2)
    def f(x):
        return C().double(x)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_math_funcs_on_scalars():
    def f(x, n):
        return (x * math.sqrt(n) + math.floor(2.7) + math.ceil(0.2), math.log(n, 2), math.gcd(12, 18),
                math.isclose(0.1 + 0.2, 0.3), math.prod([1, 2, 3]), math.hypot(3, 4), math.copysign(1, -0.0))
    return fn_program(f, (t(3), 4), (t(3), 9))

@case("q_fn")
def q_math_inf_nan_checks():
    def f(x, v):
        return x + (1 if math.isinf(v) else 0) + (2 if math.isnan(v) else 0), math.isfinite(v)
    return fn_program(f, (t(3), 1.5), (t(3), float("inf")))

@case("q_fn")
def q_math_trunc_factorial_comb():
    def f(x):
        return x * math.trunc(-2.5) + math.factorial(4), math.comb(5, 2), math.perm(4, 2), math.fsum([0.1] * 10)
    return fn_program(f, (t(3),))

@case("q_fn")
def q_int_float_bool_conversions():
    def f(x, s):
        return x * int(s) + float("1.5") + int(True) + int(-3.9), bool(0.0), int("ff", 16), float(3), round(2.5), round(3.14159, 2)
    return fn_program(f, (t(3), "7"))

@case("q_fn")
def q_divmod_pow_abs_builtins():
    def f(x, n):
        q, r = divmod(n, 3)
        return x * q + r, pow(2, n, 5), abs(-n), pow(2.0, -1), -7 // 2, -7 % 3
    return fn_program(f, (t(3), 7), (t(3), 8))

@case("q_fn")
def q_scalar_input_float_ops():
    def f(x, s):
        y = s * 2.5 - 1
        return x * y, y > 3, float(int(y))
    return fn_program(f, (t(3), 2.0), (t(3), 3.0))

@case("q_fn")
def q_int_bit_ops():
    def f(x, n):
        return x * (n & 3) + (n | 8) + (n ^ 1) + (n << 2) + (n >> 1) + (~n), n.bit_length()
    return fn_program(f, (t(3), 5), (t(3), 6))
