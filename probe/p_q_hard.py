import torch, collections, dataclasses, enum, functools, itertools, operator, math, contextlib, copy, typing
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

gb = torch._dynamo.graph_break

@case("q_hd")
def q_descriptor_class_access_returns_self():
    class D:
        def __get__(self, obj, owner):
            if obj is None:
                return "class-level"
            return obj.k * 2
    class C:
        d = D()
        def __init__(self):
            self.k = 3
    def f(x):
        return x * C().d, C.d
    return fn_program(f, (t(3),))

@case("q_hd")
def q_metaclass_call_counts():
    made = []
    class Meta(type):
        def __call__(cls, *a, **k):
            made.append(cls.__name__)
            return super().__call__(*a, **k)
    class W(metaclass=Meta):
        def __init__(self, v):
            self.v = v
    def f(x):
        return x * W(3).v
    return fn_program(f, (t(3),), observe=lambda: list(made))

@case("q_hd")
def q_type_three_arg_dynamic_class():
    def f(x):
        K = type("K", (), {"k": 4, "m": lambda self, v: v * self.k})
        return K().m(x), K.__name__
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dataclass_order_sorting():
    @dataclasses.dataclass(order=True)
    class Item:
        prio: int
        name: str = dataclasses.field(compare=False)
    def f(x):
        items = sorted([Item(3, "c"), Item(1, "a"), Item(2, "b")])
        return x * items[0].prio, [i.name for i in items], Item(1, "x") == Item(1, "y")
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dataclass_init_false_and_kw_only():
    @dataclasses.dataclass(kw_only=True)
    class Cfg:
        a: int = 1
        b: int = 2
        total: int = dataclasses.field(init=False)
        def __post_init__(self):
            self.total = self.a + self.b
    def f(x):
        c = Cfg(b=5)
        return x * c.total, repr(c)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_frozen_dataclass_post_init_object_setattr():
    @dataclasses.dataclass(frozen=True)
    class Fz:
        a: int
        sq: int = 0
        def __post_init__(self):
            object.__setattr__(self, "sq", self.a * self.a)
    def f(x):
        z = Fz(3)
        return x * z.sq, hash(z) == hash(Fz(3))
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dataclass_input_mutated():
    @dataclasses.dataclass
    class St:
        step: int
        acc: torch.Tensor
    s = St(0, torch.zeros(3))
    def f(x, st):
        st.step += 1
        st.acc = st.acc + x
        return st.acc * st.step
    return fn_program(f, (t(3), s), (t(3), s), observe=lambda: (s.step, s.acc))

@case("q_hd")
def q_namedtuple_subclass_override():
    Base = collections.namedtuple("Base", "a b")
    class P(Base):
        __slots__ = ()
        @property
        def total(self):
            return self.a + self.b
        def __repr__(self):
            return "P!"
    def f(x):
        p = P(x, 2)
        return p.total, repr(p), p._replace(b=5).total
    return fn_program(f, (t(3),))

@case("q_hd")
def q_enum_methods_properties():
    class Act(enum.Enum):
        RELU = "relu"
        TANH = "tanh"
        @property
        def fn(self):
            return {"relu": torch.relu, "tanh": torch.tanh}[self.value]
        def apply(self, v):
            return self.fn(v)
    def f(x, a):
        return a.apply(x), Act(a.value) is a
    return fn_program(f, (t(3), Act.RELU), (t(3), Act.TANH))

@case("q_hd")
def q_enum_missing_hook():
    class Sz(enum.Enum):
        S = 1
        L = 3
        @classmethod
        def _missing_(cls, v):
            return cls.L if v > 1 else cls.S
    def f(x):
        return x * Sz(7).value + Sz(0).value
    return fn_program(f, (t(3),))

@case("q_hd")
def q_intflag_arith():
    class P(enum.IntFlag):
        R = 4
        W = 2
        X = 1
    def f(x):
        m = P.R | P.X
        return x * int(m) + (m & P.W), P.W in m, m == 5
    return fn_program(f, (t(3),))

@case("q_hd")
def q_closure_mutated_across_graph_break():
    def f(x):
        n = 1
        def bump():
            nonlocal n
            n *= 3
        bump()
        gb()
        bump()
        return x * n
    return fn_program(f, (t(3),))

@case("q_hd")
def q_side_effects_order_across_break():
    log = []
    def f(x):
        log.append(1)
        y = x * 2
        gb()
        log.append(2)
        return y + len(log)
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_hd")
def q_print_graph_break_between_mutations():
    state = {"k": 0}
    def f(x):
        state["k"] += 1
        print("", end="")
        state["k"] *= 10
        return x + state["k"]
    return fn_program(f, (t(3),), (t(3),), observe=lambda: dict(state))

@case("q_hd")
def q_generator_with_break_inside():
    def gen(x):
        yield x * 2
        gb()
        yield x * 3
    def f(x):
        return sum(gen(x))
    return fn_program(f, (t(3),))

@case("q_hd")
def q_exit_raises_replaces_exception():
    class Bad:
        def __enter__(self):
            return self
        def __exit__(self, *a):
            raise KeyError("from-exit")
    def f(x):
        try:
            with Bad():
                raise ValueError("body")
        except KeyError as e:
            return x + 1, type(e.__context__).__name__
    return fn_program(f, (t(3),))

@case("q_hd")
def q_nonlocal_in_nested_generator():
    def f(x):
        count = 0
        def gen():
            nonlocal count
            for i in range(3):
                count += 1
                yield i
        s = sum(gen())
        return x * s + count
    return fn_program(f, (t(3),))

@case("q_hd")
def q_sort_mixed_types_raises():
    def f(x):
        try:
            sorted([1, "a"])
        except TypeError:
            return x * 2
        return x
    return fn_program(f, (t(3),))

@case("q_hd")
def q_str_translate_splitlines_format_map():
    def f(x):
        tbl = str.maketrans("ab", "xy")
        s = "aabb\ncd\n".translate(tbl)
        lines = s.splitlines()
        m = "{a}-{b}".format_map({"a": 1, "b": 2})
        return x + len(lines), lines, m, "a\tb".expandtabs(4)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_zip_star_transpose():
    def f(xs):
        cols = list(zip(*xs))
        return [sum(c) for c in cols]
    return fn_program(f, ([(t(2), t(2)), (t(2), t(2)), (t(2), t(2))],))

@case("q_hd")
def q_recursive_dict_walk():
    def walk(d, depth=0):
        tot = 0
        for k, v in d.items():
            if isinstance(v, dict):
                tot = tot + walk(v, depth + 1)
            else:
                tot = tot + v * (depth + 1)
        return tot
    def f(d):
        return walk(d)
    return fn_program(f, ({"a": t(2), "b": {"c": t(2), "d": {"e": t(2)}}},))

@case("q_hd")
def q_globals_dict_write():
    def f(x):
        globals()["_Q_TMP"] = 5
        return x * globals()["_Q_TMP"]
    return fn_program(f, (t(3),))

@case("q_hd")
def q_instance_dict_manipulation():
    class O:
        def __init__(self):
            self.a = 1
    def f(x):
        o = O()
        o.__dict__["b"] = 2
        o.__dict__.update(c=3)
        return x * (o.a + o.b + o.c), sorted(vars(o))
    return fn_program(f, (t(3),))

@case("q_hd")
def q_copy_user_object():
    class O:
        def __init__(self, l):
            self.l = l
    def f(x):
        a = O([x])
        b = copy.copy(a)
        c = copy.deepcopy(O([1, 2]))
        b.l.append(x * 2)
        return len(a.l), b is not a, len(c.l)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dunder_index_for_list_subscript():
    class I:
        def __index__(self):
            return 2
    def f(x):
        l = [x, x * 2, x * 3]
        return l[I()], [0, 1, 2, 3][I():], range(10)[I()]
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dunder_reversed_custom():
    class R:
        def __init__(self, d):
            self.d = d
        def __len__(self):
            return len(self.d)
        def __getitem__(self, i):
            return self.d[i]
        def __reversed__(self):
            return iter(["custom"])
    def f(x):
        return x + len(list(reversed(R([1, 2, 3])))), list(reversed(R([1, 2])))
    return fn_program(f, (t(3),))

@case("q_hd")
def q_getitem_sequence_protocol_iteration():
    class Seq:
        def __getitem__(self, i):
            if i >= 3:
                raise IndexError
            return i * 10
    def f(x):
        return x + sum(Seq()), list(Seq()), 20 in Seq()
    return fn_program(f, (t(3),))

@case("q_hd")
def q_bool_raises_in_user():
    class B:
        def __bool__(self):
            raise ValueError("no bool")
    def f(x):
        try:
            if B():
                return x
        except ValueError:
            return x * 2
    return fn_program(f, (t(3),))

@case("q_hd")
def q_eq_notimplemented_fallback():
    class A:
        def __eq__(self, o):
            return NotImplemented
    class B:
        def __eq__(self, o):
            return True
    def f(x):
        return x + (A() == B()) + (A() == A()) * 10
    return fn_program(f, (t(3),))

@case("q_hd")
def q_iadd_user_inplace():
    class Acc:
        def __init__(self):
            self.v = 0
        def __iadd__(self, o):
            self.v = self.v + o
            return self
    def f(x):
        a = Acc()
        b = a
        a += x
        a += 1
        return b.v, a is b
    return fn_program(f, (t(3),))

@case("q_hd")
def q_radd_with_sum_default_start():
    class Z:
        def __init__(self, v):
            self.v = v
        def __radd__(self, o):
            return Z(o + self.v) if not isinstance(o, Z) else Z(o.v + self.v)
        def __add__(self, o):
            return Z(self.v + o.v)
    def f(x):
        return sum([Z(x), Z(2), Z(3)]).v
    return fn_program(f, (t(3),))

@case("q_hd")
def q_user_matmul_and_rmatmul():
    class Lin:
        def __init__(self, w):
            self.w = w
        def __matmul__(self, v):
            return v @ self.w
        def __rmatmul__(self, v):
            return self.w @ v
    def f(x, w):
        L = Lin(w)
        return L @ x, x @ L
    return fn_program(f, (t(3, 3), t(3, 3)))

@case("q_hd")
def q_class_getitem_generic_user():
    T = typing.TypeVar("T")
    class Box(typing.Generic[T]):
        def __init__(self, v):
            self.v = v
    def f(x):
        b = Box[int](x)
        return b.v * 2, Box[int] is not None
    return fn_program(f, (t(3),))

@case("q_hd")
def q_super_in_init_subclass_and_class_attrs():
    class Base:
        registry = []
        def __init_subclass__(cls, tag="", **kw):
            super().__init_subclass__(**kw)
            cls.tag = tag
    class A(Base, tag="aa"):
        pass
    def f(x):
        return x + len(A.tag), A.tag
    return fn_program(f, (t(3),))

@case("q_hd")
def q_range_len_user_object_loop():
    class Bag:
        def __init__(self, items):
            self.items = items
        def __len__(self):
            return len(self.items)
    def f(x):
        b = Bag([1, 2, 3])
        for i in range(len(b)):
            x = x + b.items[i]
        return x
    return fn_program(f, (t(3),))

@case("q_hd")
def q_getattr_recursion_guard_private():
    class Lazy:
        def __init__(self):
            self._store = {"a": 1}
        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            return self._store.get(name, 0)
    def f(x):
        l = Lazy()
        return x * l.a + l.zz, hasattr(l, "_nope")
    return fn_program(f, (t(3),))

@case("q_hd")
def q_setattr_override_with_super():
    class Tracked:
        def __init__(self):
            super().__setattr__("log", [])
        def __setattr__(self, k, v):
            self.log.append(k)
            super().__setattr__(k, v)
    def f(x):
        o = Tracked()
        o.a = x
        o.b = 2
        return o.a * o.b, list(o.log)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_slots_with_class_default_attr_error():
    class S:
        __slots__ = ("a",)
    def f(x):
        s = S()
        try:
            s.b = 1
        except AttributeError:
            pass
        try:
            return s.a
        except AttributeError:
            return x * 2
    return fn_program(f, (t(3),))

@case("q_hd")
def q_property_inheritance_override_setter():
    class A:
        def __init__(self):
            self._v = 1
        @property
        def v(self):
            return self._v
        @v.setter
        def v(self, n):
            self._v = n
    class B(A):
        @A.v.setter
        def v(self, n):
            self._v = n * 100
    def f(x):
        b = B()
        b.v = 2
        return x * b.v
    return fn_program(f, (t(3),))

@case("q_hd")
def q_staticmethod_called_via_self_in_method():
    class U:
        @staticmethod
        def norm(v):
            return v / (v.abs().max() + 1)
        def run(self, v):
            return self.norm(v) + type(self).norm(v)
    def f(x):
        return U().run(x)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_classmethod_on_instance_counter():
    class C:
        n = 0
        @classmethod
        def inc(cls):
            cls.n += 1
            return cls.n
    c = C()
    def f(x):
        return x * c.inc() + C.inc()
    return fn_program(f, (t(3),), observe=lambda: C.n)

@case("q_hd")
def q_partial_with_tensor_bound_and_kw_override():
    def g(a, b, *, s=1):
        return (a - b) * s
    def f(x, y):
        p = functools.partial(g, x, s=2)
        return p(y), p(y, s=5), p.args[0] is x
    return fn_program(f, (t(3), t(3)))

@case("q_hd")
def q_reduce_dict_merge():
    def f(x):
        ds = [{"a": 1}, {"b": 2}, {"a": 3}]
        m = functools.reduce(lambda a, b: {**a, **b}, ds)
        return x * m["a"] + m["b"], m
    return fn_program(f, (t(3),))

@case("q_hd")
def q_lru_cache_method_and_info():
    calls = []
    @functools.lru_cache(maxsize=4)
    def sq(n):
        calls.append(n)
        return n * n
    def f(x):
        return x * (sq(3) + sq(3) + sq(4))
    return fn_program(f, (t(3),), observe=lambda: list(calls))

@case("q_hd")
def q_itertools_chain_with_generator_and_break():
    def f(x):
        total = x
        for i, v in enumerate(itertools.chain(range(3), (j * 10 for j in range(3)))):
            if i == 4:
                break
            total = total + v
        return total
    return fn_program(f, (t(3),))

@case("q_hd")
def q_itertools_product_of_tensor_lists():
    def f(xs, ys):
        return [a * b for a, b in itertools.product(xs, ys)]
    return fn_program(f, ([t(2), t(2)], [t(2), t(2), t(2)]))

@case("q_hd")
def q_itertools_accumulate_tensor_default():
    def f(xs):
        return list(itertools.accumulate(xs))
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("q_hd")
def q_itertools_batched_like_islice_loop():
    def f(x):
        it = iter(range(7))
        chunks = []
        while chunk := list(itertools.islice(it, 3)):
            chunks.append(chunk)
        return x * len(chunks), chunks
    return fn_program(f, (t(3),))

@case("q_hd")
def q_operator_attrgetter_on_tensor():
    def f(x):
        g = operator.attrgetter("shape", "dtype")
        s, d = g(x)
        return x * s[0], str(d)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_itemgetter_sort_dicts():
    def f(x):
        rows = [{"n": 3, "k": "c"}, {"n": 1, "k": "a"}]
        rows.sort(key=operator.itemgetter("n"))
        return x * rows[0]["n"], [r["k"] for r in rows]
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dict_items_delete_during_iter_raises():
    def f(x):
        d = {1: 1, 2: 2}
        try:
            for k in d:
                del d[k]
        except RuntimeError:
            return x - 1, len(d)
        return x
    return fn_program(f, (t(3),))

@case("q_hd")
def q_dict_values_mutate_during_iter_ok():
    def f(x):
        d = {"a": 1, "b": 2}
        for k in d:
            d[k] = d[k] * 10
        return x * sum(d.values())
    return fn_program(f, (t(3),))

@case("q_hd")
def q_list_mutate_during_iteration_append_bounded():
    def f(x):
        l = [1, 2]
        for v in l:
            if len(l) < 5:
                l.append(v + 10)
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_hd")
def q_list_remove_during_iteration_skips():
    def f(x):
        l = [1, 2, 3, 4]
        for v in l:
            l.remove(v)
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_hd")
def q_deque_iteration_mutation_raises():
    def f(x):
        dq = collections.deque([1, 2])
        try:
            for v in dq:
                dq.append(v)
        except RuntimeError:
            return x * 3
        return x
    return fn_program(f, (t(3),))

@case("q_hd")
def q_ordered_dict_equality_order_sensitive():
    def f(x):
        a = collections.OrderedDict([("a", 1), ("b", 2)])
        b = collections.OrderedDict([("b", 2), ("a", 1)])
        return x + (a == b) + (a == dict(b)) * 2
    return fn_program(f, (t(3),))

@case("q_hd")
def q_defaultdict_missing_does_not_insert_on_get():
    def f(x):
        d = collections.defaultdict(int)
        d.get("a")
        _ = "b" in d
        d["c"]
        return x * len(d), sorted(d)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_counter_from_tensor_shapes():
    def f(xs):
        c = collections.Counter(v.shape[0] for v in xs)
        return [v * c[v.shape[0]] for v in xs]
    return fn_program(f, ([t(2), t(3), t(2)],))

@case("q_hd")
def q_nested_with_and_return_inside():
    log = []
    class C:
        def __init__(self, n):
            self.n = n
        def __enter__(self):
            log.append(self.n)
        def __exit__(self, *a):
            log.append(-self.n)
    def f(x):
        with C(1):
            with C(2):
                return x * 2
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_hd")
def q_exception_in_list_comprehension_caught():
    def f(x):
        try:
            vals = [10 // v for v in [1, 2, 0]]
        except ZeroDivisionError:
            vals = [-1]
        return x * vals[0]
    return fn_program(f, (t(3),))

@case("q_hd")
def q_try_except_returns_in_loop_with_finally_counter():
    def f(x):
        c = 0
        for i in range(4):
            try:
                if i % 2:
                    raise ValueError
                c += 1
            except ValueError:
                c += 10
            finally:
                c += 100
        return x * c
    return fn_program(f, (t(3),))

@case("q_hd")
def q_generator_expression_scoping_class_var():
    def f(x):
        vals = [1, 2, 3]
        g = (v * 2 for v in vals)
        vals = [100]
        return x + sum(g)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_lambda_closure_in_loop_kwdefault_and_cell():
    def f(x):
        fs = {}
        for name in ("a", "b"):
            fs[name] = lambda v, n=name: v * len(n * 2)
        k = 1
        h = lambda v: v + k
        k = 10
        return fs["a"](x) + fs["b"](x), h(x)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_math_on_shape_and_float_input():
    def f(x, temp):
        d = x.shape[-1]
        scale = 1 / math.sqrt(d) / temp
        return x * scale, math.log2(d), round(scale, 3)
    return fn_program(f, (t(2, 4), 0.5), (t(2, 4), 2.0))

@case("q_hd")
def q_int_float_edge_conversions():
    def f(x):
        return x + int(2.999), int("-12"), float("-inf") < 0, int(float("1e3")), bool("0"), str(1.0), str(10 ** 20)
    return fn_program(f, (t(3),))

@case("q_hd")
def q_float_methods():
    def f(x, v):
        return x * v.as_integer_ratio()[0], v.is_integer(), (2.5).hex(), float.fromhex("0x1p-2")
    return fn_program(f, (t(3), 0.75), (t(3), 2.0))

@case("q_hd")
def q_round_modes():
    def f(x):
        return x + round(0.5) + round(1.5) + round(-0.5), round(2.675, 2), round(1234, -2), math.floor(-0.5)
    return fn_program(f, (t(3),))
