import functools, operator
import torch
from harness import case, fn_program, t, Program, kw

class Scale:
    factor = 2
    def __init__(self, w):
        self.w = w
    @property
    def doubled(self):
        return self.w * self.factor
    @doubled.setter
    def doubled(self, v):
        self.w = v / self.factor
    @classmethod
    def make(cls, v):
        return cls(v + 1)
    @staticmethod
    def helper(v):
        return v - 1

class Lazy:
    def __init__(self):
        self.store = {}
    def __getattr__(self, name):
        if name.startswith("p_"):
            return len(name)
        raise AttributeError(name)

class Typed:
    def __set_name__(self, owner, name):
        self.name = "_" + name
    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return getattr(obj, self.name) * 10
    def __set__(self, obj, value):
        setattr(obj, self.name, value + 1)

class HasTyped:
    v = Typed()
    def __init__(self, v):
        self.v = v

class Vec:
    def __init__(self, t):
        self.t = t
    def __add__(self, o):
        return Vec(self.t + o.t)
    def __mul__(self, k):
        return Vec(self.t * k)
    __rmul__ = __mul__
    def __len__(self):
        return self.t.shape[0]
    def __getitem__(self, i):
        return self.t[i]
    def __eq__(self, o):
        return isinstance(o, Vec) and self.t.shape == o.t.shape
    def __bool__(self):
        return self.t.numel() > 0

class Base:
    def run(self, x):
        return x + 1
class Child(Base):
    def run(self, x):
        return super().run(x) * 2
class Grand(Child):
    def run(self, x):
        return super().run(x) - 3

@case("objects")
def o_property_get_and_set():
    def f(x):
        s = Scale(x)
        a = s.doubled
        s.doubled = x * 8
        return a, s.w
    return fn_program(f, (t(2),))

@case("objects")
def o_classmethod_staticmethod():
    def f(x):
        s = Scale.make(x)
        return Scale.helper(s.w), s.helper(x), type(s).__name__
    return fn_program(f, (t(2),))

@case("objects")
def o_class_attribute_changed_between_calls():
    class K:
        scale = 2
    def f(x):
        return x * K.scale
    def between(s, i):
        K.scale = 5
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("objects")
def o_instance_attr_shadow_class_attr():
    class K:
        val = 1
    k = K()
    def f(x):
        return x * k.val
    def between(s, i):
        k.val = 9
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("objects")
def o_getattr_fallback():
    def f(x, o):
        return x * o.p_abc, hasattr(o, "q"), getattr(o, "q", 5)
    return fn_program(f, (t(2), Lazy()))

@case("objects")
def o_data_descriptor_set_name():
    def f(x):
        h = HasTyped(x)
        h.v = x * 2
        return h.v, h._v
    return fn_program(f, (t(2),))

@case("objects")
def o_dunder_arith_and_len():
    def f(x):
        v = Vec(x) + Vec(x * 2)
        w = 3 * v
        return w.t, len(w), w[0], v == w, bool(v)
    return fn_program(f, (t(3),))

@case("objects")
def o_super_chain_three_levels():
    def f(x):
        return Grand().run(x), Child().run(x)
    return fn_program(f, (t(2),))

@case("objects")
def o_isinstance_and_issubclass_hierarchy():
    def f(x, o):
        r = x
        if isinstance(o, Child):
            r = r + 1
        if isinstance(o, (int, Base)):
            r = r * 2
        return r, issubclass(type(o), Base)
    return fn_program(f, (t(2), Grand()), (t(2), Base()), (t(2), 3))

@case("objects")
def o_object_attr_mutated_in_frame_visible():
    class S:
        pass
    s = S()
    s.count = 0
    def f(x):
        s.count += 1
        s.last = x * 2
        return x + s.count
    return fn_program(f, (t(2),), (t(2),), observe=lambda: (s.count, s.last))

@case("objects")
def o_setattr_getattr_dynamic_names():
    class S:
        pass
    def f(x):
        s = S()
        for i, n in enumerate(["a", "b", "c"]):
            setattr(s, n, x * i)
        return sum(getattr(s, n) for n in "abc"), sorted(vars(s))
    return fn_program(f, (t(2),))

@case("objects")
def o_delattr_then_hasattr():
    class S:
        pass
    def f(x):
        s = S()
        s.a = x
        delattr(s, "a")
        return x + hasattr(s, "a")
    return fn_program(f, (t(2),))

@case("objects")
def o_call_dunder_object():
    class Affine:
        def __init__(self, a, b):
            self.a, self.b = a, b
        def __call__(self, v):
            return v * self.a + self.b
    aff = Affine(2.0, 1.0)
    def f(x):
        return aff(x), Affine(3, 0)(x)
    return fn_program(f, (t(2),))

@case("objects")
def o_iter_protocol_user_class():
    class R:
        def __init__(self, n):
            self.n = n
        def __iter__(self):
            return iter(range(self.n))
    def f(x):
        return sum(x * i for i in R(4))
    return fn_program(f, (t(2),))

@case("objects")
def o_contains_dunder():
    class Bag:
        def __contains__(self, k):
            return k % 2 == 0
    def f(x):
        b = Bag()
        return x + (4 in b) + (3 in b)
    return fn_program(f, (t(2),))

@case("objects")
def o_slots_class():
    class P:
        __slots__ = ("a", "b")
        def __init__(self, a, b):
            self.a = a
            self.b = b
    def f(x):
        p = P(x, 2)
        p.b = 3
        return p.a * p.b
    return fn_program(f, (t(2),))

@case("objects")
def o_method_bound_passed_around():
    class K:
        def __init__(self, k):
            self.k = k
        def mul(self, v):
            return v * self.k
    def f(x):
        m = K(3).mul
        return list(map(m, [x, x + 1])), m.__self__.k
    return fn_program(f, (t(2),))

@case("objects")
def o_class_counter_incremented_in_init():
    class K:
        made = 0
        def __init__(self):
            K.made += 1
    def f(x):
        K(); K()
        return x * K.made
    return fn_program(f, (t(2),), (t(2),), observe=lambda: K.made)

@case("objects")
def o_type_call_and_class_compare():
    def f(x, o):
        c = type(o)
        return x + (c is Child), c.__name__, o.__class__ is Grand
    return fn_program(f, (t(2), Grand()), (t(2), Child()))

@case("objects")
def o_getitem_with_slice_object():
    class Seq:
        def __getitem__(self, idx):
            if isinstance(idx, slice):
                return (idx.start, idx.stop, idx.step)
            return idx * 2
    def f(x):
        s = Seq()
        return x * s[3], s[1:5:2]
    return fn_program(f, (t(2),))

@case("objects")
def o_repr_str_user():
    class P:
        def __init__(self, v):
            self.v = v
        def __repr__(self):
            return f"P({self.v})"
    def f(x):
        return x + 1, repr(P(3)), str(P(4))
    return fn_program(f, (t(2),))

@case("objects")
def o_dunder_lt_and_sorted():
    class P:
        def __init__(self, k, t):
            self.k, self.t = k, t
        def __lt__(self, o):
            return self.k < o.k
    def f(x):
        ps = [P(3, x), P(1, x * 2), P(2, x * 3)]
        return sorted(ps)[0].t, max(ps).k
    return fn_program(f, (t(2),))

@case("objects")
def o_mixin_multiple_inheritance_mro():
    class A:
        def who(self):
            return ["A"]
    class B(A):
        def who(self):
            return ["B"] + super().who()
    class C(A):
        def who(self):
            return ["C"] + super().who()
    class D(B, C):
        def who(self):
            return ["D"] + super().who()
    def f(x):
        w = D().who()
        return x * len(w), w
    return fn_program(f, (t(2),))

@case("objects")
def o_init_subclass_hook():
    REG = []
    class Base2:
        def __init_subclass__(cls, **kw):
            REG.append(cls.__name__)
    class Sub(Base2):
        pass
    def f(x):
        return x * len(REG), REG[0]
    return fn_program(f, (t(2),))

@case("objects")
def o_property_raises_attribute_error_to_getattr():
    class P:
        @property
        def thing(self):
            raise AttributeError("no")
        def __getattr__(self, name):
            return 42
    def f(x):
        return x + P().thing
    return fn_program(f, (t(2),))

@case("objects")
def o_object_holds_tensor_updated_inplace():
    class Acc:
        def __init__(self):
            self.total = torch.zeros(2)
        def add(self, v):
            self.total += v
            return self.total
    a = Acc()
    def f(x):
        return a.add(x) * 1
    return fn_program(f, (t(2),), (t(2),), observe=lambda: a.total)

@case("objects")
def o_abstract_method_implemented():
    import abc
    class Op(abc.ABC):
        @abc.abstractmethod
        def apply(self, v): ...
        def twice(self, v):
            return self.apply(self.apply(v))
    class Neg(Op):
        def apply(self, v):
            return -v + 1
    def f(x):
        return Neg().twice(x), isinstance(Neg(), Op)
    return fn_program(f, (t(2),))

@case("objects")
def o_enum_members_branch():
    import enum
    class Mode(enum.Enum):
        A = 1
        B = 2
    def f(x, m):
        if m is Mode.A:
            return x + m.value
        return x * m.value, m.name
    return fn_program(f, (t(2), Mode.A), (t(2), Mode.B))

@case("objects")
def o_int_enum_arith():
    import enum
    class Lvl(enum.IntEnum):
        LO = 1
        HI = 5
    def f(x):
        return x * (Lvl.HI - Lvl.LO), Lvl.HI > 3
    return fn_program(f, (t(2),))

@case("objects")
def o_getattribute_via_object():
    class P:
        def __init__(self):
            self.a = 3
    def f(x):
        p = P()
        return x * object.__getattribute__(p, "a")
    return fn_program(f, (t(2),))

@case("objects")
def o_object_setattr_on_frozen_dataclass():
    import dataclasses
    @dataclasses.dataclass(frozen=True)
    class F:
        v: torch.Tensor
    def f(x):
        o = F(x)
        object.__setattr__(o, "v", x + 5)
        return o.v
    return fn_program(f, (t(2),))

@case("objects")
def o_frozen_dataclass_assign_raises():
    import dataclasses
    @dataclasses.dataclass(frozen=True)
    class F:
        v: int
    def f(x):
        o = F(1)
        try:
            o.v = 2
        except dataclasses.FrozenInstanceError:
            return x - 1
        return x + 1
    return fn_program(f, (t(2),))

@case("objects")
def o_hash_eq_user_keys_in_dict():
    class Key:
        def __init__(self, k):
            self.k = k
        def __hash__(self):
            return hash(self.k)
        def __eq__(self, o):
            return self.k == o.k
    def f(x):
        d = {Key(1): x, Key(2): x * 2}
        return d[Key(2)] + d.get(Key(1))
    return fn_program(f, (t(2),))
