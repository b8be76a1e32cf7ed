import torch, collections, dataclasses, enum, functools, itertools, operator, math, contextlib, copy, typing, abc
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

gb = torch._dynamo.graph_break

@case("q_mo")
def q_list_iter_append_across_break():
    def f(x):
        l = [1, 2]
        out = x
        for v in l:
            if v < 3:
                l.append(v + 2)
            out = out + v
        return out, l
    return fn_program(f, (t(3),))

@case("q_mo")
def q_list_input_iter_append_in_loop():
    def f(xs):
        total = 0
        for v in xs:
            if len(xs) < 4:
                xs.append(v * 2)
            total = total + v
        return total
    lst = [t(2), t(2)]
    return fn_program(f, (lst,), observe=lambda: len(lst))

@case("q_mo")
def q_list_pop_in_while_iter():
    def f(x):
        q = [x, x * 2, x * 3]
        out = []
        for v in q:
            out.append(v)
            if len(q) > 1:
                q.pop()
        return out
    return fn_program(f, (t(3),))

@case("q_mo")
def q_list_insert_front_during_iter():
    def f(x):
        l = [1, 2, 3]
        seen = []
        for v in l:
            seen.append(v)
            if v == 1:
                l.insert(0, 0)
            if len(seen) > 5:
                break
        return x * len(seen), seen
    return fn_program(f, (t(3),))

@case("q_mo")
def q_enumerate_list_mutated():
    def f(x):
        l = [1, 2]
        for i, v in enumerate(l):
            if i < 2:
                l.append(v * 10)
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_mo")
def q_iter_list_then_clear():
    def f(x):
        l = [1, 2, 3]
        it = iter(l)
        a = next(it)
        l.clear()
        return x * a, list(it)
    return fn_program(f, (t(3),))

@case("q_mo")
def q_intenum_in_tensor_ops():
    class D(enum.IntEnum):
        ROW = 0
        COL = 1
    def f(x):
        return x.sum(D.COL), x.size(D.ROW), torch.full((2,), D.COL), x * D.COL
    return fn_program(f, (t(2, 3),))

@case("q_mo")
def q_intflag_zero_member_in_graph():
    class F(enum.IntFlag):
        A = 1
        B = 2
    def f(x):
        z = F.A & F.B
        return x + z, x * (F.A | F.B)
    return fn_program(f, (t(3),))

@case("q_mo")
def q_float_enum_constant():
    class Sc(float, enum.Enum):
        HALF = 0.5
        TWO = 2.0
    def f(x):
        return x * Sc.HALF + Sc.TWO
    return fn_program(f, (t(3),))

@case("q_mo")
def q_enum_missing_returns_none_raises():
    class E(enum.Enum):
        A = 1
        @classmethod
        def _missing_(cls, v):
            return None
    def f(x):
        try:
            E(5)
        except ValueError as e:
            return x - 1, str(e)
        return x
    return fn_program(f, (t(3),))

@case("q_mo")
def q_enum_missing_case_insensitive():
    class Mode(enum.Enum):
        FAST = "fast"
        SLOW = "slow"
        @classmethod
        def _missing_(cls, v):
            for m in cls:
                if m.value == str(v).lower():
                    return m
            return None
    def f(x, s):
        return x * (2 if Mode(s) is Mode.FAST else 3)
    return fn_program(f, (t(3), "FAST"), (t(3), "slow"))

@case("q_mo")
def q_globals_write_then_global_read_helper():
    def helper():
        return globals().get("_Q_FLAG2", 0)
    def f(x):
        globals()["_Q_FLAG2"] = 7
        return x * helper()
    return fn_program(f, (t(3),))

@case("q_mo")
def q_globals_read_existing():
    def f(x):
        g = globals()
        return x * g["math"].pi
    return fn_program(f, (t(3),))

@case("q_mo")
def q_global_statement_in_nested_helper():
    def setter(v):
        global _Q_G3
        _Q_G3 = v
    def f(x):
        setter(4)
        return x * _Q_G3
    return fn_program(f, (t(3),))

@case("q_mo")
def q_is_compare_input_objects_in_list():
    class T: pass
    a, b = T(), T()
    def f(x, objs):
        return x * sum(1 for o in objs if o is a)
    return fn_program(f, (t(3), [a, b, a]), (t(3), [b, b, a]))

@case("q_mo")
def q_is_compare_attr_object():
    class T: pass
    DEFAULT = T()
    class Cfg:
        def __init__(self, mode):
            self.mode = mode
    def f(x, cfg):
        return x + (1 if cfg.mode is DEFAULT else 0)
    return fn_program(f, (t(3), Cfg(DEFAULT)), (t(3), Cfg(T())))

@case("q_mo")
def q_id_in_set_of_seen_inputs():
    class T: pass
    a, b = T(), T()
    def f(x, p, q):
        seen = {id(p)}
        return x + (id(q) in seen)
    return fn_program(f, (t(3), a, b), (t(3), a, a))

@case("q_mo")
def q_dict_get_by_object_identity_missing():
    class T: pass
    a, b = T(), T()
    reg = {a: 10}
    def f(x, k):
        return x + reg.get(k, -1)
    return fn_program(f, (t(3), a), (t(3), b))

@case("q_mo")
def q_in_tuple_of_tensors_scalar():
    def f(x):
        y = x.sum()
        try:
            return 0.0 in (y, x), y
        except RuntimeError:
            return None
    return fn_program(f, (t(3),))

@case("q_mo")
def q_list_count_tensors_same_object():
    def f(x, y):
        l = [x, x, y]
        try:
            return l.count(x), x + 1
        except RuntimeError:
            return x - 1
    return fn_program(f, (t(3), t(3)))

@case("q_mo")
def q_tensor_in_list_of_strings():
    def f(x):
        return x * 2, x in ["a", None, "b"]
    return fn_program(f, (t(3),))

@case("q_mo")
def q_list_remove_tensor_identity_first():
    def f(x, y):
        l = [x, y]
        l.remove(x)
        return len(l), l[0] * 2
    return fn_program(f, (t(3), t(3)))

@case("q_mo")
def q_descriptor_set_name_and_instance_dict():
    class Field:
        def __set_name__(self, owner, name):
            self.key = "_f_" + name
        def __get__(self, obj, tp=None):
            return obj.__dict__.get(self.key, 0) if obj is not None else self
        def __set__(self, obj, v):
            obj.__dict__[self.key] = v * 2
    class R:
        a = Field()
        b = Field()
    def f(x):
        r = R()
        r.a = 1
        r.b = r.a + 1
        return x * r.b, sorted(vars(r))
    return fn_program(f, (t(3),))

@case("q_mo")
def q_descriptor_on_input_object_mutation():
    class Pos:
        def __get__(self, obj, tp=None):
            return obj._p
        def __set__(self, obj, v):
            obj._p = max(v, 0)
    class O:
        p = Pos()
        def __init__(self):
            self._p = 1
    o = O()
    def f(x):
        o.p = o.p - 5
        o.p = o.p + 3
        return x * o.p
    return fn_program(f, (t(3),), observe=lambda: o._p)

@case("q_mo")
def q_getattr_on_class_level_fallback_and_setattr_after():
    class Dyn:
        def __getattr__(self, n):
            return n.upper()
    def f(x):
        d = Dyn()
        before = d.abc
        d.abc = "set"
        return x + len(before), d.abc
    return fn_program(f, (t(3),))

@case("q_mo")
def q_super_property_chain_three_levels():
    class A:
        @property
        def v(self):
            return 1
    class B(A):
        @property
        def v(self):
            return super().v + 10
    class C(B):
        @property
        def v(self):
            return super().v + 100
    def f(x):
        return x * C().v
    return fn_program(f, (t(3),))

@case("q_mo")
def q_cooperative_multiple_inheritance_init():
    log = []
    class Base:
        def __init__(self, **kw):
            log.append("Base")
    class L(Base):
        def __init__(self, **kw):
            log.append("L")
            super().__init__(**kw)
    class R(Base):
        def __init__(self, r=0, **kw):
            log.append("R")
            self.r = r
            super().__init__(**kw)
    class LR(L, R):
        pass
    def f(x):
        o = LR(r=3)
        return x * o.r
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_mo")
def q_abstract_property_impl():
    class Base(abc.ABC):
        @property
        @abc.abstractmethod
        def k(self): ...
        def scale(self, v):
            return v * self.k
    class Impl(Base):
        @property
        def k(self):
            return 4
    def f(x):
        return Impl().scale(x)
    return fn_program(f, (t(3),))

@case("q_mo")
def q_dataclass_eq_and_in_list():
    @dataclasses.dataclass
    class P:
        a: int
        b: str
    def f(x):
        ps = [P(1, "a"), P(2, "b")]
        return x * (P(2, "b") in ps) + ps.index(P(1, "a")), P(1, "a") != P(1, "b")
    return fn_program(f, (t(3),))

@case("q_mo")
def q_dataclass_inheritance_fields():
    @dataclasses.dataclass
    class A:
        x: int = 1
    @dataclasses.dataclass
    class B(A):
        y: int = 2
        def total(self):
            return self.x + self.y
    def f(v):
        b = B(y=5)
        return v * b.total(), [fl.name for fl in dataclasses.fields(B)]
    return fn_program(f, (t(3),))

@case("q_mo")
def q_namedtuple_as_dict_key_and_sort():
    P = collections.namedtuple("P", "a b")
    def f(x):
        d = {P(1, 2): "x", P(0, 5): "y"}
        ks = sorted(d)
        return x * ks[0].b, d[P(1, 2)], max(d, key=lambda p: p.a)
    return fn_program(f, (t(3),))

@case("q_mo")
def q_closure_cell_rebind_after_inner_def_across_break():
    def f(x):
        k = 2
        def g(v):
            return v * k
        a = g(x)
        gb()
        k = 5
        return a + g(x)
    return fn_program(f, (t(3),))

@case("q_mo")
def q_nonlocal_list_and_int_in_loop_closure():
    def f(x):
        hits = 0
        acc = []
        def visit(v):
            nonlocal hits
            hits += 1
            acc.append(v)
        for i in range(3):
            visit(x * i)
        return sum(acc), hits
    return fn_program(f, (t(3),))

@case("q_mo")
def q_function_returning_closures_counter_shared():
    def make():
        state = {"n": 0}
        def inc():
            state["n"] += 1
            return state["n"]
        def get():
            return state["n"]
        return inc, get
    inc, get = make()
    def f(x):
        inc(); inc()
        return x * get()
    return fn_program(f, (t(3),), (t(3),))

@case("q_mo")
def q_partial_reduce_over_tensors():
    def f(xs):
        add_scaled = functools.partial(lambda a, b, s: a + b * s, s=0.5)
        return functools.reduce(add_scaled, xs)
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("q_mo")
def q_lru_cache_in_loop_with_tensor_scale():
    @functools.lru_cache
    def coef(i):
        return 1.0 / (i + 1)
    def f(x):
        return sum(x * coef(i) for i in range(4))
    return fn_program(f, (t(3),))

@case("q_mo")
def q_itertools_groupby_tensors_by_shape():
    def f(xs):
        out = []
        for k, grp in itertools.groupby(xs, key=lambda v: v.shape[0]):
            out.append(torch.stack(list(grp)).sum(0))
        return out
    return fn_program(f, ([t(2), t(2), t(3), t(3), t(2)],))

@case("q_mo")
def q_itertools_zip_longest_none_tensors():
    def f(xs, ys):
        return [a if b is None else a + b for a, b in itertools.zip_longest(xs, ys)]
    return fn_program(f, ([t(2), t(2), t(2)], [t(2)]))

@case("q_mo")
def q_itertools_chain_dict_items():
    def f(a, b):
        return {k: v * 2 for k, v in itertools.chain(a.items(), b.items())}
    return fn_program(f, ({"p": t(2)}, {"q": t(2), "r": t(2)}))

@case("q_mo")
def q_itertools_count_float_step_zip():
    def f(xs):
        return [v * c for v, c in zip(xs, itertools.count(0.5, 0.25))]
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("q_mo")
def q_operator_itemgetter_on_tensor_tuple_output():
    def f(x):
        first = operator.itemgetter(0)
        return first(x.max(dim=0)), operator.itemgetter(slice(1, None))(x)
    return fn_program(f, (t(3, 2),))

@case("q_mo")
def q_str_methods_on_input_key_and_fstring_nested():
    def f(x, name):
        prefix, _, leaf = name.rpartition(".")
        key = f"{prefix or 'root'}/{leaf:>4}"
        return x * len(key), key, name.split(".")[-1].title()
    return fn_program(f, (t(3), "enc.layer.w"), (t(3), "bias"))

@case("q_mo")
def q_str_format_with_tensor_shape_and_numbers():
    def f(x):
        return "{0}x{1}".format(*x.shape), "%d items" % x.numel(), f"{x.shape[0]:03d}"
    return fn_program(f, (t(2, 5),))

@case("q_mo")
def q_match_nested_sequence_and_class():
    @dataclasses.dataclass
    class Lin:
        k: float
    def f(x, spec):
        match spec:
            case [Lin(k=k1), Lin(k=k2)]:
                return x * k1 * k2
            case [Lin(k=k)]:
                return x * k
            case []:
                return x
    return fn_program(f, (t(3), [Lin(2.0), Lin(3.0)]), (t(3), [Lin(5.0)]), (t(3), []))

@case("q_mo")
def q_match_value_pattern_enum():
    class Op(enum.Enum):
        ADD = 1
        MUL = 2
    def f(x, op):
        match op:
            case Op.ADD:
                return x + 1
            case Op.MUL:
                return x * 2
    return fn_program(f, (t(3), Op.ADD), (t(3), Op.MUL))

@case("q_mo")
def q_match_star_and_tensor_list():
    def f(xs):
        match xs:
            case [first, *mid, last]:
                return first + last + len(mid)
            case [only]:
                return only
    return fn_program(f, ([t(2), t(2), t(2), t(2)],), ([t(2)],))

@case("q_mo")
def q_try_finally_mutation_on_exception_path():
    state = {"open": 0}
    def f(x):
        state["open"] += 1
        try:
            if x.shape[0] == 3:
                raise ValueError("three")
            return x
        finally:
            state["open"] -= 1
    return fn_program(f, (t(3),), (t(4),), observe=lambda: dict(state))

@case("q_mo")
def q_exception_args_and_notes():
    def f(x):
        try:
            e = ValueError("a", 2)
            e.add_note("note1")
            raise e
        except ValueError as err:
            return x + err.args[1], err.__notes__
    return fn_program(f, (t(3),))

@case("q_mo")
def q_raise_in_finally_chains_context():
    def f(x):
        try:
            try:
                raise KeyError("inner")
            finally:
                raise ValueError("fin")
        except ValueError as e:
            return x + 1, type(e.__context__).__name__
    return fn_program(f, (t(3),))

@case("q_mo")
def q_generator_return_in_try_finally_order():
    log = []
    def gen():
        try:
            yield 1
            return
        finally:
            log.append("f")
    def f(x):
        for v in gen():
            log.append(v)
        return x + len(log)
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_mo")
def q_generator_send_tensor_running_mean():
    def avg():
        tot, n = 0, 0
        v = yield
        while True:
            tot = tot + v
            n += 1
            v = yield tot / n
    def f(xs):
        g = avg()
        next(g)
        out = None
        for v in xs:
            out = g.send(v)
        return out
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_mo")
def q_generator_yield_from_list_and_gen():
    def sub():
        yield "a"
        yield "b"
    def gen():
        yield from [1, 2]
        yield from sub()
        yield from range(2)
    def f(x):
        items = list(gen())
        return x * len(items), items
    return fn_program(f, (t(3),))

@case("q_mo")
def q_ctx_manager_exit_suppresses_only_some():
    class Only:
        def __init__(self, kind):
            self.kind = kind
        def __enter__(self):
            return self
        def __exit__(self, et, ev, tb):
            return et is not None and issubclass(et, self.kind)
    def f(x):
        with Only(KeyError):
            raise KeyError
        try:
            with Only(KeyError):
                raise IndexError
        except IndexError:
            x = x + 10
        return x
    return fn_program(f, (t(3),))

@case("q_mo")
def q_contextmanager_decorator_usage():
    log = []
    @contextlib.contextmanager
    def tag(n):
        log.append(n)
        yield
        log.append(-n)
    @tag(3)
    def helper(v):
        return v + 1
    def f(x):
        return helper(x) * 2
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_mo")
def q_user_ctx_with_grad_toggle_inside():
    class NoGrad:
        def __enter__(self):
            self.prev = torch.is_grad_enabled()
            torch.set_grad_enabled(False)
        def __exit__(self, *a):
            torch.set_grad_enabled(self.prev)
    def f(x):
        with NoGrad():
            y = x * 2
        z = x * 3
        return y.requires_grad, z.requires_grad, y, z
    return fn_program(f, (t(3, requires_grad=True),))

@case("q_mo")
def q_sorted_with_tuple_key_and_reverse_stable():
    def f(x):
        rows = [("b", 1), ("a", 2), ("c", 1), ("a", 1)]
        s = sorted(rows, key=lambda r: (r[1], r[0]), reverse=True)
        return x * s[0][1], s
    return fn_program(f, (t(3),))

@case("q_mo")
def q_min_max_multiple_args_key():
    def f(x, y):
        big = max(x, y, key=lambda v: v.shape[0])
        return big * 2, min(3, 1, 2), max("apple", "fig", key=len), min([(2, "b"), (2, "a")])
    return fn_program(f, (t(2), t(4)))

@case("q_mo")
def q_sum_of_bools_and_generator_of_shapes():
    def f(xs):
        return sum(v.shape[0] > 2 for v in xs), sum((v.sum() for v in xs), torch.zeros(()))
    return fn_program(f, ([t(2), t(3), t(4)],))

@case("q_mo")
def q_math_on_symbolic_sizes():
    def f(x):
        n = x.shape[0]
        return x * math.sqrt(n), math.ceil(n / 3), math.log(n), int(math.floor(n * 0.5))
    return fn_program(f, (t(4),), (t(9),), (t(16),))

@case("q_mo")
def q_int_float_bool_of_sizes():
    def f(x):
        n = x.shape[0]
        return x * float(n), bool(n - 4), int(n / 2), str(n), n.__index__() if hasattr(n, "__index__") else n
    return fn_program(f, (t(4),), (t(6),))

@case("q_mo")
def q_range_with_negative_step_and_len():
    def f(x):
        r = range(10, 0, -3)
        return x * len(r), list(r), r[-1], 4 in r, list(r[::-1])
    return fn_program(f, (t(3),))

@case("q_mo")
def q_slice_assignment_on_input_list():
    def f(xs, x):
        xs[1:] = [x, x * 2]
        return len(xs)
    lst = [t(3), t(3), t(3), t(3)]
    return fn_program(f, (lst, t(3)), observe=lambda: list(lst))

@case("q_mo")
def q_dict_input_pop_and_reinsert_order():
    def f(d):
        v = d.pop("a")
        d["a"] = v * 2
        return list(d)
    dd = {"a": t(2), "b": t(2)}
    return fn_program(f, (dd,), observe=lambda: dict(dd))

@case("q_mo")
def q_defaultdict_input_mutation():
    dd = collections.defaultdict(list)
    def f(d, x):
        d["k"].append(x)
        return len(d["k"]) * x
    return fn_program(f, (dd, t(3)), (dd, t(3)), observe=lambda: {k: list(v) for k, v in dd.items()})

@case("q_mo")
def q_ordereddict_input_move_to_end():
    od = collections.OrderedDict(a=1, b=2)
    def f(d, x):
        d.move_to_end("a")
        return x * list(d.values())[0]
    return fn_program(f, (od, t(3)), (od, t(3)), observe=lambda: list(od))

@case("q_mo")
def q_counter_input_update():
    c = collections.Counter()
    def f(cnt, x):
        cnt.update(["a", "b", "a"])
        return x * cnt["a"]
    return fn_program(f, (c, t(3)), (c, t(3)), observe=lambda: dict(c))

@case("q_mo")
def q_deque_input_rotate_and_append():
    dq = collections.deque([1, 2, 3], maxlen=4)
    def f(d, x):
        d.append(9)
        d.rotate(-1)
        return x * d[0]
    return fn_program(f, (dq, t(3)), (dq, t(3)), observe=lambda: list(dq))

@case("q_mo")
def q_set_input_mutation():
    s = {1}
    def f(st, x):
        st.add(len(st) + 1)
        st.discard(1)
        return x * len(st)
    return fn_program(f, (s, t(3)), (s, t(3)), observe=lambda: sorted(s))
