import torch, collections, dataclasses, enum, functools, itertools, operator, math, contextlib
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

@case("q_mx")
def q_is_identity_input_vs_global_obj():
    class Tok: pass
    SENT = Tok()
    def f(x, o):
        return x * (2 if o is SENT else 3)
    return fn_program(f, (t(3), SENT), (t(3), Tok()), (t(3), SENT))

@case("q_mx")
def q_is_identity_two_inputs():
    class Tok: pass
    a, b = Tok(), Tok()
    def f(x, p, q):
        return x * (2 if p is q else 3)
    return fn_program(f, (t(3), a, b), (t(3), a, a), (t(3), b, a))

@case("q_mx")
def q_id_compare_inputs():
    class Tok: pass
    a, b = Tok(), Tok()
    def f(x, p, q):
        return x + (1 if id(p) == id(q) else 0)
    return fn_program(f, (t(3), a, b), (t(3), a, a))

@case("q_mx")
def q_dict_keyed_by_object_lookup_input():
    class Tok: pass
    a, b = Tok(), Tok()
    table = {a: 1.0, b: 2.0}
    def f(x, k):
        return x * table[k]
    return fn_program(f, (t(3), a), (t(3), b), (t(3), a))

@case("q_mx")
def q_in_list_of_objects_identity():
    class Tok: pass
    a, b, c = Tok(), Tok(), Tok()
    reg = [a, b]
    def f(x, k):
        return x + (k in reg)
    return fn_program(f, (t(3), a), (t(3), c))

@case("q_mx")
def q_list_index_of_object():
    class Tok: pass
    a, b = Tok(), Tok()
    reg = [a, b]
    def f(x, k):
        return x * reg.index(k)
    return fn_program(f, (t(3), a), (t(3), b))

@case("q_mx")
def q_object_eq_default_identity():
    class Tok: pass
    a, b = Tok(), Tok()
    def f(x, p):
        return x * (5 if p == a else 7), p != a
    return fn_program(f, (t(3), a), (t(3), b))

@case("q_mx")
def q_module_attr_object_identity():
    class Tok: pass
    NONE_TOK = Tok()
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mode = NONE_TOK
        def forward(self, x):
            if self.mode is NONE_TOK:
                return x + 1
            return x - 1
    m = M()
    def between(sub, i):
        sub.mode = Tok()
    return Program(m, ((t(3),), (t(3),)), between=between)

@case("q_mx")
def q_list_of_tensors_inplace_and_append():
    def f(xs):
        for i in range(len(xs)):
            xs[i] = xs[i] * 2
        xs.append(xs[0] + xs[1])
        return xs[-1]
    lst = [t(3), t(3)]
    return fn_program(f, (lst,), observe=lambda: list(lst))

@case("q_mx")
def q_dict_of_lists_mutation():
    def f(d, x):
        d.setdefault("hist", []).append(x.sum())
        d["n"] = d.get("n", 0) + 1
        return x * d["n"]
    state = {}
    return fn_program(f, (state, t(3)), (state, t(3)), observe=lambda: dict(state))

@case("q_mx")
def q_object_attr_list_mutation_order():
    class Log:
        def __init__(self):
            self.events = []
    lg = Log()
    def f(x):
        lg.events.append("a")
        y = x * 2
        lg.events.insert(0, "b")
        lg.events = lg.events + ["c"]
        return y
    return fn_program(f, (t(3),), (t(3),), observe=lambda: list(lg.events))

@case("q_mx")
def q_tensor_list_input_sort_by_norm():
    def f(xs):
        return sorted(xs, key=lambda v: float(v.abs().sum()))
    return fn_program(f, ([t(3), t(3) * 5, t(3) * 0.1],))

@case("q_mx")
def q_str_dispatch_getattr_torch():
    def f(x, name):
        return getattr(torch, name)(x), getattr(x, name)()
    return fn_program(f, (t(3), "sin"), (t(3), "cos"))

@case("q_mx")
def q_hasattr_on_tensor_and_module():
    lin = nn.Linear(2, 2)
    def f(x):
        return x + hasattr(x, "grad") + hasattr(lin, "weight") * 2 + hasattr(lin, "nope") * 4
    return fn_program(f, (t(2),))

@case("q_mx")
def q_module_children_names_loop():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    def f(x):
        names = []
        for name, child in m.named_children():
            x = child(x)
            names.append(name)
        return x, names
    return fn_program(f, (t(2, 3),))

@case("q_mx")
def q_module_dict_iteration_keys():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"b": nn.Linear(3, 1), "a": nn.Linear(3, 2)})
        def forward(self, x):
            return {k: h(x) for k, h in self.heads.items()}, list(self.heads.keys())
    return Program(M(), ((t(2, 3),),))

@case("q_mx")
def q_module_list_enumerate_slice():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(4)])
        def forward(self, x):
            for i, l in enumerate(self.layers[1:3]):
                x = l(x) * (i + 1)
            return x, len(self.layers)
    return Program(M(), ((t(2, 3),),))

@case("q_mx")
def q_module_custom_attr_counter():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
        def forward(self, x):
            self.calls += 1
            return x * self.calls
    m = M()
    return Program(m, ((t(3),), (t(3),), (t(3),)), observe=lambda: m.calls)

@case("q_mx")
def q_module_training_flag_branch():
    class M(nn.Module):
        def forward(self, x):
            return x * 2 if self.training else x / 2
    m = M()
    def between(sub, i):
        sub.train(i % 2 == 0)
    return Program(m, ((t(3),), (t(3),), (t(3),)), between=between)

@case("q_mx")
def q_module_forward_kwargs_defaults():
    class M(nn.Module):
        def forward(self, x, *, scale=1.0, bias=None):
            y = x * scale
            return y if bias is None else y + bias
    return Program(M(), ((t(3),), kw(t(3), scale=2.0), kw(t(3), bias=t(3))))

@case("q_mx")
def q_module_getattr_parameter_by_string():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w0 = nn.Parameter(torch.ones(3))
            self.w1 = nn.Parameter(torch.ones(3) * 2)
        def forward(self, x):
            return sum(getattr(self, f"w{i}") * x for i in range(2))
    return Program(M(), ((t(3),),))

@case("q_mx")
def q_module_register_buffer_update():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))
        def forward(self, x):
            self.count += 1
            return x * self.count
    m = M()
    return Program(m, ((t(3),), (t(3),)), observe=lambda: m.count.clone())

@case("q_mx")
def q_dataclass_holding_tensors_returned():
    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        aux: dict
    def f(x):
        o = Out(x * 2, {"k": x + 1})
        return o.y + o.aux["k"], o.aux
    return fn_program(f, (t(3),))

@case("q_mx")
def q_namedtuple_return_from_helper_unpack():
    R = collections.namedtuple("R", "lo hi")
    def split(v):
        return R(v.min(), v.max())
    def f(x):
        lo, hi = split(x)
        r = split(x * 2)
        return hi - lo + r.hi, isinstance(r, tuple)
    return fn_program(f, (t(5),))

@case("q_mx")
def q_enum_keyed_dict_and_iteration():
    class Mode(enum.Enum):
        A = "a"
        B = "b"
    scales = {Mode.A: 2.0, Mode.B: 3.0}
    def f(x, m):
        return x * scales[m], [k.value for k in scales], m.value.upper()
    return fn_program(f, (t(3), Mode.A), (t(3), Mode.B))

@case("q_mx")
def q_enum_auto_and_members():
    class K(enum.Enum):
        X = enum.auto()
        Y = enum.auto()
    def f(x):
        return x * K.Y.value + len(K), K.X in K, list(K.__members__)
    return fn_program(f, (t(3),))

@case("q_mx")
def q_strenum_compare_to_str():
    class S(str, enum.Enum):
        MEAN = "mean"
        SUM = "sum"
    def f(x, red):
        if red == "mean":
            return x.mean()
        return x.sum()
    return fn_program(f, (t(3), S.MEAN), (t(3), S.SUM))

@case("q_mx")
def q_closure_captures_module_and_list():
    lin = nn.Linear(3, 3)
    hist = []
    def apply(v):
        hist.append(v.shape[0])
        return lin(v)
    def f(x):
        return apply(apply(x))
    return fn_program(f, (t(2, 3),), observe=lambda: list(hist))

@case("q_mx")
def q_lambda_sorted_dict_items_tensor_vals():
    def f(d):
        ks = sorted(d, key=lambda k: -len(k))
        return [d[k] * i for i, k in enumerate(ks)]
    return fn_program(f, ({"a": t(2), "bbb": t(2), "cc": t(2)},))

@case("q_mx")
def q_recursion_with_memo_dict():
    def fib(n, memo):
        if n in memo:
            return memo[n]
        r = n if n < 2 else fib(n - 1, memo) + fib(n - 2, memo)
        memo[n] = r
        return r
    def f(x):
        memo = {}
        return x * fib(15, memo), len(memo)
    return fn_program(f, (t(3),))

@case("q_mx")
def q_shape_arith_python_ints():
    def f(x):
        b, n = x.shape
        half = n // 2
        rest = n - half
        return x[:, :half] * rest, divmod(n, 3), math.ceil(n / 4), x.view(b * n).shape
    return fn_program(f, (t(2, 6),))

@case("q_mx")
def q_tensor_size_tuple_ops():
    def f(x):
        s = x.size()
        return x.reshape(*s[::-1]), s + (1,), s.numel(), list(s), s == (2, 3), s[1:]
    return fn_program(f, (t(2, 3),))

@case("q_mx")
def q_format_shape_in_string():
    def f(x):
        msg = f"shape={tuple(x.shape)} dtype={x.dtype} dev={x.device.type}"
        return x + len(msg), msg
    return fn_program(f, (t(2, 3),))

@case("q_mx")
def q_tensor_item_to_python_branch():
    def f(x):
        v = x.sum().item()
        return x * 2 if v > 0 else x * 3
    return fn_program(f, (torch.ones(3),), (-torch.ones(3),))

@case("q_mx")
def q_dtype_comparisons_and_dict():
    eps = {torch.float32: 1e-6, torch.float64: 1e-12}
    def f(x):
        return x + eps[x.dtype], x.dtype == torch.float32, x.dtype.is_floating_point, x.is_floating_point()
    return fn_program(f, (t(3),), (t(3, dtype=torch.float64),))

@case("q_mx")
def q_torch_tensor_from_python_list():
    def f(x, vals):
        w = torch.tensor(vals, dtype=x.dtype)
        return x * w, torch.tensor([len(vals), sum(vals)])
    return fn_program(f, (t(3), [1.0, 2.0, 3.0]))

@case("q_mx")
def q_tensor_tolist_and_back():
    def f(x):
        lst = x.tolist()
        return sum(lst), [round(v, 2) for v in lst], torch.tensor(lst) * 2
    return fn_program(f, (t(3),))

@case("q_mx")
def q_generator_of_tensors_stacked():
    def f(x):
        return torch.stack(list(x[i] * i for i in range(x.shape[0]))), torch.cat([x] * 2)
    return fn_program(f, (t(3, 2),))

@case("q_mx")
def q_nested_tuple_return_with_none_and_str():
    def f(x):
        return (x, (None, "s", (x * 2, [1, {"k": x}])))
    return fn_program(f, (t(2),))

@case("q_mx")
def q_input_list_aliased_twice():
    def f(a, b, x):
        a.append(x)
        return len(b), b[-1] * 2
    lst = [t(2)]
    return fn_program(f, (lst, lst, t(2)), observe=lambda: len(lst))

@case("q_mx")
def q_global_dict_registry_mutation():
    REG = {}
    def register(name):
        def deco(fn):
            REG[name] = fn
            return fn
        return deco
    def f(x):
        @register("dbl")
        def dbl(v):
            return v * 2
        return REG["dbl"](x), len(REG)
    return fn_program(f, (t(3),), observe=lambda: sorted(REG))

@case("q_mx")
def q_class_level_cache_dict():
    class C:
        cache = {}
        @classmethod
        def get(cls, k):
            if k not in cls.cache:
                cls.cache[k] = k * 2
            return cls.cache[k]
    def f(x):
        return x * C.get(2) + C.get(3) + C.get(2)
    return fn_program(f, (t(3),), (t(3),), observe=lambda: dict(C.cache))

@case("q_mx")
def q_super_in_classmethod_and_staticmethod_call():
    class A:
        @classmethod
        def make(cls):
            return cls.__name__
    class B(A):
        @classmethod
        def make(cls):
            return "B+" + super().make()
    def f(x):
        return x + len(B.make()), B.make()
    return fn_program(f, (t(3),))

@case("q_mx")
def q_property_on_module_uses_buffers():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor(2.0))
        @property
        def doubled(self):
            return self.scale * 2
        def forward(self, x):
            return x * self.doubled
    return Program(M(), ((t(3),),))

@case("q_mx")
def q_multiple_return_paths_types():
    def f(x, n):
        if n == 0:
            return None
        if n == 1:
            return x
        return [x] * n
    return fn_program(f, (t(2), 0), (t(2), 1), (t(2), 3))

@case("q_mx")
def q_kwargs_dict_mutation_inside():
    def g(**kw):
        kw["extra"] = 1
        return kw
    def f(x):
        base = {"a": x}
        out = g(**base)
        return len(base), sorted(out), out["a"] * 2
    return fn_program(f, (t(3),))

@case("q_mx")
def q_star_args_tuple_identity():
    def g(*args):
        return args
    def f(x):
        a = g(x, 1)
        return type(a).__name__, len(a), a[0] + a[1]
    return fn_program(f, (t(3),))

@case("q_mx")
def q_getitem_on_user_class_with_slice():
    class Seq:
        def __init__(self, data):
            self.data = data
        def __getitem__(self, idx):
            if isinstance(idx, slice):
                return Seq(self.data[idx])
            return self.data[idx]
        def __len__(self):
            return len(self.data)
    def f(x):
        s = Seq([x, x * 2, x * 3, x * 4])
        sub = s[1::2]
        return sub[0] + sub[1], len(sub)
    return fn_program(f, (t(3),))

@case("q_mx")
def q_bool_ops_short_circuit_side_effects():
    log = []
    def side(v, r):
        log.append(v)
        return r
    def f(x):
        a = side(1, False) and side(2, True)
        b = side(3, 0) or side(4, "z")
        return x + len(log), a, b
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_mx")
def q_augmented_assign_attr_and_subscript():
    class O:
        def __init__(self):
            self.v = 1
            self.l = [1, 2]
    o = O()
    def f(x):
        o.v += 2
        o.l[0] *= 5
        o.l += [3]
        return x * o.v + o.l[0]
    return fn_program(f, (t(3),), observe=lambda: (o.v, list(o.l)))

@case("q_mx")
def q_swap_and_multiple_targets():
    def f(x, y):
        a = b = x
        a, b = b * 2, a + 1
        c, (d, e) = 1, (y, 2)
        return a, b, c + e, d
    return fn_program(f, (t(3), t(3)))

@case("q_mx")
def q_global_read_after_mutation_by_helper():
    cfg = {"mode": "a"}
    def set_mode(m):
        cfg["mode"] = m
    def f(x):
        set_mode("b")
        y = x * 2 if cfg["mode"] == "b" else x
        set_mode("c")
        return y
    return fn_program(f, (t(3),), observe=lambda: dict(cfg))

@case("q_mx")
def q_isinstance_abc_collections():
    import collections.abc as cabc
    def f(x, v):
        n = 0
        if isinstance(v, cabc.Mapping):
            n += 1
        if isinstance(v, cabc.Sequence):
            n += 2
        if isinstance(v, cabc.Iterable):
            n += 4
        return x * n
    return fn_program(f, (t(3), {"a": 1}), (t(3), [1]), (t(3), 3))

@case("q_mx")
def q_callable_check_variety():
    class C:
        def __call__(self):
            return 1
    def f(x):
        return x + sum(callable(v) for v in (len, C(), C, 3, "s", lambda: 1, x))
    return fn_program(f, (t(3),))

@case("q_mx")
def q_type_checks_builtins():
    def f(x, v):
        kinds = (type(v) is int, type(v) == float, isinstance(v, bool), isinstance(v, (int, float)))
        return x + sum(kinds), kinds
    return fn_program(f, (t(3), 1), (t(3), 1.0), (t(3), True))

@case("q_mx")
def q_string_building_loop():
    def f(x):
        s = ""
        for i in range(3):
            s += str(i) * (i + 1)
        parts = [c for c in s if c != "1"]
        return x * len(s), s, "".join(reversed(parts))
    return fn_program(f, (t(3),))

@case("q_mx")
def q_hash_of_constants_and_tuple():
    def f(x):
        return x + (hash((1, "a")) == hash((1, "a"))), hash(3), hash(None) == hash(None)
    return fn_program(f, (t(3),))

@case("q_mx")
def q_iter_next_on_dict_and_list():
    def f(d):
        it = iter(d)
        k1 = next(it)
        k2 = next(it)
        return d[k1] - d[k2], k1, next(iter(d.values())).shape
    return fn_program(f, ({"p": t(2), "q": t(2)},))

@case("q_mx")
def q_exception_in_helper_side_effect_kept():
    log = []
    def helper(v):
        log.append("before")
        raise ValueError("x")
    def f(x):
        try:
            helper(x)
        except ValueError:
            log.append("caught")
        return x + len(log)
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_mx")
def q_ctx_manager_class_returns_tensor_and_state():
    class Timer:
        def __init__(self):
            self.n = 0
        def __enter__(self):
            self.n += 1
            return self
        def __exit__(self, *a):
            self.n += 10
    tm = Timer()
    def f(x):
        with tm as tt:
            y = x * tt.n
        return y + tm.n
    return fn_program(f, (t(3),), (t(3),), observe=lambda: tm.n)

@case("q_mx")
def q_list_comprehension_with_walrus_tensor_filter():
    def f(xs):
        kept = [s for v in xs if (s := v.shape[0]) > 2]
        return kept, s
    return fn_program(f, ([t(3), t(1), t(4)],))

@case("q_mx")
def q_in_list_of_tensors_with_int_raises():
    def f(x):
        try:
            return 3 in [x]
        except RuntimeError:
            return x * 2
    return fn_program(f, (t(3),))

@case("q_mx")
def q_in_list_with_tensor_same_object():
    def f(x, y):
        return x in [x, y], (x in (y,)) if x.numel() == 1 else None
    return fn_program(f, (t(3), t(3)))
