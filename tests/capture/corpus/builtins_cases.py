"""Corpus: builtins: isinstance/issubclass, getattr/hasattr/setattr/delattr, len, sorted, min/max,
sum, any/all, abs/round/divmod/pow, int/float/bool conversions, id/type, locals, and number methods.

The answers come from values known at trace time (guarded) or stay symbolic; each runs under
fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import math
import sys

import torch

from .program import Program, case, fn_program, t


class Holder:
    kind = "holder"

    def __init__(self):
        self.value = 3


@case("builtins")
def isinstance_on_many_types():
    def f(x, n, s, items):
        out = x
        if isinstance(x, torch.Tensor):
            out = out + 1
        if isinstance(n, int) and not isinstance(n, bool):
            out = out + 10
        if isinstance(s, str):
            out = out * 2
        if isinstance(items, (list, tuple)):
            out = out - 1
        if isinstance(x, torch.nn.Parameter):
            out = out * 100
        return out
    return fn_program(f, (t(2), 3, "a", [1]))


@case("builtins")
def issubclass_and_type_checks():
    def f(x):
        out = x
        if issubclass(torch.nn.Linear, torch.nn.Module):
            out = out + 1
        if type(x) is torch.Tensor:
            out = out * 2
        if type(3) == int and type(x.shape) is torch.Size:
            out = out - 3
        return out
    return fn_program(f, (t(2),))


@case("builtins")
def getattr_hasattr_setattr_delattr_on_object():
    def f(x, obj):
        out = x * getattr(obj, "value")
        if hasattr(obj, "missing"):
            out = out * 0
        setattr(obj, "extra", 5)
        out = out + obj.extra + getattr(obj, "nothing", 7)
        delattr(obj, "extra")
        return out, hasattr(obj, "extra")
    obj = Holder()
    return Program(f, ((t(2), obj),), observe=lambda: sorted(vars(obj)))


@case("builtins")
def getattr_with_computed_name():
    def f(x, obj):
        total = x
        for name in ["value", "kind"]:
            v = getattr(obj, name)
            if isinstance(v, int):
                total = total + v
        return total
    return fn_program(f, (t(2), Holder()))


@case("builtins")
def getattr_tensor_methods_by_name():
    def f(x):
        return [getattr(x, name)() for name in ("sin", "cos", "abs")]
    return fn_program(f, (t(3),))


@case("builtins")
def len_of_many_things():
    def f(x, d):
        return x + len(x) + len("abcd") + len(d) + len(range(5)) + len(x.shape) + len({1, 2})
    return fn_program(f, (t(3, 2), {"a": 1}))


@case("builtins")
def sorted_constants_with_key_and_reverse():
    def f(x):
        values = [5, -3, 2, -8]
        return x + sorted(values)[0], sorted(values, key=abs), sorted(values, reverse=True), sorted("cab")
    return fn_program(f, (t(2),))


@case("builtins")
def sorted_dict_items_by_value():
    def f(x):
        scores = {"a": 3, "b": 1, "c": 2}
        ranked = sorted(scores.items(), key=lambda kv: kv[1])
        return x * ranked[-1][1], [k for k, _ in ranked]
    return fn_program(f, (t(2),))


@case("builtins")
def min_max_of_constants_and_keys():
    def f(x):
        sizes = [4, 2, 9]
        return x + max(sizes) - min(sizes), max("ab", "abc", key=len), min(3, 1, 2), max([], default=0)
    return fn_program(f, (t(2),))


@case("builtins")
def min_max_of_tensor_sizes():
    def f(x, y):
        longest = max(x.size(0), y.size(0))
        return torch.zeros(longest) + x.sum() + y.sum(), min(x.shape)
    return fn_program(f, (t(3), t(5)))


@case("builtins", fullgraph=False)
def max_of_tensors_elementwise_builtin():
    def f(x):
        return max(x[0], x[1]), min(x[1], x[0]), min(2.0, 3.0)
    return fn_program(f, (t(2),))


@case("builtins")
def sum_with_start_and_generator():
    def f(x):
        return sum([x, x, x], x * 0) + sum(k for k in range(4)), sum([0.5, 1.5], 1)
    return fn_program(f, (t(2),))


@case("builtins")
def any_all_over_constants():
    def f(x):
        flags = [False, True, False]
        out = x
        if any(flags):
            out = out + 1
        if not all(flags):
            out = out * 2
        if all([]) and not any([]):
            out = out - 5
        return out
    return fn_program(f, (t(2),))


@case("builtins")
def any_all_over_sizes():
    def f(x):
        if all(s > 1 for s in x.shape) and any(s == 3 for s in x.shape):
            return x + 1
        return x - 1
    return fn_program(f, (t(3, 2),))


@case("builtins", fullgraph=False)
def abs_round_divmod_pow():
    def f(x):
        q, r = divmod(17, 5)
        return x * q + r + abs(-2) + round(2.567, 2) + pow(2, 3) + round(7.5), abs(x), pow(x, 2)
    return fn_program(f, (t(2),))


@case("builtins")
def int_float_bool_str_conversions():
    def f(x):
        n = int("12") + int(3.9) + int(True)
        y = float("1.5") + float(2)
        ok = bool([]) or bool("x")
        return x * n + y, ok, str(4) + "!"
    return fn_program(f, (t(2),))


@case("builtins")
def math_functions_on_constants():
    def f(x):
        return x * math.sqrt(16) + math.floor(2.7) + math.ceil(2.1) + math.log(math.e) + math.pi, \
            math.isclose(0.1 + 0.2, 0.3), math.gcd(12, 18), math.prod([2, 3])
    return fn_program(f, (t(2),))


@case("builtins")
def math_on_tensor_sizes():
    def f(x):
        n = x.size(0)
        return x.reshape(int(math.sqrt(n)), -1), math.ceil(n / 3)
    return fn_program(f, (t(16),))


@case("builtins")
def int_methods_on_constants():
    def f(x):
        n = 10
        return x + n.bit_length(), n.as_integer_ratio(), n.conjugate(), (3.0).is_integer(), (2.5).hex()
    return fn_program(f, (t(2),))


@case("builtins")
def float_is_integer_on_input():
    def f(x, m):
        return 2 * x if m.is_integer() else x
    return fn_program(f, (t(2), 2.0), (t(2), 2.5))


@case("builtins")
def number_methods_on_inputs():
    def f(x, n, m):
        ratio = m.as_integer_ratio()
        return x * n.bit_length() + ratio[0] / ratio[1], n.real, m.imag, n.conjugate()
    return fn_program(f, (t(2), 6, 0.75))


@case("builtins")
def id_and_is_identity():
    def f(x, y):
        alias = x
        out = x * 0
        if alias is x:
            out = out + 1
        if y is not x:
            out = out + 10
        if id(alias) == id(x):
            out = out + 100
        return out
    return fn_program(f, (t(2), t(2)))


@case("builtins")
def object_equality_and_identity_made_in_frame():
    class Token:
        pass

    def f(x):
        a, b = Token(), Token()
        out = x
        if a == a and a is a:
            out = out + 1
        if a != b and a is not b:
            out = out * 2
        if a == None:  # noqa: E711
            out = out * 0
        return out
    return fn_program(f, (t(2),))


@case("builtins")
def type_of_object_and_name():
    def f(x, obj):
        return x + len(type(obj).__name__), type(obj).kind, type(obj) is Holder
    return fn_program(f, (t(2), Holder()))


@case("builtins")
def locals_read_in_frame():
    def f(x):
        a = 2
        b = x + 1
        names = locals()
        return names["b"] * names["a"], sorted(k for k in names)
    return fn_program(f, (t(2),))


@case("builtins")
def sys_intern_and_sys_version():
    def f(x):
        key = sys.intern("name")
        return x + (1 if key == "name" else 0), sys.version_info >= (3, 8)
    return fn_program(f, (t(2),))


@case("builtins")
def chr_ord_hex_bin():
    def f(x):
        return x + ord("a") - ord(chr(97)), hex(255), bin(5), oct(8)
    return fn_program(f, (t(2),))


@case("builtins")
def hash_of_constants():
    def f(x):
        return x + (hash(3) == hash(3)) + (hash((1, 2)) == hash((1, 2)))
    return fn_program(f, (t(2),))


@case("builtins")
def tuple_and_list_builtins_on_shape():
    def f(x):
        dims = list(x.shape)
        dims.reverse()
        return x.permute(*range(x.dim() - 1, -1, -1)), tuple(dims), x.shape[::-1]
    return fn_program(f, (t(2, 3, 4),))


@case("builtins")
def bool_of_containers_and_none():
    def f(x, items, maybe):
        out = x
        if items:
            out = out + 1
        if not maybe:
            out = out * 3
        if maybe is None:
            out = out - 1
        return out
    return fn_program(f, (t(2), [0], None), (t(2), [], 0))


@case("builtins", fullgraph=False)
def list_unbound_method_call():
    def f(x):
        values = [x, x + 1, x + 2]
        second = list.__getitem__(values, 1)
        list.append(values, x * 9)
        return second, len(values), dict.get({"a": 1}, "a")
    return fn_program(f, (t(2),))


@case("builtins")
def str_and_repr_of_constants():
    def f(x):
        return x + 1, str((1, "a")), repr([1.5, None]), str(True)
    return fn_program(f, (t(2),))


@case("builtins", fullgraph=False)
def vars_and_dir_on_object():
    def f(x, obj):
        return x + len(vars(obj)), "value" in dir(obj), obj.__dict__["value"]
    return fn_program(f, (t(2), Holder()))


@case("builtins")
def int_float_of_tensor_size_arithmetic():
    def f(x):
        n = x.shape[0]
        half = n // 2
        ratio = n / 4
        return x[:half] * ratio, float(n), int(ratio * 4), n % 3, -n, n ** 2
    return fn_program(f, (t(6),))


@case("builtins")
def enumerate_over_dict_and_string():
    def f(x):
        out = x
        for i, ch in enumerate("ab"):
            out = out + i * len(ch)
        for i, key in enumerate({"p": 1, "q": 2}):
            out = out * (i + 1)
        return out
    return fn_program(f, (t(2),))


@case("builtins")
def isinstance_with_abc_and_tuple_of_types():
    from collections.abc import Sequence, Mapping

    def f(x, a, b):
        out = x
        if isinstance(a, Sequence):
            out = out + 1
        if isinstance(b, Mapping):
            out = out + 10
        if isinstance(a, (dict, set)):
            out = out * 0
        return out
    return fn_program(f, (t(2), [1, 2], {"k": 1}))


# reversed() as each type has it, slice objects read by a user __getitem__, and a match statement
# comparing a tuple subject with a str literal.

@case("builtins")
def reversed_of_tensor_and_of_user_object():
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __reversed__(self):
            return iter(range(1, self.n + 1))

    def f(x):
        flipped = reversed(x) * 2  # Tensor.__reversed__ flips dim 0: a tensor, not an iterator
        ups = list(reversed(Countdown(3)))
        return flipped + ups[-1], ups, reversed(x.sum())
    return fn_program(f, (t(3, 2),))


@case("builtins")
def reversed_of_a_set_raises_type_error():
    def f(x, items):
        try:
            order = list(reversed(items))
        except TypeError as e:
            return x - 1, str(e)
        return x + order[0], order
    return fn_program(f, (t(2), {3, 4}), (t(2), [3, 4]), (t(2), (5, 6)))


@case("builtins")
def slice_object_read_by_user_getitem():
    class Window:
        def __init__(self, data):
            self.data = data

        def __getitem__(self, key):
            if isinstance(key, slice):
                start, stop, step = key.indices(self.data.shape[0])
                return self.data[start:stop:step] * (key.step or 1) + len(range(start, stop, step))
            return self.data[key]

    def f(x):
        w = Window(x)
        return w[1:5:2], w[::3], w[-2:], w[0]
    return fn_program(f, (t(6, 2),))


@case("builtins")
def match_tuple_subject_against_str_literal():
    def f(x, spec):
        match spec:
            case "identity":
                return x
            case ("scale", factor):
                return x * factor
            case ("clamp", lo, hi):
                return x.clamp(lo, hi)
            case _:
                return -x
    return fn_program(f, (t(3), ("scale", 2)), (t(3), "identity"), (t(3), ("clamp", -0.5, 0.5)), (t(3), ("x", 1, 2, 3)))
