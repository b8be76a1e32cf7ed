import functools, operator, math
import torch
from harness import case, fn_program, t, Program, kw

def _add(a, b, *, alpha=1):
    return a + alpha * b

@case("functools")
def f_partial_kwargs_and_call():
    p = functools.partial(_add, alpha=3)
    def f(x, y):
        return p(x, y), p(x, y, alpha=0)
    return fn_program(f, (t(2), t(2)))

@case("functools")
def f_partial_made_in_frame_attrs():
    def f(x):
        p = functools.partial(_add, x)
        return p(x), p.args[0] is x, p.keywords
    return fn_program(f, (t(2),))

@case("functools")
def f_reduce_tensors():
    def f(xs):
        return functools.reduce(operator.mul, xs), functools.reduce(lambda a, b: a + b, xs, 10)
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("functools")
def f_wraps_preserves_name():
    def deco(fn):
        @functools.wraps(fn)
        def w(*a, **k):
            return fn(*a, **k) * 2
        return w
    @deco
    def inner(v):
        return v + 1
    def f(x):
        return inner(x), inner.__name__, inner.__wrapped__(x)
    return fn_program(f, (t(2),))

@case("functools")
def f_lru_cache_pure_int():
    @functools.lru_cache(maxsize=None)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)
    def f(x):
        return x * fib(10)
    return fn_program(f, (t(2),))

@case("functools")
def f_cached_property_made_in_frame():
    class C:
        def __init__(self, v):
            self.v = v
        @functools.cached_property
        def sq(self):
            return self.v * self.v
    def f(x):
        c = C(x)
        return c.sq + c.sq
    return fn_program(f, (t(2),))

@case("functools")
def f_singledispatch_not_used_cmp_to_key():
    def cmp(a, b):
        return b - a
    def f(x):
        s = sorted([3, 1, 2], key=functools.cmp_to_key(cmp))
        return x * s[0], s
    return fn_program(f, (t(2),))

@case("functools")
def f_operator_itemgetter_attrgetter():
    class P:
        def __init__(self, v):
            self.v = v
    def f(x):
        g = operator.itemgetter(1, 2)
        a = operator.attrgetter("v")
        return g([x, x + 1, x + 2]), a(P(x * 3))
    return fn_program(f, (t(2),))

@case("functools")
def f_operator_methodcaller_and_ops():
    def f(x):
        mc = operator.methodcaller("add", 5)
        return mc(x), operator.neg(x), operator.truediv(x, 2), operator.getitem([x, 1], 1), operator.iadd(x.clone(), 1)
    return fn_program(f, (t(2),))

@case("functools")
def f_operator_on_ints_and_contains():
    def f(x):
        return x * operator.floordiv(7, 2) + operator.mod(7, 3), operator.contains([1, 2], 2), operator.not_(0)
    return fn_program(f, (t(2),))

@case("functools")
def f_partial_of_torch_function():
    sm = functools.partial(torch.softmax, dim=-1)
    def f(x):
        return sm(x), functools.partial(torch.clamp, min=0)(x)
    return fn_program(f, (t(2, 3),))

@case("math")
def mt_math_functions_on_python_floats():
    def f(x, k):
        return x * math.exp(k) + math.floor(k * 2.5) + math.ceil(k / 3) + math.gcd(12, 8) + math.fabs(-k)
    return fn_program(f, (t(2), 2), (t(2), 3))

@case("math")
def mt_math_isclose_inf_nan():
    def f(x):
        a = math.inf
        return x + (1 if math.isinf(a) else 0) + math.isnan(float("nan")) + math.isclose(0.1 + 0.2, 0.3)
    return fn_program(f, (t(2),))

@case("math")
def mt_math_prod_comb_factorial():
    def f(x):
        return x * math.prod([2, 3]) + math.comb(5, 2) + math.factorial(4) + math.pi
    return fn_program(f, (t(2),))

@case("math")
def mt_float_int_conversions_round():
    def f(x, v):
        return x * round(v, 1) + int(v) + round(v), divmod(7, v if isinstance(v, int) else 2)
    return fn_program(f, (t(2), 2.46), (t(2), 3.51))

@case("math")
def mt_integer_ops_pow_shift():
    def f(x, n):
        return x * (n ** 2) + (n << 2) + (n >> 1) + (n & 3) + (n ^ 5) + abs(-n) + (-n) // 4 + (-n) % 4
    return fn_program(f, (t(2), 5), (t(2), 7))

@case("math")
def mt_float_arg_changes_value():
    def f(x, s):
        return x * s
    return fn_program(f, (t(2), 0.5), (t(2), 1.5), (t(2), 2.5))

@case("math")
def mt_bool_arg():
    def f(x, flag):
        return x + 1 if flag else x - 1
    return fn_program(f, (t(2), True), (t(2), False))

@case("math")
def mt_complex_python():
    def f(x):
        c = complex(1, 2) * 2
        return x * c.real + c.imag, abs(3 + 4j)
    return fn_program(f, (t(2),))

@case("builtins")
def b_sorted_min_max_with_keys():
    def f(x):
        d = {"a": 3, "b": 1, "c": 2}
        return x * min(d, key=d.get).__len__() + max(d.values()), sorted(d, key=lambda k: -d[k]), max(1, 5, 3), min([4, 2])
    return fn_program(f, (t(2),))

@case("builtins")
def b_any_all_on_lists_and_generators():
    def f(x, xs):
        if any(v.shape[0] > 2 for v in xs) and all(isinstance(v, torch.Tensor) for v in xs):
            return x + 1
        return x - 1, any([]), all([])
    return fn_program(f, (t(2), [t(3), t(1)]), (t(2), [t(1)]))

@case("builtins")
def b_isinstance_tuple_types_of_args():
    def f(a, b):
        out = []
        for v in (a, b):
            if isinstance(v, torch.Tensor):
                out.append(v * 2)
            elif isinstance(v, (int, float)):
                out.append(v + 1)
            elif isinstance(v, (list, tuple)):
                out.append(len(v))
        return out
    return fn_program(f, (t(2), 3), (t(2), 2.5), (t(2), [1, 2]))

@case("builtins")
def b_getattr_hasattr_on_tensor():
    def f(x):
        return getattr(x, "shape")[0], hasattr(x, "nonexistent_attr"), getattr(torch, "relu")(x), callable(x.add)
    return fn_program(f, (t(3),))

@case("builtins")
def b_zip_strict_and_enumerate():
    def f(xs, ws):
        return sum(i * x * w for i, (x, w) in enumerate(zip(xs, ws)))
    return fn_program(f, ([t(2), t(2)], [1.0, 2.0]))

@case("builtins")
def b_range_len_index_reversed():
    def f(x):
        r = range(2, 11, 3)
        return x * len(r) + r[1] + r[-1] + r.index(8), list(reversed(r)), 5 in r
    return fn_program(f, (t(2),))

@case("builtins")
def b_sum_with_start_tensor():
    def f(xs):
        return sum(xs, torch.ones(2)), sum([1, 2, 3], 4)
    return fn_program(f, ([t(2), t(2)],))

@case("builtins")
def b_abs_pow_divmod_on_tensors():
    def f(x):
        return abs(x), pow(x, 2), divmod(x, 2.0), round(x * 10)
    return fn_program(f, (t(3),))

@case("builtins")
def b_id_and_is_identity():
    def f(x, y):
        return x + 1 if x is y else x - 1, id(x) == id(y)
    a = t(2)
    return fn_program(f, (a, a), (a, t(2)))

@case("builtins")
def b_type_constructors():
    def f(x):
        return x * int("3") + float("1.5"), bool([]), str(12), list((1, 2)), tuple([3]), set([1, 1]), dict(a=1)
    return fn_program(f, (t(2),))

@case("builtins")
def b_chr_ord_hex_bin():
    def f(x):
        return x * ord("a") / 100, chr(65), hex(255), bin(5), oct(8)
    return fn_program(f, (t(2),))

@case("builtins")
def b_callable_and_vars():
    class O:
        def __init__(self):
            self.a = 1
            self.b = 2
    def f(x):
        o = O()
        return x * sum(vars(o).values()), callable(o), callable(f)
    return fn_program(f, (t(2),))

@case("builtins")
def b_iter_next_on_dict():
    def f(x):
        d = {"first": 1, "second": 2}
        k = next(iter(d))
        return x * d[k], k
    return fn_program(f, (t(2),))

@case("builtins")
def b_print_in_frame():
    def f(x):
        print("shape", tuple(x.shape), "n", 3)
        return x + 1
    return fn_program(f, (t(2),))

@case("builtins")
def b_len_of_various():
    def f(x):
        return x * (len("abc") + len({1: 2}) + len(range(4)) + len(x) + len(x.shape))
    return fn_program(f, (t(3, 2),))

@case("builtins")
def b_max_of_tensors_python_builtin():
    def f(a, b):
        return max(a.sum(), b.sum()), min(a.shape[0], 7)
    return fn_program(f, (t(3), t(3)))

@case("builtins")
def b_slice_object_and_ellipsis():
    def f(x):
        s = slice(1, None)
        return x[s], x[..., 0], x[None, :, None].shape
    return fn_program(f, (t(3, 2),))

@case("strings")
def s_fstring_formatting_of_shapes():
    def f(x):
        msg = f"{x.shape[0]:03d}-{x.dtype}-{3.14159:.2f}-{'ab'!r}"
        return x + 1, msg
    return fn_program(f, (t(2),), (t(5),))

@case("strings")
def s_str_methods():
    def f(x, name):
        parts = name.split(".")
        key = "_".join(p.upper() for p in parts)
        if name.startswith("enc") and key.endswith("W"):
            return x * len(key), key.lower().replace("_", "/"), name.strip().title()
        return x, key
    return fn_program(f, (t(2), "enc.layer.w"), (t(2), "dec.b"))

@case("strings")
def s_percent_and_format():
    def f(x):
        a = "%s=%d" % ("n", 3)
        b = "{}:{:.1f}".format("v", 2.25)
        c = "{name}".format(name="z")
        return x + len(a + b + c), a, b, c
    return fn_program(f, (t(2),))

@case("strings")
def s_string_as_dict_key_and_in():
    def f(x, mode):
        table = {"sum": torch.sum, "mean": torch.mean}
        return table[mode](x), "u" in mode
    return fn_program(f, (t(3), "sum"), (t(3), "mean"))

@case("strings")
def s_str_of_dtype_and_device():
    def f(x):
        return x + 1, str(x.dtype), str(x.device), repr(x.shape)
    return fn_program(f, (t(2),))

@case("recursion")
def rc_recursive_tree_sum():
    def tree_sum(node):
        if isinstance(node, torch.Tensor):
            return node.sum()
        if isinstance(node, dict):
            return sum(tree_sum(v) for v in node.values())
        return sum(tree_sum(v) for v in node)
    def f(tree):
        return tree_sum(tree)
    return fn_program(f, ({"a": [t(2), (t(3),)], "b": t(1)},))

@case("recursion")
def rc_recursive_with_default_and_depth():
    def rec(x, depth=0, maxd=4):
        if depth == maxd:
            return x, depth
        return rec(x * 2, depth + 1, maxd)
    def f(x):
        return rec(x), rec(x, maxd=2)
    return fn_program(f, (t(2),))

@case("recursion")
def rc_tree_map_pytree():
    import torch.utils._pytree as pytree
    def f(tree):
        return pytree.tree_map(lambda v: v * 2, tree)
    return fn_program(f, ({"a": t(2), "b": [t(1), (t(3),)]},))
