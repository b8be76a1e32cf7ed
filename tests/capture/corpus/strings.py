"""Corpus: strings: methods, formatting (f-strings, %, str.format), joins and splits, and names
built from strings (attribute and key lookups), with tensor work around them.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import torch

from .program import case, fn_program, t


@case("strings")
def fstring_with_format_spec():
    def f(x, n):
        label = f"layer_{n:02d}_{3.14159:.2f}"
        return x + len(label), label
    return fn_program(f, (t(2), 7))


@case("strings")
def fstring_of_tensor_shape():
    def f(x):
        return x.sum(), f"shape={tuple(x.shape)} dim={x.dim()} dtype={x.dtype}"
    return fn_program(f, (t(2, 3),))


@case("strings")
def percent_and_format_methods():
    def f(x):
        a = "%s-%d-%.1f" % ("a", 3, 2.25)
        b = "{}/{name}".format(1, name="z")
        c = "{0}{0}".format("ab")
        return x + len(a + b + c), a, b, c
    return fn_program(f, (t(2),))


@case("strings")
def string_methods_case_and_strip():
    def f(x):
        s = "  Hello World  "
        return x + 1, s.strip(), s.lower(), s.upper().strip(), s.lstrip(), s.rstrip(), s.title(), s.swapcase()
    return fn_program(f, (t(2),))


@case("strings")
def string_split_join_replace():
    def f(x):
        parts = "a.b.c".split(".")
        joined = "-".join(parts)
        return x * len(parts), joined.replace("-", "+"), "x y  z".split(), "k=v".partition("="), "a,b".rsplit(",", 1)
    return fn_program(f, (t(2),))


@case("strings")
def string_startswith_endswith_find():
    def f(x, name):
        out = x
        if name.startswith("enc") and name.endswith(("weight", "bias")):
            out = out * 2
        return out, name.find("."), name.count("e"), name.index("w")
    return fn_program(f, (t(2), "encoder.weight"))


@case("strings")
def string_predicates():
    def f(x):
        return x + "12".isdigit(), "ab".isalpha(), "a1".isalnum(), " ".isspace(), "Ab".islower(), "AB".isupper()
    return fn_program(f, (t(2),))


@case("strings")
def string_indexing_slicing_and_iteration():
    def f(x):
        s = "kiln-model"
        return x + len(s[::2]), s[0], s[-5:], [c for c in s[:4]], "m" in s
    return fn_program(f, (t(2),))


@case("strings")
def string_comparison_and_concatenation_loop():
    def f(x):
        name = ""
        for part in ["a", "b", "c"]:
            name += part
        if name == "abc" and name < "abd":
            return x * 2, name * 2
        return x, name
    return fn_program(f, (t(2),))


@case("strings")
def string_as_mode_switch():
    def f(x, mode):
        if mode == "sum":
            return x.sum()
        elif mode == "mean":
            return x.mean()
        return x
    return fn_program(f, (t(3), "sum"), (t(3), "mean"), (t(3), "none"))


@case("strings")
def string_attribute_names_built_with_format():
    class Layers:
        def __init__(self):
            self.w0 = 1.0
            self.w1 = 2.0

    def f(x, obj):
        return sum(getattr(obj, "w{}".format(i)) for i in range(2)) * x
    return fn_program(f, (t(2), Layers()))


@case("strings")
def string_center_ljust_zfill():
    def f(x):
        return x + 1, "ab".center(6, "*"), "7".zfill(3), "a".ljust(3, "."), "a".rjust(3)
    return fn_program(f, (t(2),))


@case("strings")
def string_encode_and_bytes():
    def f(x):
        raw = "héllo".encode("utf-8")
        return x + len(raw), raw, raw.decode("utf-8")
    return fn_program(f, (t(2),))


@case("strings")
def string_format_of_float_and_int_precision():
    def f(x, lr):
        return x * lr, f"{lr:.3e}", f"{lr!r}", format(lr, ".2%"), f"{12345:,}"
    return fn_program(f, (t(2), 0.00125))


@case("strings")
def string_in_dict_key_built_with_fstring():
    def f(x, params):
        total = x
        for i in range(3):
            total = total + params[f"p{i}"]
        return total
    return fn_program(f, (t(2), {"p0": 1.0, "p1": 2.0, "p2": 3.0}))


@case("strings")
def string_splitlines_and_strip_chars():
    def f(x):
        lines = "a\nbb\n\nccc".splitlines()
        return x + len(lines), [line.strip("c") for line in lines], "xxhixx".strip("x")
    return fn_program(f, (t(2),))


@case("strings")
def string_of_dtype_and_device():
    def f(x):
        return x + 1, str(x.dtype), str(x.device), x.device.type, repr(x.dtype)
    return fn_program(f, (t(2),))


@case("strings", fullgraph=False)
def string_maketrans_translate():
    def f(x):
        table = str.maketrans("ab", "xy")
        return x + 1, "aabbc".translate(table)
    return fn_program(f, (t(2),))


@case("strings")
def string_casefold_and_expandtabs():
    def f(x):
        return x * 2, "StraSSe".casefold(), "a\tb".expandtabs(4), "abc".removeprefix("a"), "abc".removesuffix("c")
    return fn_program(f, (t(2),))


@case("strings")
def string_join_of_generator_over_shape():
    def f(x):
        return x.flatten(), "x".join(str(s) for s in x.shape)
    return fn_program(f, (t(2, 3, 4),))


# held-out probes (probec): strings

@case("strings")
def fstring_shape_dtype_probec():
    def f(x):
        return x * 2, f"{x.shape}", f"{x.dtype}", str(x.shape), repr(x.dtype), f"{x.size(0)}x{x.size(1)}"
    return fn_program(f, (t(2, 3),))


@case("strings")
def str_format_of_size_and_device_probec():
    def f(x):
        return x + 1, "{}|{}|{!s}".format(x.shape, x.device, x.dtype), "%s" % (x.size(),), str(x.size(1)), repr(x.shape)
    return fn_program(f, (t(2, 3),))


@case("strings")
def fstring_of_tensor_shape_in_exception_probec():
    def f(x):
        try:
            if x.shape[0] != 5:
                raise ValueError(f"bad shape {tuple(x.shape)} dtype={x.dtype}")
        except ValueError as e:
            return x * 2, str(e)
        return x, ""
    return fn_program(f, (t(2, 3),))
