"""Corpus: sizes in Python arithmetic (//, %, negative modulo, pads to a multiple, sizes 0/1/2) over
several sizes (automatic dynamic after the first recompile), and numerics with Python's and ATen's
semantics: floor division and remainder signs, int8/uint8 wrap-around, shifts by the width, NaN and inf
through reductions and casts, an int tensor to a negative power (eager's error), dtype promotion;
plus module attributes and a dict changed between calls, and exceptions after side effects.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .program import Program, case, fn_program, t


class MyErr(Exception):
    pass


@case("shapes_numerics")
def floor_mod_of_sizes():
    def f(x):
        n = x.shape[0]
        return x[: n // 2] * (n % 3) + (-n) % 4 - (-n // 3)
    return fn_program(f, (t(5),), (t(7),), (t(8),), (t(11),))


@case("shapes_numerics")
def pad_to_multiple():
    def f(x):
        n = x.shape[-1]
        pad = (-n) % 4
        return F.pad(x, (0, pad)).view(-1, 4).sum(1)
    return fn_program(f, (t(5),), (t(6),), (t(8),), (t(9),))


@case("shapes_numerics")
def sizes_zero_one_two():
    def f(x):
        return x.sum(0), x.mean() if x.numel() else x.sum(), x.shape[0] + 1
    return fn_program(f, (t(2, 3),), (t(1, 3),), (t(0, 3),), (t(3, 3),), (t(5, 3),))


@case("shapes_numerics")
def split_symbolic():
    def f(x):
        n = x.shape[0]
        a, b = x.split([n // 2, n - n // 2])
        return a.sum() - b.sum(), a.shape[0]
    return fn_program(f, (t(4),), (t(5),), (t(9),))


@case("shapes_numerics")
def roll_flip_symbolic():
    def f(x):
        return x.roll(x.shape[0] // 2, 0), x.flip(0)[1:], x[::2] + x[1::2][: (x.shape[0] + 1) // 2 - (x.shape[0] % 2)].sum()
    return fn_program(f, (t(4),), (t(6),), (t(8),), (t(10),))


@case("shapes_numerics")
def int_dtype_arith_symbolic():
    def f(x):
        n = x.shape[0]
        return (x * n) // 3, x % n, torch.div(x, n, rounding_mode="floor"), x / n
    return fn_program(f, (torch.arange(-4, 4),), (torch.arange(-5, 5),), (torch.arange(-7, 7),))


@case("shapes_numerics")
def floor_div_negative():
    def f(x, y):
        return x // y, torch.floor_divide(x, -3), x % y, torch.remainder(x, -3), torch.fmod(x, -3), torch.div(x, y, rounding_mode="trunc")
    return fn_program(f, (torch.tensor([-7, -1, 0, 5, 7]), torch.tensor([2, -2, 3, -3, 4])),
                      (torch.tensor([-7.5, -1.0, 0.5, 5.0, 7.0]), torch.tensor([2.0, -2.0, 3.0, -3.0, 4.0])))


@case("shapes_numerics")
def int8_overflow():
    def f(x, y):
        return x + y, x * y, x - y, (x * 3).to(torch.int16)
    a = torch.tensor([100, -100, 127, -128], dtype=torch.int8)
    b = torch.tensor([100, -100, 1, -1], dtype=torch.int8)
    return fn_program(f, (a, b))


@case("shapes_numerics")
def uint8_overflow():
    def f(x):
        return x + 200, x - 10, x * 3, (x + x).sum(), x.sum(dtype=torch.uint8)
    return fn_program(f, (torch.tensor([5, 100, 250], dtype=torch.uint8),))


@case("shapes_numerics")
def nan_inf_propagation():
    def f(x):
        return x.max(), x.min(), x.clamp(-1, 1), x.argmax(), x.argmin(), torch.maximum(x, x.flip(0)), x.amax(), torch.nan_to_num(x)
    return fn_program(f, (torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0]),),
                      (torch.tensor([1.0, 3.0, float("inf"), -2.0]),))


@case("shapes_numerics")
def where_scalars():
    def f(x):
        return torch.where(x > 0, 1.0, 0), torch.where(x > 0, x, 2), torch.where(x > 0, 3, 4), torch.where(x > 0, x.int(), 2.5)
    return fn_program(f, (t(5),))


@case("shapes_numerics")
def sum_empty():
    def f(x):
        return x.sum(), x.mean(), x.max(0).values if x.numel() else x.sum(0), x.prod(), x.sum(dtype=torch.int64)
    return fn_program(f, (t(0),), (t(0, 3),))


@case("shapes_numerics")
def mixed_dtype_kernel():
    def f(a, b, c):
        return a + b + c, (a * b).dtype, a.double() + c, b + True
    return fn_program(f, (t(3, dtype=torch.float16), t(3, dtype=torch.int64), t(3, dtype=torch.float64)))


@case("shapes_numerics")
def int_pow_negative_error():
    def f(x):
        return (x + 1) ** -1
    return fn_program(f, (torch.tensor([2, 3]),))


@case("shapes_numerics")
def shift_by_width_or_more():
    def f(x, s):
        return (x * 1) << s, (x * 1) >> s, (x + 0) << 31
    return fn_program(f, (torch.tensor([1, -1, 5, -8], dtype=torch.int32), torch.tensor([40, 40, 33, 32], dtype=torch.int32)),
                      (torch.tensor([1, -1, 5, -8]), torch.tensor([64, 70, 63, 1])))


@case("shapes_numerics")
def float_to_int_nan_inf():
    def f(x):
        y = x * 1
        return y.to(torch.int32), y.to(torch.int64), y.to(torch.uint8), y.to(torch.int8), y.to(torch.bool)
    return fn_program(f, (torch.tensor([float("nan"), float("inf"), -float("inf"), 3e10, 300.7, -5.5, -0.0]),))


@case("shapes_numerics")
def int_min_floordiv_minus1():
    def f(x, y):
        return (x + 0) // y, torch.remainder(x + 0, y), torch.fmod(x + 0, y)
    return fn_program(f, (torch.tensor([-2 ** 63 + 1, 5, -7]), torch.tensor([-1, 2, -1])),
                      (torch.tensor([-128, 127], dtype=torch.int8), torch.tensor([-1, -1], dtype=torch.int8)))


@case("shapes_numerics")
def module_attr_float_bool_int_str():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = 1.5
            self.flag = True
            self.n = 2
            self.mode = "sum"

        def forward(self, x):
            y = x * self.alpha
            if self.flag:
                y = y + self.n
            return y.sum() if self.mode == "sum" else y.mean()

    def between(subject, i):
        if i == 1:
            subject.alpha = 3.0
        elif i == 2:
            subject.flag = False
        elif i == 3:
            subject.n = 7
            subject.flag = True
        else:
            subject.mode = "mean"
    return Program(M(), [(t(4),)] * 5, between=between)


@case("shapes_numerics")
def dict_key_added():
    cfg = {"a": 1}

    def f(x):
        return x * sum(cfg.values()) + len(cfg), "b" in cfg

    def between(subject, i):
        cfg[f"k{i}"] = i
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=between)


@case("shapes_numerics", fullgraph=False)
def try_finally_side_effect():
    log = []

    def f(x):
        try:
            y = x * 2
            if x.shape[0] == 3:
                raise ValueError("three")
            return y
        finally:
            log.append(x.shape[0])
    return fn_program(f, (t(2),), (t(3),), observe=lambda: list(log))


@case("shapes_numerics", fullgraph=False)
def exception_after_inplace():
    def f(x):
        x.add_(1)
        if x.shape[0] == 3:
            raise MyErr("after mutation")
        return x
    return fn_program(f, (t(2),), (t(3),))


# Sizes made symbolic by a second shape, used where Python needs their numbers: Size.index/count
# compare them (decided and guarded), hash() and groupby keys specialize them, as torch.compile does
# (each was a graph break).

@case("shapes", fullgraph=False, counts=True)
def size_index_and_count_over_symbolic_sizes():
    def f(x):
        s = x.shape
        return x.sum(s.index(3)), s.count(2), s.count(3)
    return fn_program(f, (t(2, 3, 2),), (t(4, 3, 4),), (t(5, 3, 6),))


@case("shapes", counts=True)
def hash_of_a_symbolic_shape():
    def f(x):
        key = hash(x.shape)
        table = {hash((2, 3)): 1.0, hash((4, 3)): 2.0}
        return x * table.get(key, -1.0), key == hash(tuple(x.shape))
    return fn_program(f, (t(2, 3),), (t(4, 3),), (t(5, 3),))


@case("shapes", fullgraph=False, counts=True)
def groupby_keyed_by_symbolic_sizes():
    def f(xs):
        out = []
        for n, group in itertools.groupby(xs, key=lambda v: v.shape[0]):
            out.append(torch.cat(list(group)) * n)
        return out
    return fn_program(f, ([t(2), t(2), t(3)],), ([t(4), t(4), t(5)],), ([t(6), t(7), t(7)],))
