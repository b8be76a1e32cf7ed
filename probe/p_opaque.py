import torch, decimal, fractions, datetime, re, io, struct, array, weakref, threading
from harness import case, fn_program, t, Program, kw

D2 = decimal.Decimal(2)
D3 = decimal.Decimal("3.5")

@case("opaque")
def op_decimal_in_mixed_expression():
    def f(x, d):
        return x * float(d * 2 - 1) + float(-d ** 2) + float((-d) ** 2)
    return fn_program(f, (t(2), D2), (t(2), D3))

@case("opaque")
def op_decimal_augassign_subscript():
    def f(x, d):
        acc = {"k": decimal.Decimal(1)}
        acc["k"] += d
        acc["k"] *= d
        return x + float(acc["k"]), str(acc["k"])
    return fn_program(f, (t(2), D2))

@case("opaque")
def op_decimal_augassign_attr():
    class S: pass
    def f(x, d):
        s = S(); s.v = d
        s.v -= 1
        s.v **= 2
        return x * float(s.v)
    return fn_program(f, (t(2), D3))

@case("opaque")
def op_decimal_chained_compare():
    def f(x, d):
        if 1 < d < 3:
            return x + 1
        return x - 1
    return fn_program(f, (t(2), D2), (t(2), D3))

@case("opaque")
def op_decimal_in_conditional_expr_and_fstring():
    def f(x, d):
        s = f"{d:.2f}|{d!r}|{-d}"
        return (x * 2 if d > 2 else x * 3), s
    return fn_program(f, (t(2), D2), (t(2), D3))

@case("opaque")
def op_decimal_in_loop_and_comprehension():
    def f(x, d):
        vals = [float(d * i) for i in range(3)]
        tot = decimal.Decimal(0)
        for i in range(3):
            tot += d / (i + 1)
        return x * sum(vals) + float(tot)
    return fn_program(f, (t(2), D2))

@case("opaque")
def op_fraction_ops():
    def f(x, q):
        r = q * 3 + fractions.Fraction(1, 3)
        return x * float(r), r.numerator, r.denominator, str(-q ** 2)
    return fn_program(f, (t(2), fractions.Fraction(2, 3)))

@case("opaque")
def op_datetime_arith():
    def f(x, dt):
        later = dt + datetime.timedelta(days=3)
        return x * later.day, later.isoformat(), (later - dt).days
    return fn_program(f, (t(2), datetime.datetime(2020, 1, 30)))

@case("opaque")
def op_regex_match():
    PAT = re.compile(r"layer(\d+)\.(\w+)")
    def f(x, name):
        m = PAT.match(name)
        if m:
            return x * int(m.group(1)), m.group(2)
        return x, None
    return fn_program(f, (t(2), "layer3.weight"), (t(2), "head"))

@case("opaque")
def op_stringio_print_file():
    def f(x):
        buf = io.StringIO()
        print("v", x.shape[0], file=buf)
        buf.write("end")
        return x + 1, buf.getvalue()
    return fn_program(f, (t(2),))

@case("opaque")
def op_struct_pack_unpack():
    def f(x):
        b = struct.pack("<if", 7, 1.5)
        i, fl = struct.unpack("<if", b)
        return x * i + fl, len(b)
    return fn_program(f, (t(2),))

@case("opaque")
def op_array_module():
    def f(x):
        a = array.array("d", [1.0, 2.0])
        a.append(3.0)
        return x * sum(a), len(a)
    return fn_program(f, (t(2),))

@case("opaque")
def op_weakref_to_object():
    class O:
        def __init__(self, v):
            self.v = v
    o = O(3)
    r = weakref.ref(o)
    def f(x):
        obj = r()
        return x * obj.v if obj is not None else x
    return fn_program(f, (t(2),))

@case("opaque")
def op_threading_local_attr():
    loc = threading.local()
    loc.scale = 4
    def f(x):
        loc.last = 1
        return x * loc.scale
    return fn_program(f, (t(2),), observe=lambda: loc.last)

@case("opaque")
def op_opaque_call_result_in_star_args():
    def f(x, d):
        args = [x, float(d)]
        return torch.add(*args), max(*[1, int(d), 0])
    return fn_program(f, (t(2), D3))

@case("opaque")
def op_opaque_in_with_block():
    def f(x, d):
        with torch.no_grad():
            y = x * float(d * d)
        return y, y.requires_grad
    return fn_program(f, (t(2, requires_grad=True), D3))

@case("opaque")
def op_opaque_in_try_except():
    def f(x, d):
        try:
            v = d / 0
        except decimal.DivisionByZero:
            v = decimal.Decimal(-1)
        except ZeroDivisionError:
            v = decimal.Decimal(-2)
        return x * float(v)
    return fn_program(f, (t(2), D2))

@case("opaque")
def op_opaque_unary_ops():
    def f(x, d):
        return x + float(-d) + float(+d) + float(abs(-d)), not d, ~int(d)
    return fn_program(f, (t(2), D3))

@case("opaque")
def op_opaque_contains_and_subscript():
    def f(x, m):
        return x * (1 if "a" in m else 0) + m["a"], len(m)
    import types
    return fn_program(f, (t(2), types.MappingProxyType({"a": 2})))

@case("opaque")
def op_bytes_ops():
    def f(x):
        b = b"abc" + bytes([100])
        return x * len(b), b[1], b.decode().upper(), b.hex()
    return fn_program(f, (t(2),))

@case("opaque")
def op_opaque_store_subscript_value():
    def f(x, d):
        l = [0, 0]
        l[int(d) % 2] = d * 2
        return x + float(l[0] or l[1]), str(l)
    return fn_program(f, (t(2), D3), (t(2), D2))

@case("opaque")
def op_mixed_tensor_and_decimal_in_return_tuple():
    def f(x, d):
        y = x.sin()
        e = d.sqrt()
        z = y * float(e)
        return z, e, -e, e ** 2
    return fn_program(f, (t(2), D2))

@case("opaque")
def op_negative_constant_base_power_of_opaque():
    def f(x, d):
        return x + float((-2) ** d) + float((1 - 4) ** d)
    return fn_program(f, (t(2), D2))

@case("opaque")
def op_attribute_of_int_constant_escapes():
    def f(x):
        y = x + 1
        return y, (5).foo
    return fn_program(f, (t(2),))
