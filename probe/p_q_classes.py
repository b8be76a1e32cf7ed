import torch, dataclasses, enum, abc, collections, typing, functools
from harness import case, fn_program, t, Program, kw

@case("q_cls")
def q_property_setter_roundtrip():
    class P:
        def __init__(self):
            self._s = 2.0
        @property
        def s(self):
            return self._s * 2
        @s.setter
        def s(self, v):
            self._s = v + 1
    p = P()
    def f(x):
        p.s = 3.0
        return x * p.s
    return fn_program(f, (t(3),), observe=lambda: p._s)

@case("q_cls")
def q_property_deleter():
    class P:
        def __init__(self):
            self._v = 1
        @property
        def v(self):
            return getattr(self, "_v", -1)
        @v.deleter
        def v(self):
            del self._v
    def f(x):
        p = P()
        a = p.v
        del p.v
        return x + a + p.v
    return fn_program(f, (t(3),))

@case("q_cls")
def q_data_descriptor_get_set():
    class Clamp:
        def __set_name__(self, owner, name):
            self.name = "_" + name
        def __get__(self, obj, typ=None):
            if obj is None:
                return self
            return getattr(obj, self.name, 0.0)
        def __set__(self, obj, v):
            setattr(obj, self.name, max(0.0, min(1.0, v)))
    class M:
        a = Clamp()
    m = M()
    def f(x):
        m.a = 5.0
        b = m.a
        m.a = -2.0
        return x * b + m.a
    return fn_program(f, (t(3),))

@case("q_cls")
def q_nondata_descriptor_shadowed():
    class D:
        def __get__(self, obj, typ=None):
            return 10
    class C:
        d = D()
    def f(x):
        c = C()
        a = c.d
        c.__dict__["d"] = 3
        return x + a + c.d
    return fn_program(f, (t(3),))

@case("q_cls")
def q_classmethod_factory_subclass():
    class Base:
        scale = 2
        def __init__(self, k):
            self.k = k
        @classmethod
        def make(cls, k):
            return cls(k * cls.scale)
    class Sub(Base):
        scale = 5
    def f(x):
        a = Base.make(1)
        b = Sub.make(1)
        return x * a.k + b.k, type(b) is Sub
    return fn_program(f, (t(3),))

@case("q_cls")
def q_staticmethod_via_instance_and_class():
    class C:
        @staticmethod
        def g(v, n=2):
            return v ** n
    def f(x):
        return C.g(x) + C().g(x, 3)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_getattr_fallback_dynamic():
    class Ns:
        def __init__(self):
            self.real = 1.0
        def __getattr__(self, name):
            if name.startswith("w"):
                return float(len(name))
            raise AttributeError(name)
    def f(x):
        n = Ns()
        return x * n.real + n.wxyz + (1 if hasattr(n, "zzz") else 0)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_getattribute_override():
    class G:
        def __init__(self):
            self.a = 2
        def __getattribute__(self, name):
            if name == "a":
                return object.__getattribute__(self, name) * 10
            return object.__getattribute__(self, name)
    def f(x):
        return x + G().a
    return fn_program(f, (t(3),))

@case("q_cls")
def q_setattr_override_logs():
    log = []
    class S:
        def __setattr__(self, name, value):
            log.append(name)
            object.__setattr__(self, name, value * 2)
    def f(x):
        s = S()
        s.a = 3
        s.b = 4
        return x + s.a + s.b
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_cls")
def q_super_chain_mro_diamond():
    class A:
        def go(self, x):
            return x + 1
    class B(A):
        def go(self, x):
            return super().go(x) * 2
    class C(A):
        def go(self, x):
            return super().go(x) - 3
    class D(B, C):
        def go(self, x):
            return super().go(x) + 100
    def f(x):
        return D().go(x), [k.__name__ for k in D.__mro__]
    return fn_program(f, (t(3),))

@case("q_cls")
def q_super_two_arg_form():
    class A:
        def v(self):
            return 1
    class B(A):
        def v(self):
            return 2
    class C(B):
        def v(self):
            return super(B, self).v() + 10
    def f(x):
        return x * C().v()
    return fn_program(f, (t(3),))

@case("q_cls")
def q_super_init_kwargs_multiple():
    class A:
        def __init__(self, **kw):
            self.a = kw.pop("a", 0)
    class B(A):
        def __init__(self, b=1, **kw):
            super().__init__(**kw)
            self.b = b
    def f(x):
        o = B(b=3, a=4)
        return x * o.a + o.b
    return fn_program(f, (t(3),))

@case("q_cls")
def q_slots_class():
    class S:
        __slots__ = ("p", "q")
        def __init__(self, p):
            self.p = p
    def f(x):
        s = S(2)
        s.q = 3
        return x * s.p + s.q, hasattr(s, "__dict__")
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dataclass_default_factory():
    @dataclasses.dataclass
    class Cfg:
        n: int = 2
        tags: list = dataclasses.field(default_factory=list)
    def f(x):
        c = Cfg()
        c.tags.append("a")
        d = Cfg(n=3)
        return x * c.n + d.n, len(c.tags), len(d.tags)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dataclass_frozen_replace():
    @dataclasses.dataclass(frozen=True)
    class Pt:
        a: float
        b: float = 1.0
    def f(x):
        p = Pt(2.0)
        q = dataclasses.replace(p, b=5.0)
        return x * p.a + q.b, p == Pt(2.0, 1.0)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dataclass_frozen_assign_raises():
    @dataclasses.dataclass(frozen=True)
    class Pt:
        a: int
    def f(x):
        p = Pt(1)
        try:
            p.a = 2
        except dataclasses.FrozenInstanceError:
            return x - 1
        return x
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dataclass_astuple_fields():
    @dataclasses.dataclass
    class Pt:
        a: int
        b: int
    def f(x):
        p = Pt(2, 3)
        names = [fl.name for fl in dataclasses.fields(p)]
        return x * sum(dataclasses.astuple(p)), names, dataclasses.asdict(p)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dataclass_post_init_tensor():
    @dataclasses.dataclass
    class Box:
        w: torch.Tensor
        s: float = 1.0
        def __post_init__(self):
            self.s = self.s * 3
    def f(x):
        b = Box(x)
        return b.w * b.s
    return fn_program(f, (t(3),))

@case("q_cls")
def q_namedtuple_methods():
    P = collections.namedtuple("P", ["a", "b"])
    def f(x):
        p = P(x, 2)
        q = p._replace(b=3)
        return q.a * q.b, p._asdict()["b"], P._fields, len(p)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_typing_namedtuple_method():
    class NT(typing.NamedTuple):
        a: torch.Tensor
        k: int = 2
        def scaled(self):
            return self.a * self.k
    def f(x):
        n = NT(x)
        a, k = n
        return n.scaled() + a * k, n._replace(k=5).scaled()
    return fn_program(f, (t(3),))

@case("q_cls")
def q_namedtuple_make_and_index():
    P = collections.namedtuple("P", "x y z", defaults=(9,))
    def f(x):
        p = P._make([x, 2])
        return p[0] + p.z + p[-2], p.index(2), p.count(9)
    return fn_program(f, (t(3),))

class Color(enum.Enum):
    RED = 1
    GREEN = 2

class Lvl(enum.IntEnum):
    LO = 1
    HI = 3

class Fl(enum.Flag):
    A = 1
    B = 2
    C = 4

@case("q_cls")
def q_enum_value_name_compare():
    def f(x, c):
        if c is Color.RED:
            return x + c.value, c.name
        return x - c.value, c.name
    return fn_program(f, (t(3), Color.RED), (t(3), Color.GREEN))

@case("q_cls")
def q_intenum_arith():
    def f(x):
        return x * (Lvl.HI + 1), Lvl.HI > Lvl.LO, int(Lvl.LO)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_flag_ops():
    def f(x):
        m = Fl.A | Fl.C
        return x * (1 if Fl.C in m else 0) + (2 if Fl.B in m else 0), m.value, bool(m & Fl.B)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_enum_lookup_by_value_and_name():
    def f(x):
        return x * Color(2).value + Color["RED"].value, [c.name for c in Color]
    return fn_program(f, (t(3),))

@case("q_cls")
def q_abc_abstract_subclass():
    class Base(abc.ABC):
        @abc.abstractmethod
        def run(self, x): ...
        def twice(self, x):
            return self.run(self.run(x))
    class Impl(Base):
        def run(self, x):
            return x + 1
    def f(x):
        i = Impl()
        return i.twice(x), isinstance(i, Base), issubclass(Impl, Base)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_abc_instantiate_abstract_raises():
    class Base(abc.ABC):
        @abc.abstractmethod
        def run(self): ...
    def f(x):
        try:
            Base()
        except TypeError:
            return x + 1
        return x
    return fn_program(f, (t(3),))

@case("q_cls")
def q_class_attr_mutation_visible():
    class K:
        count = 0
        def bump(self):
            type(self).count += 1
            return type(self).count
    k = K()
    def f(x):
        k.bump()
        return x * k.bump()
    return fn_program(f, (t(3),), (t(3),), observe=lambda: K.count)

@case("q_cls")
def q_instance_shadows_class_attr():
    class K:
        v = 1
    def f(x):
        k = K()
        a = k.v
        k.v = 5
        return x + a + k.v + K.v
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dunder_call_and_len_bool():
    class Acc:
        def __init__(self):
            self.items = []
        def __call__(self, v):
            self.items.append(v)
            return self
        def __len__(self):
            return len(self.items)
    def f(x):
        a = Acc()
        if not a:
            x = x + 1
        a(x)(x * 2)
        return x * len(a), bool(a)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dunder_eq_hash_in_dict():
    class Key:
        def __init__(self, k):
            self.k = k
        def __eq__(self, o):
            return isinstance(o, Key) and o.k == self.k
        def __hash__(self):
            return hash(self.k)
    def f(x):
        d = {Key(1): 2, Key(2): 3}
        return x * d[Key(2)], Key(1) in d
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dunder_arith_user_vector():
    class V:
        def __init__(self, a):
            self.a = a
        def __add__(self, o):
            return V(self.a + (o.a if isinstance(o, V) else o))
        def __radd__(self, o):
            return V(self.a + o)
        def __mul__(self, k):
            return V(self.a * k)
        def __neg__(self):
            return V(-self.a)
    def f(x):
        v = sum([V(x), V(x * 2)], 0)
        w = -(v * 3) + 1
        return w.a
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dunder_getitem_setitem_contains():
    class Bag:
        def __init__(self):
            self.d = {}
        def __getitem__(self, k):
            return self.d.get(k, 0)
        def __setitem__(self, k, v):
            self.d[k] = v
        def __contains__(self, k):
            return k in self.d
        def __iter__(self):
            return iter(sorted(self.d))
    def f(x):
        b = Bag()
        b["a"] = x
        b["c"] = 2
        return b["a"] * b["c"] + b["zz"], "a" in b, list(b)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_isinstance_tuple_and_subclass():
    class A: pass
    class B(A): pass
    class C: pass
    def f(x):
        objs = [A(), B(), C()]
        return x * sum(isinstance(o, (B, C)) for o in objs), [issubclass(type(o), A) for o in objs]
    return fn_program(f, (t(3),))

@case("q_cls")
def q_type_call_new_class_in_fn():
    def f(x):
        class Local:
            k = 3
            def m(self, v):
                return v * self.k
        return Local().m(x)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_object_identity_and_id():
    class O: pass
    a = O()
    def f(x, o):
        b = O()
        return x + (1 if o is a else 0), id(b) != id(a), b is not a
    return fn_program(f, (t(3), a), (t(3), O()))

@case("q_cls")
def q_repr_str_user():
    class R:
        def __repr__(self):
            return "R()"
        def __str__(self):
            return "r-str"
    def f(x):
        return x + len(str(R())) + len(repr(R())), f"{R()}|{R()!r}"
    return fn_program(f, (t(3),))

@case("q_cls")
def q_init_subclass_registry():
    reg = []
    class Base:
        def __init_subclass__(cls, **kw):
            super().__init_subclass__()
            reg.append(cls.__name__)
    def f(x):
        class Sub(Base):
            pass
        return x + len(reg)
    return fn_program(f, (t(3),), observe=lambda: list(reg))

@case("q_cls")
def q_class_with_tensor_attr_method_updates():
    class Counter:
        def __init__(self):
            self.total = torch.zeros(3)
            self.n = 0
        def add(self, v):
            self.total = self.total + v
            self.n += 1
    c = Counter()
    def f(x):
        c.add(x)
        c.add(x * 2)
        return c.total / c.n
    return fn_program(f, (t(3),), (t(3),), observe=lambda: (c.n, c.total))

@case("q_cls")
def q_method_bound_stored_and_called():
    class A:
        def __init__(self, k):
            self.k = k
        def m(self, v):
            return v * self.k
    def f(x):
        ms = [A(2).m, A(3).m]
        return sum(m(x) for m in ms), ms[0].__self__.k
    return fn_program(f, (t(3),))

@case("q_cls")
def q_getattr_default_and_setattr_builtin():
    class O: pass
    def f(x):
        o = O()
        setattr(o, "val", 4)
        return x * getattr(o, "val", 1) + getattr(o, "missing", 2), vars(o)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_delattr_then_hasattr():
    class O:
        def __init__(self):
            self.a = 1
            self.b = 2
    def f(x):
        o = O()
        delattr(o, "a")
        return x + o.b + (10 if hasattr(o, "a") else 0)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_property_raises_attributeerror_to_getattr():
    class W:
        @property
        def p(self):
            raise AttributeError("nope")
        def __getattr__(self, n):
            return 7
    def f(x):
        return x + W().p
    return fn_program(f, (t(3),))

@case("q_cls")
def q_cached_property():
    calls = []
    class C:
        @functools.cached_property
        def heavy(self):
            calls.append(1)
            return 5
    def f(x):
        c = C()
        return x * c.heavy + c.heavy
    return fn_program(f, (t(3),), observe=lambda: len(calls))

@case("q_cls")
def q_classvar_list_shared_mutation():
    class R:
        seen = []
        def __init__(self, v):
            R.seen.append(v)
    def f(x):
        R(1); R(2)
        return x + len(R.seen)
    return fn_program(f, (t(3),), (t(3),), observe=lambda: list(R.seen))

@case("q_cls")
def q_user_iter_protocol():
    class Countdown:
        def __init__(self, n):
            self.n = n
        def __iter__(self):
            return self
        def __next__(self):
            if self.n <= 0:
                raise StopIteration
            self.n -= 1
            return self.n
    def f(x):
        for i in Countdown(3):
            x = x + i
        return x, list(Countdown(2))
    return fn_program(f, (t(3),))

@case("q_cls")
def q_user_bool_len_zero():
    class E:
        def __len__(self):
            return 0
    class T:
        def __bool__(self):
            return True
        def __len__(self):
            return 0
    def f(x):
        return x + (1 if E() else 2) + (10 if T() else 20)
    return fn_program(f, (t(3),))

@case("q_cls")
def q_dunder_lt_sorted_users():
    class P:
        def __init__(self, k):
            self.k = k
        def __lt__(self, o):
            return self.k < o.k
    def f(x):
        ps = sorted([P(3), P(1), P(2)])
        return x * ps[0].k + ps[-1].k, max([P(5), P(9)]).k
    return fn_program(f, (t(3),))

@case("q_cls")
def q_total_ordering():
    @functools.total_ordering
    class P:
        def __init__(self, k):
            self.k = k
        def __eq__(self, o):
            return self.k == o.k
        def __lt__(self, o):
            return self.k < o.k
    def f(x):
        return x + (P(2) >= P(1)) + (P(1) > P(2)) * 10
    return fn_program(f, (t(3),))

@case("q_cls")
def q_object_new_and_init_separately():
    class A:
        def __init__(self, v):
            self.v = v
    def f(x):
        a = A.__new__(A)
        A.__init__(a, 4)
        return x * a.v
    return fn_program(f, (t(3),))

@case("q_cls")
def q_mixin_method_resolution():
    class LogMixin:
        def tag(self):
            return "log-" + self.name()
    class Named:
        def name(self):
            return "n"
    class Both(LogMixin, Named):
        pass
    def f(x):
        return x + len(Both().tag()), Both().tag()
    return fn_program(f, (t(3),))

@case("q_cls")
def q_module_subclass_property_and_super_forward():
    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
        @property
        def scale(self):
            return 2.0
        def forward(self, x):
            return self.lin(x) * self.scale
    class Sub(Base):
        @property
        def scale(self):
            return super().scale + 1
        def forward(self, x):
            return super().forward(x) - 1
    m = Sub()
    return Program(m, ((t(2, 3),),))
