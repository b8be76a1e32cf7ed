"""Programs whose outside state changes between calls (the kind test_global, test_unspec and
test_input_attr_tracking exercise; written here, not copied): `make_args(i)` changes a module
global, a module-level dict or list, a class attribute, a closure cell, a function's defaults or a
persistent object's attributes before call i, and the program reads (or writes) that state; each
call must see the state eager sees. The harness is test_dynfunctions_programs.py; `case` as in
dynfunctions_programs_a.py.
"""
# ruff: noqa
# mypy: ignore-errors

import functools
import math

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
    return {k: v for k, v in globals().items() if k.startswith("GV_")}


GV_K = 1
GV_F = 0.5
GV_MODE = "add"
GV_CFG = {"scale": 2, "bias": torch.zeros(3), "on": True}
GV_ITEMS = [1, 2]
GV_T = torch.ones(3)
GV_FN = torch.relu


def _reset():
    global GV_K, GV_F, GV_MODE, GV_CFG, GV_ITEMS, GV_T, GV_FN
    GV_K, GV_F, GV_MODE = 1, 0.5, "add"
    GV_CFG = {"scale": 2, "bias": torch.zeros(3), "on": True}
    GV_ITEMS = [1, 2]
    GV_T = torch.ones(3)
    GV_FN = torch.relu


RESETS.append(_reset)


def _set(**kw):
    globals().update(kw)


@case(lambda i: (_set(GV_K=i + 2), torch.randn(3))[1:])
def ch_global_int(x):
    return x * GV_K


@case(lambda i: (_set(GV_F=0.25 * (i + 1)), torch.randn(3))[1:])
def ch_global_float(x):
    return x * GV_F


@case(lambda i: (_set(GV_MODE=["add", "mul", "add"][i]), torch.randn(3))[1:])
def ch_global_str_branch(x):
    return x + 1 if GV_MODE == "add" else x * 3


@case(lambda i: (GV_CFG.__setitem__("scale", i + 1), torch.randn(3))[1:])
def ch_global_dict_value(x):
    return x * GV_CFG["scale"] + GV_CFG["bias"]


@case(lambda i: (GV_CFG.__setitem__("on", i != 1), torch.randn(3))[1:])
def ch_global_dict_flag(x):
    if GV_CFG["on"]:
        return x.relu()
    return x


@case(lambda i: (GV_CFG.__setitem__("extra", i) if i else None, torch.randn(3))[1:])
def ch_global_dict_key_added(x):
    return x * GV_CFG.get("extra", 10), len(GV_CFG)


@case(lambda i: (GV_ITEMS.append(i), torch.randn(3))[1:])
def ch_global_list_grows(x):
    return x * len(GV_ITEMS) + sum(GV_ITEMS)


@case(lambda i: (_set(GV_T=torch.full((3,), float(i))), torch.randn(3))[1:])
def ch_global_tensor_replaced(x):
    return x + GV_T


@case(lambda i: (GV_T.fill_(float(i)), torch.randn(3))[1:])
def ch_global_tensor_filled(x):
    return x * GV_T


@case(lambda i: (_set(GV_FN=[torch.relu, torch.sigmoid, torch.tanh][i]), torch.randn(3))[1:])
def ch_global_function_swapped(x):
    return GV_FN(x)


@case(lambda i: (_set(GV_T=torch.ones(2 + i)), torch.randn(3))[1:])
def ch_global_tensor_shape_changes(x):
    return x.sum() * GV_T


@case(lambda i: (GV_CFG.__setitem__("bias", torch.ones(3) * i), torch.randn(3))[1:])
def ch_global_dict_tensor_replaced(x):
    GV_CFG["last"] = x.sum()
    return x + GV_CFG["bias"]


@case(lambda i: (_set(GV_K=i), torch.randn(3))[1:])
def ch_global_written_and_read(x):
    global GV_K
    GV_K = GV_K + 1
    return x * GV_K


class Config:
    depth = 2
    act = "relu"


def _reset_config():
    Config.depth, Config.act = 2, "relu"


RESETS.append(_reset_config)


@case(lambda i: (setattr(Config, "depth", i + 1), torch.randn(3))[1:])
def ch_class_attr_loop_count(x):
    for _ in range(Config.depth):
        x = x * 2
    return x


@case(lambda i: (setattr(Config, "act", ["relu", "sigmoid", "relu"][i]), torch.randn(3))[1:])
def ch_class_attr_getattr_torch(x):
    return getattr(torch, Config.act)(x)


class Model:
    def __init__(self):
        self.k = 1
        self.w = torch.ones(3)
        self.calls = 0
        self.hist = []


_MODEL = Model()


def _reset_model():
    _MODEL.__dict__.clear()
    _MODEL.__init__()


RESETS.append(_reset_model)


@case(lambda i: (setattr(_MODEL, "k", i + 1), torch.randn(3), _MODEL)[1:])
def ch_object_int_attr(x, m):
    return x * m.k


@case(lambda i: (setattr(_MODEL, "w", torch.randn(3)), torch.randn(3), _MODEL)[1:])
def ch_object_tensor_attr(x, m):
    return x * m.w


@case(lambda i: (torch.randn(3), _MODEL))
def ch_object_counter(x, m):
    m.calls += 1
    m.hist.append(m.calls)
    return x * m.calls


@case(lambda i: ((setattr(_MODEL, "opt", 3) if i == 1 else _MODEL.__dict__.pop("opt", None)), torch.randn(3), _MODEL)[1:])
def ch_object_attr_appears(x, m):
    if hasattr(m, "opt"):
        return x * m.opt
    return x


def _make_scaled():
    k = 1

    def scaled(t):
        return t * k

    def setk(v):
        nonlocal k
        k = v
    return scaled, setk


_SCALED, _SETK = _make_scaled()
RESETS.append(lambda: _SETK(1))


@case(lambda i: (_SETK(i + 2), torch.randn(3))[1:])
def ch_closure_cell_changes(x):
    return _SCALED(x) + 1


def _with_default(t, k=1):
    return t * k


RESETS.append(lambda: setattr(_with_default, "__defaults__", (1,)))


@case(lambda i: (setattr(_with_default, "__defaults__", (i + 3,)), torch.randn(3))[1:])
def ch_function_default_changes(x):
    return _with_default(x)


def _helper(t):
    return t + 1


_ORIG_HELPER_CODE = _helper.__code__
RESETS.append(lambda: setattr(_helper, "__code__", _ORIG_HELPER_CODE))


def _times_two(t):
    return t * 2


@case(lambda i: ((setattr(_helper, "__code__", _times_two.__code__) if i == 1 else
                  setattr(_helper, "__code__", _ORIG_HELPER_CODE)), torch.randn(3))[1:])
def ch_function_code_swapped(x):
    return _helper(x)


@functools.lru_cache(maxsize=8)
def _table(n):
    return tuple(range(n))


RESETS.append(_table.cache_clear)


@case(lambda i: (torch.randn(3), i + 1))
def ch_lru_cache_changing_arg(x, n):
    return x * sum(_table(n))


@case(lambda i: (torch.randn(3), [0.5, 1.5, 2.5][i]))
def ch_float_arg_auto_dynamic(x, s):
    return x * s + s


@case(lambda i: (torch.randn(3), [3, 4, 5][i]))
def ch_int_arg_auto_dynamic(x, n):
    return x * n, n + 1


@case(lambda i: (torch.randn(2 + i),))
def ch_shape_changes(x):
    return x * x.shape[0], x.shape[0] * 2


@case(lambda i: (torch.randn(3), [2, 2, 3][i]))
def ch_int_same_then_changes(x, n):
    return torch.ones(n) * x.sum()


@case(lambda i: (torch.randn(3), [1.0, 1.0, float("inf")][i]))
def ch_float_special_values(x, s):
    return x * s, s > 100


@case(lambda i: (torch.randn(3), [2.0, -0.0, 0.0][i]))
def ch_float_signed_zero(x, s):
    return x / (s if s else 1.0), str(s)


@case(lambda i: (torch.randn(3), [True, 1, 1.0][i]))
def ch_bool_int_float_same_value(x, v):
    return x * v, type(v).__name__


@case(lambda i: (torch.randn(3), ["a", "bb", "a"][i]))
def ch_string_arg(x, s):
    return x * len(s), s * 2


# ---------------------------------------------------------------- python numbers reaching torch calls, 4 calls
def _floats(i):
    return (torch.randn(3, 4), [0.5, 1.25, 2.0, 3.5][i])


@case(_floats, 4)
def uf_torch_full(x, s):
    return torch.full((2,), s) + x.sum(), x.new_full((3,), s)


@case(_floats, 4)
def uf_clamp_bounds(x, s):
    return x.clamp(min=-s, max=s), torch.clamp(x, max=s * 2)


@case(_floats, 4)
def uf_pow_and_rpow(x, s):
    return x.abs().pow(s), s ** x.abs()


@case(_floats, 4)
def uf_add_alpha(x, s):
    return torch.add(x, x, alpha=s), x.mul(s).div(s + 1)


@case(_floats, 4)
def uf_float_math_then_torch(x, s):
    return x * math.log(s + 1) + math.floor(s), math.ceil(s)


@case(_floats, 4)
def uf_float_compare_branch(x, s):
    if s > 1.0:
        return x * s
    return x / s


@case(_floats, 4)
def uf_float_to_int_shape(x, s):
    return torch.zeros(int(s * 2)), x * int(s)


@case(_floats, 4)
def uf_float_in_list_to_tensor(x, s):
    return torch.tensor([s, s * 2]) + x[0, :2], torch.as_tensor(s)


@case(_floats, 4)
def uf_float_round_and_format(x, s):
    return x * round(s, 1), f"{s:.3f}", str(s * 2)


@case(lambda i: (torch.randn(3, 8), [1, 2, 4, 8][i]), 4)
def uf_int_view_reshape(x, n):
    return x.reshape(-1, n).sum(0), x.view(3, n, -1).shape


@case(lambda i: (torch.randn(3, 8), [1, 2, 3, 5][i]), 4)
def uf_int_topk_narrow(x, k):
    return x.topk(k, dim=1).values, x.narrow(1, 0, k), x[:, :k].cumsum(1)


@case(lambda i: (torch.randn(3, 8), [0, 1, 2, 1][i]), 4)
def uf_int_dim_arg(x, d):
    return x.sum(d % 2), x.unsqueeze(d).shape


@case(lambda i: (torch.randn(3, 8), [2, 3, 4, 6][i]), 4)
def uf_int_arange_repeat(x, n):
    return torch.arange(n) * 2, x[:, :1].repeat(1, n), torch.eye(n).sum()


@case(lambda i: (torch.randn(3, 8), [2, 3, 4, 6][i]), 4)
def uf_int_python_loop_and_list(x, n):
    parts = [x[:, j] for j in range(n)]
    return torch.stack(parts, 1), len(parts)


@case(lambda i: (torch.randn(3, 8), [2, 3, 4, 6][i], [0.1, 0.2, 0.3, 0.4][i]), 4)
def uf_int_and_float_together(x, n, p):
    return x[:, :n] * p + n * p, n // 2, p * n
