"""Objects passed in whose class-level behaviour changes between calls (the kinds test_misc and
test_input_attr_tracking exercise; written here, not copied): instance attributes shadowing class
attributes and back, methods replaced on the instance or the class, an object's __class__ swapped,
properties and __getattr__ over state that changes, objects hashed by value as dict keys, and ids
kept across calls. The harness is test_dynfunctions_programs.py; `case` as in
dynfunctions_programs_a.py.
"""
# ruff: noqa
# mypy: ignore-errors

import torch

LOG: list = []
RESETS: list = []
PROGRAMS: list = []


def case(mk=None, n=3):
    mk = mk or (lambda i: (torch.randn(3),))
    def d(f):
        PROGRAMS.append((f.__name__, f, mk, n))
        return f
    return d


def state():
    """The GV_* globals; the id-keyed table by its size and values (ids differ between runs)."""
    out = {k: v for k, v in globals().items() if k.startswith("GV_") and k not in ("GV_CACHE", "GV_SEEN", "GV_IDS")}
    out["GV_IDS"] = dict(globals().get("GV_IDS", {}))
    out["cache"] = sorted((v.sum().item() if isinstance(v, torch.Tensor) else v) for v in globals().get("GV_CACHE", {}).values())
    out["seen"] = len(globals().get("GV_SEEN", ()))
    return out


GV_IDS: dict = {}
RESETS.append(GV_IDS.clear)


class Layer:
    scale = 2

    def __init__(self):
        self.w = torch.ones(3)

    def forward(self, t):
        return t * self.w * self.scale

    @property
    def double_w(self):
        return self.w * 2

    def __getattr__(self, name):
        if name == "virtual":
            return self.scale + 100
        raise AttributeError(name)


class Other(Layer):
    scale = 5

    def forward(self, t):
        return t - self.scale


def _reset_layer():
    Layer.scale = 2
    Layer.forward = _LAYER_FORWARD


_LAYER_FORWARD = Layer.forward
RESETS.append(_reset_layer)


def _shadowing(i):
    layer = Layer()
    if i == 1:
        layer.scale = 7  # an instance attribute shadows the class's
    return (torch.randn(3), layer)


@case(_shadowing)
def ob_instance_shadows_class_attr(x, layer):
    return layer.forward(x), layer.scale


def _class_attr_changed(i):
    Layer.scale = [2, 3, 2][i]
    return (torch.randn(3), Layer())


@case(_class_attr_changed)
def ob_class_attr_changed_between(x, layer):
    return layer.forward(x)


def _method_on_instance(i):
    layer = Layer()
    if i == 1:
        layer.forward = lambda t: t + 1000
    return (torch.randn(3), layer)


@case(_method_on_instance)
def ob_method_replaced_on_instance(x, layer):
    return layer.forward(x)


def _method_on_class(i):
    Layer.forward = (lambda self, t: t * 0 + i) if i == 2 else _LAYER_FORWARD
    return (torch.randn(3), Layer())


@case(_method_on_class)
def ob_method_replaced_on_class(x, layer):
    return layer.forward(x)


def _class_swapped(i):
    layer = Layer()
    if i == 1:
        layer.__class__ = Other
    return (torch.randn(3), layer)


@case(_class_swapped)
def ob_dunder_class_swapped(x, layer):
    return layer.forward(x), type(layer).__name__, isinstance(layer, Other)


def _w_changed(i):
    layer = Layer()
    layer.w = torch.full((3,), float(i))
    return (torch.randn(3), layer)


@case(_w_changed)
def ob_property_over_changing_state(x, layer):
    return x + layer.double_w


@case(_shadowing)
def ob_getattr_fallback_reads_class(x, layer):
    return x * layer.virtual


class Key:
    def __init__(self, k):
        self.k = k

    def __hash__(self):
        return hash(self.k)

    def __eq__(self, other):
        return isinstance(other, Key) and other.k == self.k


def _keyed(i):
    return (torch.randn(3), {Key(1): 10, Key(2): 20}, Key(1 + i % 2))


@case(_keyed)
def ob_value_hashed_key_lookup(x, table, key):
    return x * table[key]


def _same_or_new(i):
    t = torch.randn(3)
    return (t, t if i != 1 else torch.randn(3))


@case(_same_or_new)
def ob_ids_kept_across_calls(x, y):
    GV_IDS[len(GV_IDS)] = id(x) == id(y)
    return x + y, x is y


_SHARED = Layer()


@case(lambda i: (torch.randn(3), _SHARED if i != 1 else Layer()))
def ob_is_global_object(x, layer):
    if layer is _SHARED:
        return x + 1
    return x - 1


@case(lambda i: (torch.randn(3), [Layer, Other, Layer][i]))
def ob_class_passed_in(x, cls):
    obj = cls()
    return obj.forward(x), cls.__name__


@case(lambda i: (torch.randn(3), [int, float, int][i]))
def ob_builtin_type_passed_in(x, typ):
    return x * typ(2.5), typ is int


def _dict_attr(i):
    layer = Layer()
    layer.__dict__["extra"] = i
    return (torch.randn(3), layer)


@case(_dict_attr)
def ob_attr_set_through_dict(x, layer):
    return x * layer.extra


def _deleted_attr(i):
    layer = Layer()
    if i == 1:
        del layer.w
    return (torch.randn(3), layer)


@case(_deleted_attr)
def ob_attr_deleted_between(x, layer):
    try:
        return x * layer.w
    except AttributeError:
        return x


# ---------------------------------------------------------------- ids and hashes of inputs kept in module tables
GV_CACHE: dict = {}
GV_SEEN: set = set()
RESETS.append(GV_CACHE.clear)
RESETS.append(GV_SEEN.clear)
_KEPT = torch.randn(3)
_KEPT_OBJ = Layer()


def _kept_then_new(i):
    return (_KEPT if i < 2 else torch.randn(3),)


def _kept_obj_then_new(i):
    return (torch.ones(3), _KEPT_OBJ if i != 1 else Layer())


@case(_kept_then_new, 3)
def ih_memo_by_id(x):
    key = id(x)
    if key in GV_CACHE:
        return GV_CACHE[key] + 1
    GV_CACHE[key] = x * 2
    return GV_CACHE[key]


@case(_kept_obj_then_new, 3)
def ih_object_memo_by_id(x, layer):
    key = id(layer)
    hit = key in GV_CACHE
    GV_CACHE.setdefault(key, layer.forward(x))
    return GV_CACHE[key] * (2 if hit else 1), hit


@case(_kept_obj_then_new, 3)
def ih_object_seen_set(x, layer):
    first = layer not in GV_SEEN
    GV_SEEN.add(layer)
    return x * (1 if first else -1), len(GV_SEEN)


@case(_kept_then_new, 3)
def ih_tensor_seen_set(x):
    first = x not in GV_SEEN
    GV_SEEN.add(x)
    return x + (10 if first else 0)


@case(_kept_obj_then_new, 3)
def ih_hash_of_object_compared(x, layer):
    return x * (hash(layer) == hash(_KEPT_OBJ))


@case(_kept_obj_then_new, 3)
def ih_is_comparison_kept(x, layer):
    return x + (layer is _KEPT_OBJ), layer == _KEPT_OBJ


# ---------------------------------------------------------------- descriptors and hooks of objects passed in
class _Lazy:
    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.fn.__name__] = value
        return value


class Holder:
    def __init__(self, t):
        self.t = t
        self._scale = 1
        self.sets = 0

    @_Lazy
    def squared(self):
        return self.t * self.t

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, v):
        if v <= 0:
            raise ValueError("scale must be positive")
        self._scale = v


class Counting(Holder):
    def __setattr__(self, name, value):
        object.__setattr__(self, "sets", self.__dict__.get("sets", 0) + 1)
        object.__setattr__(self, name, value)


_HELD = Holder(torch.ones(3))


def _reset_held():
    _HELD.__dict__.clear()
    _HELD.__init__(torch.ones(3))


RESETS.append(_reset_held)


@case(lambda i: (torch.randn(3), _HELD), 3)
def ds_lazy_descriptor_on_input(x, h):
    return x + h.squared, "squared" in h.__dict__


@case(lambda i: (torch.randn(3), Holder(torch.ones(3)), [2, -1, 3][i]), 3)
def ds_property_setter_on_input(x, h, v):
    try:
        h.scale = v
    except ValueError as e:
        return x, str(e), h.scale
    return x * h.scale


@case(lambda i: (torch.randn(3), Counting(torch.ones(3))), 2)
def ds_setattr_override_on_input(x, c):
    c.a = 1
    c.b = x
    return c.b * c.a, c.sets


class _Base2:
    @property
    def kind(self):
        return "base"

    @classmethod
    def build(cls, t):
        obj = cls()
        obj.t = t
        return obj


class _Sub2(_Base2):
    @property
    def kind(self):
        return "sub+" + super().kind

    @classmethod
    def build(cls, t):
        obj = super().build(t * 2)
        obj.extra = True
        return obj


@case(lambda i: (torch.randn(3),), 2)
def ds_super_property_and_classmethod(x):
    o = _Sub2.build(x)
    return o.t, o.kind, o.extra, type(o).__name__


class _Strict:
    def __init__(self):
        self.known = 2

    def __getattr__(self, name):
        raise KeyError(f"no {name}")


@case(lambda i: (torch.randn(3), _Strict()), 2)
def ds_getattr_raises_other_error(x, s):
    try:
        return s.unknown
    except KeyError as e:
        return x * s.known, str(e)
