"""Programs for test_dynbuiltins_programs.py: str methods, f-strings and %-formatting."""
import torch
X = lambda: (torch.ones(3),)

def fstr_spec(x):
    n = 3.14159
    return f"{n:.2f}", f"{7:03d}", f"{255:x}", f"{1e6:,.0f}", f"{0.5:%}", f"{'a':>4}|", x
def fstr_shape(x):
    return f"shape={tuple(x.shape)} n={x.numel()} d={x.dim():>3}", x + 1
def fstr_repr(x):
    s = "ab"
    return f"{s!r} {s!s} {3.0!r}", x
def join_split(x):
    parts = "a,b,,c".split(",")
    return "-".join(parts), "a b  c".split(), "k=v".partition("="), "a.b.c".rsplit(".", 1), x
def pct_format(x):
    return "%d-%s-%.3f" % (3, "x", 1.5), "%(a)s" % {"a": 1}, "%5.1f|" % 2.25, x
def str_methods(x):
    s = "  Hello World  "
    return s.strip(), s.lower(), s.upper(), s.title(), s.replace("o", "0"), s.startswith("  H"), s.find("W"), s.count("l"), x
def str_format_method(x):
    return "{} {:>5} {name}".format(1, "ab", name="z"), "{0}{0}".format("q"), x
def str_predicates(x):
    return "123".isdigit(), "abc".isalpha(), "Ab".islower(), "  ".isspace(), "x1".isalnum(), x
def str_zfill_center(x):
    return "7".zfill(3), "a".center(5, "*"), "ab".ljust(4, "."), "ab".rjust(4), x
def str_in_and_slice(x):
    s = "abcdef"
    return "cd" in s, s[::-2], s[1:4], s[-1], x
def str_encode(x):
    return "héllo".encode("utf-8"), b"abc".decode(), x
def str_join_tensor_shape(x):
    return "x".join(str(d) for d in x.shape), x
def str_key_dict(x):
    d = {}
    for i, name in enumerate(["w", "b"]):
        d[f"{name}_{i}"] = x * i
    return d
def str_getattr_name(x):
    name = "add"
    return getattr(x, name)(1), getattr(torch, "mul")(x, 2)
def str_mult(x):
    return "ab" * 3, "-" * 10, x
def str_splitlines(x):
    return "a\nb\r\nc".splitlines(), "a b".expandtabs(), "x".casefold(), "ABC".swapcase(), x
def str_format_float_tensor(x):
    v = float(x.sum())
    return f"{v:.1f}"
def str_format_int_item(x):
    return "%d" % int(x.sum().item())
def str_sorted(x):
    return sorted("bca"), "".join(reversed("abc")), max("abc"), min(["bb", "a"], key=len), x
def str_removeprefix(x):
    return "prefix_name".removeprefix("prefix_"), "name.py".removesuffix(".py"), x
def str_translate(x):
    return "abc".translate(str.maketrans("ab", "xy")), x
def str_compare(x):
    return "a" < "b", "abc" < "abd", ("a", 1) < ("a", 2), x
def str_ord_chr(x):
    return chr(ord("a") + 1), [ord(c) for c in "AZ"], x * ord("\x02")
def str_fmt_bool_none(x):
    return f"{True} {None} {[1, 2]} {(1,)} {{}}", str({"a": 1}), repr([1.5, "x"]), x
def str_format_spec_nested(x):
    w = 6
    p = 2
    return f"{3.14159:{w}.{p}f}", x
def str_int_parse(x):
    return int("12") + int("ff", 16) + int("  7 "), float("1.5"), x
def str_bytes_ops(x):
    return bytes([65, 66]), bytearray(b"ab"), len(b"xyz"), x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and not n.startswith("_") and n != "X"]
