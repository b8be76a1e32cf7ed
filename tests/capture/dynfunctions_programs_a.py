"""Programs of the kinds PyTorch's Dynamo tests exercise in test_functions / test_unspec / test_global /
test_input_attr_tracking (written here, not copied): math and operator modules on tensors and sizes,
python scalars that change between calls, globals read and written, attributes set on and read from
the inputs. Compared by test_dynfunctions_programs.py with eager and with recorded graph counts.

Each program is registered by `case(make_args, calls)`: `make_args(i)` gives call i's arguments
(torch's seed is reset first); RESETS put the module's state back; `state()` is what the harness
compares after each call besides the arguments (the globals named GV_*).
"""
# ruff: noqa
# mypy: ignore-errors

import math
import operator

import torch

LOG: list = []
RESETS: list = []
PROGRAMS: list = []


def case(mk=None, n=2):
    mk = mk or (lambda i: (torch.randn(3, 4),))
    def d(f):
        PROGRAMS.append((f.__name__, f, mk, n))
        return f
    return d


def state():
    return {k: v for k, v in globals().items() if k.startswith("GV_")}


def _t(*shape):
    return lambda i: (torch.randn(*shape),)


# ---------------------------------------------------------------- math / operator on tensors and sizes
@case()
def mo_math_sqrt_size(x):
    return x * math.sqrt(x.size(0)) + math.floor(x.shape[1] / 3)


@case()
def mo_math_ceil_log(x):
    n = x.numel()
    return x / math.ceil(math.log2(n)), math.ceil(n / 5)


@case(lambda i: (torch.randn(2 + i, 4),), 3)
def mo_math_size_changing(x):
    return x * math.prod(x.shape), math.gcd(x.shape[0], 4)


@case()
def mo_math_pi_exp(x):
    return x * math.pi + math.exp(1.0) - math.cos(0.5)


@case()
def mo_math_isclose(x):
    if math.isclose(x.shape[0] / 3, 1.0):
        return x + 1
    return x - 1


@case()
def mo_math_inf_nan(x):
    return x.clamp(-math.inf, 1.0), math.isinf(math.inf), math.isnan(float("nan"))


@case()
def mo_math_trunc_copysign(x):
    return x * math.trunc(2.7) * math.copysign(1.0, -3.0)


@case()
def mo_math_comb_perm(x):
    return x * math.comb(x.shape[1], 2) + math.perm(3, 2) + math.factorial(4)


@case()
def mo_math_fsum_hypot(x):
    return x * math.fsum([0.1, 0.2, 0.3]) + math.hypot(3, 4)


@case()
def mo_math_radians(x):
    return torch.sin(x * math.radians(30.0)) + math.degrees(math.pi)


@case()
def mo_operator_add_mul(x):
    return operator.add(x, 1), operator.mul(x, x), operator.truediv(x, 2), operator.neg(x)


@case()
def mo_operator_itemgetter(x):
    g = operator.itemgetter(0, 2)
    return g(x), operator.itemgetter(1)([x, x + 1])


@case()
def mo_operator_attrgetter(x):
    return operator.attrgetter("shape")(x), operator.attrgetter("T")(x) + 0


@case()
def mo_operator_methodcaller(x):
    return operator.methodcaller("sum", 1)(x), operator.methodcaller("view", -1)(x)


@case()
def mo_operator_inplace(x):
    y = x.clone()
    y = operator.iadd(y, 1)
    y = operator.imul(y, 2)
    return y


@case()
def mo_operator_inplace_input(x):
    operator.iadd(x, 1)
    return x * 2


@case()
def mo_operator_compare(x):
    return operator.lt(x, 0), operator.ge(x.shape[0], 3), operator.eq(x.shape, (3, 4))


@case()
def mo_operator_getitem_setitem(x):
    y = x.clone()
    operator.setitem(y, 0, 5.0)
    return operator.getitem(y, slice(0, 2)), operator.contains([1, 2], 2)


@case()
def mo_operator_index_floordiv(x):
    return x * operator.index(3) + operator.floordiv(x.shape[1], 3) + operator.mod(x.shape[1], 3)


@case()
def mo_operator_pow_abs(x):
    return operator.pow(x, 2), operator.abs(x), operator.matmul(x, x.t())


@case()
def mo_operator_truth_not(x):
    return x * operator.truth([1]) + operator.not_(0)


@case()
def mo_operator_and_or_xor(x):
    b = x > 0
    return operator.and_(b, x < 1), operator.or_(b, x < -1), operator.xor(b, b), operator.invert(b)


@case()
def mo_operator_lshift_sizes(x):
    return x * operator.lshift(1, x.shape[0]) + operator.rshift(x.shape[1], 1)


@case()
def mo_functools_reduce_operator(x):
    import functools
    return functools.reduce(operator.add, [x, x * 2, x * 3]), functools.reduce(operator.mul, x.shape, 1)


@case()
def mo_sym_divmod(x):
    q, r = divmod(x.shape[1], 3)
    return x * q + r


@case()
def mo_round_abs_size(x):
    return x * round(x.shape[0] / 2) + abs(-x.shape[1]), round(2.567, 2)


@case()
def mo_min_max_size(x):
    return x[: min(x.shape[0], 2)], max(x.shape) * x.sum()


@case()
def mo_pow_float_size(x):
    return x * (x.shape[0] ** 0.5) + 2 ** x.shape[1]


@case()
def mo_int_float_conv(x):
    return x * float(x.shape[0]) + int(2.9) + int("3") + float("1.5")


@case()
def mo_math_floor_tensor_item(x):
    return math.floor(x.sum().item()) if False else x.sum() // 1


@case()
def mo_operator_on_sym_list(x):
    dims = list(map(operator.mul, x.shape, (2, 3)))
    return x.repeat(2, 3).shape == torch.Size(dims), dims


# ---------------------------------------------------------------- python scalars changing between calls
@case(lambda i: (torch.randn(3), i + 1), 3)
def us_int_changes(x, n):
    return x * n + n


@case(lambda i: (torch.randn(3), 0.5 + i), 3)
def us_float_changes(x, s):
    return x * s


@case(lambda i: (torch.randn(3), [1, 2, 5][i]), 3)
def us_int_branch(x, n):
    if n > 1:
        return x + n
    return x - n


@case(lambda i: (torch.randn(3), i + 2), 3)
def us_int_range(x, n):
    out = x
    for _ in range(n):
        out = out * 2
    return out


@case(lambda i: (torch.randn(6), i + 1), 3)
def us_int_slice(x, n):
    return x[:n], x[n:]


@case(lambda i: (torch.randn(3), i + 2), 3)
def us_int_shape(x, n):
    return torch.zeros(n) + 1, x.new_ones(n, 2)


@case(lambda i: (torch.randn(3), 1.5 * (i + 1)), 3)
def us_float_math(x, s):
    return x * math.sqrt(s) + math.floor(s)


@case(lambda i: (torch.randn(3), 2, 0.25 * (i + 1)), 3)
def us_int_float_pair(x, n, f):
    return x * n * f, n * f


@case(lambda i: (torch.randn(3), i + 3), 3)
def us_int_returned(x, n):
    return x, n * 2, n // 2, n % 2, -n


@case(lambda i: (torch.randn(3), float(i) + 0.5), 3)
def us_float_returned(x, s):
    return x + 1, s * 3, s / 2, s ** 2


@case(lambda i: (torch.randn(3), i + 1), 3)
def us_int_torch_tensor(x, n):
    return x + torch.tensor(n), torch.tensor([n, n + 1])


@case(lambda i: (torch.randn(3), True if i % 2 == 0 else False), 3)
def us_bool_changes(x, flag):
    return x + 1 if flag else x - 1


@case(lambda i: (torch.randn(3), None if i == 1 else 2), 3)
def us_none_or_int(x, n):
    if n is None:
        return x
    return x * n


@case(lambda i: (torch.randn(3), i + 1), 3)
def us_int_in_list_index(x, n):
    lst = [x, x + 1, x + 2, x + 3]
    return lst[n]


@case(lambda i: (torch.randn(3), 10 * (i + 1)), 3)
def us_int_to_str(x, n):
    return x + n, str(n), f"{n}-{n + 1}"


@case(lambda i: (torch.randn(3), 0.1 * (i + 1)), 3)
def us_float_to_str(x, s):
    return x * s, f"{s:.2f}"


@case(lambda i: (torch.randn(3), [0.5, 0.5, 2.0][i]), 3)
def us_float_same_then_diff(x, s):
    return x * s


@case(lambda i: (torch.randn(3), (i + 1, i + 2)), 3)
def us_tuple_of_ints(x, t):
    return x * t[0] + t[1]


@case(lambda i: (torch.randn(3), {"a": i + 1}), 3)
def us_dict_int_value(x, d):
    return x * d["a"]


@case(lambda i: (torch.randn(3), i), 3)
def us_int_zero_one(x, n):
    return x * n + 1


@case(lambda i: (torch.randn(3), -i - 1), 3)
def us_negative_int(x, n):
    return x * n, abs(n), n < 0


@case(lambda i: (torch.randn(3), 2 ** (i + 3)), 3)
def us_int_pow_log(x, n):
    return x * math.log2(n), n.bit_length()


@case(lambda i: (torch.randn(3), i + 1), 3)
def us_int_float_div(x, n):
    return x / n, 1 / n, n / 3


@case(lambda i: (torch.randn(3), float(i + 1)), 3)
def us_float_is_integer(x, s):
    return x * s, s.is_integer(), int(s)


@case(lambda i: (torch.randn(3), i + 1), 3)
def us_int_max_min(x, n):
    return x * max(n, 2) + min(n, 2)


# ---------------------------------------------------------------- globals read and written
GV_SCALE = 2.0
GV_COUNT = 0
GV_T = torch.ones(3)
GV_LIST: list = []
GV_DICT: dict = {}
GV_FLAG = True


def _reset_globals():
    global GV_SCALE, GV_COUNT, GV_T, GV_LIST, GV_DICT, GV_FLAG
    GV_SCALE = 2.0
    GV_COUNT = 0
    GV_T = torch.ones(3)
    GV_LIST = []
    GV_DICT = {}
    GV_FLAG = True


RESETS.append(_reset_globals)


@case(lambda i: (torch.randn(3),), 2)
def gl_read_float(x):
    return x * GV_SCALE


@case(lambda i: (torch.randn(3),), 3)
def gl_counter_incr(x):
    global GV_COUNT
    GV_COUNT += 1
    return x + GV_COUNT


@case(lambda i: (torch.randn(3),), 2)
def gl_tensor_read(x):
    return x + GV_T


@case(lambda i: (torch.randn(3),), 3)
def gl_tensor_rebound(x):
    global GV_T
    GV_T = GV_T + x
    return GV_T * 2


@case(lambda i: (torch.randn(3),), 2)
def gl_tensor_inplace(x):
    GV_T.add_(x)
    return x * 2


@case(lambda i: (torch.randn(3),), 3)
def gl_list_append_tensor(x):
    GV_LIST.append(x * 2)
    return len(GV_LIST)


@case(lambda i: (torch.randn(3),), 3)
def gl_dict_setitem(x):
    GV_DICT[len(GV_DICT)] = x.sum()
    return x * len(GV_DICT)


@case(lambda i: (torch.randn(3),), 3)
def gl_dict_counts(x):
    GV_DICT["n"] = GV_DICT.get("n", 0) + 1
    return x * GV_DICT["n"]


@case(lambda i: (torch.randn(3),), 3)
def gl_flag_toggle(x):
    global GV_FLAG
    GV_FLAG = not GV_FLAG
    return x + 1 if GV_FLAG else x - 1


@case(lambda i: (torch.randn(3),), 2)
def gl_new_name(x):
    global GV_NEW
    GV_NEW = x + 1
    return x


def _reset_new():
    globals().pop("GV_NEW", None)


RESETS.append(_reset_new)


@case(lambda i: (torch.randn(3),), 2)
def gl_rebind_float_then_use(x):
    global GV_SCALE
    GV_SCALE = GV_SCALE * 1.5
    return x * GV_SCALE


@case(lambda i: (torch.randn(3),), 2)
def gl_list_replace(x):
    global GV_LIST
    GV_LIST = [x, x + 1]
    return GV_LIST[1]


@case(lambda i: (torch.randn(3),), 2)
def gl_read_in_nested(x):
    def inner():
        return GV_SCALE * x
    return inner()


@case(lambda i: (torch.randn(3),), 2)
def gl_write_in_nested(x):
    def inner():
        global GV_COUNT
        GV_COUNT = GV_COUNT + 10
    inner()
    return x + GV_COUNT


@case(lambda i: (torch.randn(3),), 2)
def gl_dict_pop_update(x):
    GV_DICT.update(a=x, b=2)
    v = GV_DICT.pop("b")
    return GV_DICT["a"] * v


@case(lambda i: (torch.randn(3),), 2)
def gl_list_extend_clear(x):
    GV_LIST.extend([1, 2, 3])
    n = len(GV_LIST)
    GV_LIST.clear()
    return x * n


@case(lambda i: (torch.randn(3),), 2)
def gl_math_module_global(x):
    return x * math.e


@case(lambda i: (torch.randn(3),), 2)
def gl_del_then_missing(x):
    global GV_NEW
    GV_NEW = 1
    del GV_NEW
    try:
        return GV_NEW  # noqa: F821
    except NameError:
        return x + 1


@case(lambda i: (torch.randn(3),), 2)
def gl_tensor_global_attr(x):
    return x * GV_T.shape[0] + GV_T.dtype.is_floating_point


# ---------------------------------------------------------------- attributes on the inputs
def _with_attr(i):
    x = torch.randn(3)
    x.foo = 2 + i
    return (x,)


@case(_with_attr, 2)
def at_read_int_attr(x):
    return x * x.foo


def _with_tensor_attr(i):
    x = torch.randn(3)
    x.other = torch.randn(3)
    return (x,)


@case(_with_tensor_attr, 2)
def at_read_tensor_attr(x):
    return x * x.other


@case(lambda i: (torch.randn(3), torch.randn(3)), 2)
def at_set_tensor_attr(x, y):
    x.y = y
    return x * x.y


@case(lambda i: (torch.randn(3), [4, torch.randn(3)][i]), 2)
def at_set_changing_type(x, y):
    x.y = y
    return x * x.y


@case(lambda i: ([torch.randn(2) for _ in range(3)], torch.randn(2), 5), 2)
def at_set_in_loop(xs, y, z):
    for t in xs:
        t.a = y
        t.b = y * z
    acc = 1
    for t in xs:
        acc = t.a * acc + t.b
    return acc


@case(lambda i: (torch.randn(3),), 2)
def at_hasattr_missing(x):
    if hasattr(x, "nope"):
        return x
    return x + 1


@case(_with_attr, 2)
def at_getattr_default(x):
    return x * getattr(x, "foo", 1) + getattr(x, "bar", 10)


@case(lambda i: (torch.randn(3),), 2)
def at_set_then_del(x):
    x.tmp = 3
    v = x.tmp
    del x.tmp
    return x * v, hasattr(x, "tmp")


@case(_with_attr, 2)
def at_increment_attr(x):
    x.foo = x.foo + 1
    return x * x.foo


class Box:
    def __init__(self, v, k):
        self.v = v
        self.k = k


def _box(i):
    return (Box(torch.randn(3), i + 1),)


@case(_box, 3)
def at_object_attrs_changing(b):
    return b.v * b.k


@case(_box, 2)
def at_object_attr_written(b):
    b.k = b.k * 2
    b.v = b.v + 1
    b.new = "n"
    return b.v.sum()


@case(_box, 2)
def at_object_attr_list(b):
    b.hist = getattr(b, "hist", [])
    b.hist.append(b.v * 2)
    return len(b.hist)


def _obj_pair(i):
    b = Box(torch.randn(3), 2)
    return (b, b)


@case(_obj_pair, 2)
def at_aliased_objects(a, b):
    a.k = 7
    return b.v * b.k


@case(lambda i: (torch.randn(3),), 2)
def at_requires_grad_attr(x):
    x.requires_grad_(False)
    return x * 2, x.requires_grad


def _param_like(i):
    x = torch.randn(3)
    x.scale = torch.tensor(2.0 + i)
    x.label = "x%d" % i
    return (x,)


@case(_param_like, 2)
def at_tensor_attr_and_str(x):
    return x * x.scale, x.label + "!"


@case(lambda i: (torch.randn(3),), 2)
def at_dict_on_tensor(x):
    x.meta = {"n": 3}
    x.meta["n"] += 1
    return x * x.meta["n"]


@case(_box, 2)
def at_setattr_builtin(b):
    setattr(b, "k", 10)
    setattr(b, "z", b.v * 3)
    return getattr(b, "z") + b.k


@case(_box, 2)
def at_vars_of_obj(b):
    return sorted(vars(b)), b.v * len(b.__dict__)


@case(lambda i: (torch.randn(3), torch.randn(3)), 2)
def at_set_then_break(x, y):
    x.y = y * 2
    print("", end="")
    return x * x.y


@case(_box, 2)
def at_object_break_then_read(b):
    b.k = 5
    print("", end="")
    return b.v * b.k


# objects from outside that are one object on some calls and two on others (an attribute set
# through one path, read through the other: the graph of two objects must not answer for one)
def _alternating_pair(i):
    a = Box(torch.ones(3) * (i + 1), 2)
    return (a, a if i % 2 else Box(torch.ones(3), 2))


@case(_alternating_pair, 4)
def al_set_then_read_other(a, b):
    a.k = 7
    return b.v * b.k


@case(_alternating_pair, 4)
def al_setattr_builtin_then_read(a, b):
    setattr(a, "k", a.k + 5)
    return b.v + b.k


@case(_alternating_pair, 4)
def al_delattr_then_hasattr(a, b):
    a.extra = 1
    del a.extra
    b.extra2 = 3
    return a.v * getattr(a, "extra2", 0) + b.k


class Setter:
    def __init__(self, k):
        self.k = k

    def set(self, k):
        self.k = k


def _alternating_setters(i):
    a = Setter(2)
    return (torch.ones(3), a, a if i % 2 == 0 else Setter(2))


@case(_alternating_setters, 4)
def al_method_sets_read_other(x, a, b):
    a.set(10)
    return x * b.k


def _alternating_in_list(i):
    a = Box(torch.ones(3), 2)
    return ([a, a if i % 2 else Box(torch.ones(3), 2)],)


@case(_alternating_in_list, 4)
def al_objects_in_list(objs):
    objs[0].k = objs[0].k * 3
    return objs[1].v * objs[1].k


def _alternating_nested(i):
    inner = Box(torch.ones(3), 4)
    outer = Box(inner, 0)
    return (outer, inner if i % 2 else Box(torch.ones(3), 4))


@case(_alternating_nested, 4)
def al_nested_attribute_path(outer, other):
    outer.v.k = 1
    return other.v * other.k


@case(lambda i: (Box(torch.ones(3), 2),) * 2, 3)
def al_always_same_object(a, b):
    a.k = a.k + 1
    return b.v * b.k


@case(lambda i: (Box(torch.ones(3), 2), Box(torch.ones(3), 5)), 3)
def al_never_same_object(a, b):
    a.k = 9
    return b.v * b.k, a.k
