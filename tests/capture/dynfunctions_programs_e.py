"""Programs where side effects meet exceptions, caches and formatting (the kinds test_misc and
test_functions exercise; written here, not copied): writes to inputs, globals and objects before an
exception leaves the frame, lru_cache'd helpers called with tensors, functools.wraps metadata,
format strings that read attributes, objects built in the frame and returned with their state.
The harness is test_dynfunctions_programs.py; `case` as in dynfunctions_programs_a.py.
"""
# ruff: noqa
# mypy: ignore-errors

import dataclasses
import functools

import torch

LOG: list = []
RESETS: list = []
PROGRAMS: list = []


def case(mk=None, n=2):
    mk = mk or (lambda i: (torch.randn(3),))
    def d(f):
        PROGRAMS.append((f.__name__, f, mk, n))
        return f
    return d


def state():
    """The GV_* globals, and the attributes of the functions the fa_ programs write."""
    out = {k: v for k, v in globals().items() if k.startswith("GV_")}
    for fn in (_counted_helper, _self_counting, _decorated_counted):
        out[fn.__name__ if fn is not _counted_helper else "_counted_helper"] = (
            {k: v for k, v in fn.__dict__.items() if k != "__wrapped__"}, fn.__name__, fn.__qualname__, fn.__doc__,
            "__wrapped__" in fn.__dict__)
    return out


GV_N = 0
GV_L: list = []


def _reset():
    global GV_N, GV_L
    GV_N, GV_L = 0, []


RESETS.append(_reset)


class Obj:
    def __init__(self, t=None):
        self.t = t
        self.k = 1


def _obj(i):
    return (torch.randn(3), Obj(torch.randn(3)))


# ---------------------------------------------------------------- side effects, then an exception leaves
@case(_obj)
def se_attr_then_raise(x, o):
    o.k = 5
    o.t = x * 2
    raise ValueError("after writes")


@case()
def se_global_then_raise(x):
    global GV_N
    GV_N = 7
    GV_L.append(x + 1)
    raise KeyError("k")


@case(lambda i: (torch.randn(3), [1, 2]))
def se_list_arg_then_raise(x, lst):
    lst.append(3)
    lst[0] = x
    raise RuntimeError("list changed")


@case(lambda i: (torch.randn(3), {"a": 1}))
def se_dict_arg_then_raise(x, d):
    d["b"] = x
    del d["a"]
    return d["a"]


@case()
def se_inplace_input_then_raise(x):
    x.add_(1)
    raise ValueError("inplace")


@case()
def se_tensor_attr_then_raise(x):
    x.tag = "t"
    raise ValueError("tagged")


@case(_obj)
def se_attr_then_raise_in_callee(x, o):
    def callee(obj):
        obj.k = 9
        return {}["missing"]
    o.t = x + 1
    return callee(o)


@case(_obj)
def se_writes_then_caught_then_more(x, o):
    try:
        o.k = 2
        raise ValueError
    except ValueError:
        o.k += 1
    return x * o.k


@case()
def se_log_then_raise(x):
    LOG.append(x.sum())
    LOG.append("two")
    raise IndexError("idx")


@case(_obj)
def se_attr_then_torch_error(x, o):
    o.k = 3
    return x.view(4)


@case(_obj)
def se_attr_then_assert(x, o):
    o.k = 11
    assert x.shape[0] == 5, "shape"
    return x


# ---------------------------------------------------------------- lru_cache / cache with tensors and objects
@functools.lru_cache(maxsize=None)
def _cached_tensor_fn(t):
    LOG.append("computed")
    return t * 2


RESETS.append(_cached_tensor_fn.cache_clear)


@case()
def lc_tensor_arg_twice(x):
    return _cached_tensor_fn(x) + _cached_tensor_fn(x)


@functools.lru_cache(maxsize=2)
def _cached_small(n):
    LOG.append(("small", n))
    return n + 1


RESETS.append(_cached_small.cache_clear)


@case(lambda i: (torch.randn(3), i % 2))
def lc_small_cache_eviction(x, k):
    return x * (_cached_small(k) + _cached_small(5) + _cached_small(6) + _cached_small(k))


@case()
def lc_cache_info(x):
    _cached_small(1)
    _cached_small(1)
    info = _cached_small.cache_info()
    return x * info.hits, info.currsize


@case()
def lc_cached_property(x):
    class C:
        def __init__(self, t):
            self.t = t

        @functools.cached_property
        def heavy(self):
            LOG.append("heavy")
            return self.t.sum()
    c = C(x)
    return c.heavy + c.heavy, "heavy" in c.__dict__


# ---------------------------------------------------------------- functools.wraps metadata
def _deco(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k) + 1
    wrapper.extra = "x"
    return wrapper


@case()
def fw_wrapper_metadata(x):
    @_deco
    def inner(t):
        """doc of inner"""
        return t * 2
    return inner(x), inner.__name__, inner.__doc__, inner.extra, inner.__wrapped__(x)


@case()
def fw_wrapper_returned(x):
    @_deco
    def inner(t):
        return t * 3
    return inner


@case()
def fw_update_wrapper(x):
    def a(t):
        return t

    def b(t):
        return a(t) * 2
    functools.update_wrapper(b, a)
    return b(x), b.__name__, b.__wrapped__ is a


@case()
def fw_partial_attrs(x):
    p = functools.partial(torch.add, x, alpha=2)
    return p(x), p.args[0] is x, sorted(p.keywords), p.func is torch.add


@case()
def fw_partialmethod(x):
    class C:
        def scale(self, t, k):
            return t * k
        double = functools.partialmethod(scale, k=2)
    return C().double(x)


@case()
def fw_singledispatch(x):
    @functools.singledispatch
    def f(v):
        return "other"

    @f.register
    def _(v: int):
        return "int"
    return f(3), f("s"), x + 1


# ---------------------------------------------------------------- formatting that reads attributes and values
@case()
def fm_format_attribute_field(x):
    return "{0.shape}-{0.dtype}".format(x), x + 1


@case()
def fm_format_index_field(x):
    return "{0[1]}|{d[k]}".format([5, 6], d={"k": 7}), x * 2


@case()
def fm_format_tensor_value(x):
    return "{:.2f}".format(x.sum().item()), x


@case()
def fm_fstring_tensor(x):
    y = torch.tensor([1.0, 2.0])
    return f"{y}", x * 2


@case()
def fm_percent_tuple_shape(x):
    return "%s and %r" % (tuple(x.shape), "q"), x + 1


@case()
def fm_format_map(x):
    return "{a}-{b}".format_map({"a": 1, "b": x.shape[0]}), x


@case()
def fm_fstring_nested_spec(x):
    w = x.shape[0] + 4
    return f"{'v':>{w}}|{3.14159:.{x.shape[0]}f}", x


@case()
def fm_str_methods_on_shape(x):
    s = "x".join(str(d) for d in x.shape)
    return s.center(9, "*"), s.zfill(5), s.partition("x"), x * 1


# ---------------------------------------------------------------- objects made in the frame, returned
@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    loss: object = None
    extras: dict = dataclasses.field(default_factory=dict)


@case()
def ob_dataclass_returned(x):
    o = Out(x * 2)
    o.extras["n"] = 3
    o.loss = o.logits.sum()
    return o


@case()
def ob_local_class_instance_returned(x):
    class Local:
        def __init__(self, t):
            self.t = t
            self.n = t.shape[0]
    return Local(x + 1)


@case()
def ob_slotted_returned(x):
    class S:
        __slots__ = ("a", "b")
    s = S()
    s.a = x * 3
    return s, hasattr(s, "b")


@case()
def ob_object_cycle_returned(x):
    a, b = Obj(x), Obj(x + 1)
    a.other, b.other = b, a
    return a.other.other is a, a.t + b.t


@case()
def ob_list_of_objects_mutated_after_append(x):
    objs = [Obj(x)]
    objs[0].k = 10
    objs.append(Obj(x * objs[0].k))
    return objs


@case()
def ob_closure_escapes_with_object(x):
    o = Obj(x)

    def bump():
        o.k += 1
        return o.t * o.k
    bump()
    return bump, o.k


@case(lambda i: (torch.randn(3), Obj()))
def ob_new_object_stored_on_input(x, holder):
    holder.child = Obj(x * 2)
    holder.child.k = 4
    return holder.child.t.sum()


@case()
def ob_global_list_of_new_objects(x):
    GV_L.append(Obj(x))
    GV_L[-1].k = len(GV_L)
    return x * GV_L[-1].k


@case(_obj)
def ob_input_object_replaced_attr_object(x, o):
    old = o.t
    o.t = Obj(x)
    return old * 2, o.t.k


# ---------------------------------------------------------------- attributes of functions from outside, written
def _counted_helper(t):
    return t + 1


def _reset_helper():
    _counted_helper.__dict__.clear()
    _counted_helper.calls = 0
    _counted_helper.__name__ = "_counted_helper"


RESETS.append(_reset_helper)


def _helper_state(i):
    return (torch.randn(3), _counted_helper)


@case(n=3)
def fa_global_function_counter(x):
    _counted_helper.calls += 1
    return _counted_helper(x) * _counted_helper.calls


@case(n=2)
def fa_global_function_tensor_attr(x):
    _counted_helper.cache = x * 2
    return _counted_helper.cache + 1


@case(_helper_state, 3)
def fa_function_argument_attr(x, fn):
    fn.seen = getattr(fn, "seen", 0) + 1
    return fn(x) * fn.seen


@case(n=2)
def fa_attr_written_read_in_callee(x):
    def reader():
        return _counted_helper.tag
    _counted_helper.tag = "t"
    return x, reader(), hasattr(_counted_helper, "tag")


@case(n=2)
def fa_attr_written_across_break(x):
    _counted_helper.step = 5
    print("", end="")
    return x * _counted_helper.step


@case(n=2)
def fa_attr_written_then_raise(x):
    _counted_helper.calls = 99
    raise ValueError("after a function attribute")


@case(n=2)
def fa_dunder_name_written(x):
    _counted_helper.__name__ = "renamed"
    return x + 1, _counted_helper.__name__


@case(n=2)
def fa_bound_method_attr_raises(x):
    o = Obj(x)
    try:
        o.__init__.flag = 1
    except AttributeError as e:
        return x, str(e)
    return x


@case(n=2)
def fa_builtin_function_attr_raises(x):
    try:
        len.flag = 1
    except AttributeError as e:
        return x * 2, str(e)
    return x


def _self_counting(t):
    _self_counting.n = getattr(_self_counting, "n", 0) + 1
    return t * _self_counting.n


RESETS.append(lambda: _self_counting.__dict__.clear())


@case(n=3)
def fa_function_counts_itself(x):
    return _self_counting(x) + _self_counting(x)


def _counting_deco(fn):
    @functools.wraps(fn)
    def wrapper(*a):
        wrapper.calls += 1
        return fn(*a)
    wrapper.calls = 0
    return wrapper


@_counting_deco
def _decorated_counted(t):
    return t * 3


RESETS.append(lambda: setattr(_decorated_counted, "calls", 0))


@case(n=3)
def fa_decorator_counts_calls(x):
    return _decorated_counted(x) + _decorated_counted.calls


@case(n=2)
def fa_attr_deleted_then_missing(x):
    _counted_helper.tmp = 1
    del _counted_helper.tmp
    return x * getattr(_counted_helper, "tmp", 5), hasattr(_counted_helper, "tmp")


@case(n=2)
def fa_existing_attr_deleted(x):
    del _counted_helper.calls
    try:
        return _counted_helper.calls
    except AttributeError as e:
        return x + 1, str(e)


@case(n=2)
def fa_delete_missing_raises(x):
    try:
        del _counted_helper.never_set
    except AttributeError as e:
        return x - 1, str(e)
    return x


@case(n=2)
def fa_delattr_builtin_on_function(x):
    _counted_helper.a = x
    delattr(_counted_helper, "a")
    _counted_helper.b = x.sum()
    return x * 2


@case(n=2)
def fa_update_wrapper_onto_outside_function(x):
    def source_fn(t):
        """the doc"""
        return t
    functools.update_wrapper(_counted_helper, source_fn, assigned=("__name__", "__qualname__", "__doc__"))
    return _counted_helper(x), _counted_helper.__name__, _counted_helper.__doc__, _counted_helper.__wrapped__(x)


@case(n=2)
def fa_name_set_to_non_string(x):
    try:
        _counted_helper.__name__ = 3
    except TypeError as e:
        return x * 3, str(e)
    return x


def _reset_helper_text():
    _counted_helper.__qualname__ = "_counted_helper"
    _counted_helper.__doc__ = None
    _counted_helper.__module__ = __name__


RESETS.append(_reset_helper_text)
