import torch, operator, dataclasses
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

@case("syntax")
def y_match_statement_shapes():
    def f(x, spec):
        match spec:
            case {"op": "scale", "k": k}:
                return x * k
            case ("shift", v):
                return x + v
            case [a, b, *_]:
                return x * a - b
            case _:
                return x
    return fn_program(f, (t(2), {"op": "scale", "k": 3}), (t(2), ("shift", 2)), (t(2), [1, 2, 3]), (t(2), None))

@case("syntax")
def y_match_class_pattern():
    @dataclasses.dataclass
    class P:
        a: int
        b: int
    def f(x, p):
        match p:
            case P(a=0, b=b):
                return x + b
            case P(a=a):
                return x * a
    return fn_program(f, (t(2), P(0, 5)), (t(2), P(3, 1)))

@case("syntax")
def y_chained_comparisons():
    def f(x, n):
        if 0 < n <= 3 < 10:
            return x + n
        return x - n
    return fn_program(f, (t(2), 2), (t(2), 5))

@case("syntax")
def y_augassign_on_subscript_and_attr():
    class S: pass
    def f(x):
        s = S(); s.v = x
        l = [x, x]
        d = {"k": x}
        s.v += 1
        l[1] *= 2
        d["k"] -= 3
        return s.v, l, d
    return fn_program(f, (t(2),))

@case("syntax")
def y_inplace_dunder_on_list_extends_alias():
    def f(x, l):
        m = l
        m += [x]
        return len(l), l is m
    l = []
    return fn_program(f, (t(2), l), observe=lambda: len(l))

@case("syntax")
def y_tuple_iadd_does_not_alias():
    def f(x):
        a = (x,)
        b = a
        b += (x * 2,)
        return len(a), len(b)
    return fn_program(f, (t(2),))

@case("syntax")
def y_tensor_iadd_aliases():
    def f(x):
        y = x
        y += 1
        z = x
        z = z + 1
        return x, z
    return fn_program(f, (t(2),))

@case("syntax")
def y_truthiness_of_containers_and_none():
    def f(x, l, d, o):
        r = x
        if l:
            r = r + 1
        if not d:
            r = r * 2
        if o is None:
            r = r - 1
        return r
    return fn_program(f, (t(2), [], {}, None), (t(2), [1], {"a": 1}, 3))

@case("syntax")
def y_conditional_expression_and_or_values():
    def f(x, a, b):
        v = a or b
        w = a and b
        return x * (v if v else 1), w
    return fn_program(f, (t(2), 0, 3), (t(2), 2, 0), (t(2), 2, 5))

@case("syntax")
def y_while_loop_with_break_else():
    def f(x):
        i = 0
        while True:
            x = x * 2
            i += 1
            if i >= 3:
                break
        for j in range(2):
            pass
        else:
            x = x + j
        return x, i
    return fn_program(f, (t(2),))

@case("syntax")
def y_del_local_and_global():
    def f(x):
        a = x + 1
        b = a
        del a
        return b * 2, "a" in dir()
    return fn_program(f, (t(2),))

@case("syntax")
def y_star_unpack_in_calls_and_literals():
    def f(x):
        args = [x, 1]
        d = {"dim": 0}
        l = [*args, *range(2)]
        m = {**d, "keepdim": True}
        return torch.sum(x.unsqueeze(0), **m), len(l), {*"ab", *"bc"} == {"a", "b", "c"}
    return fn_program(f, (t(2),))

@case("syntax")
def y_lambda_immediately_invoked_and_nested_defaults():
    def f(x):
        return (lambda a, b=2: a * b)(x), (lambda *a: len(a))(1, 2, 3)
    return fn_program(f, (t(2),))

@case("syntax")
def y_global_declared_not_assigned_reads():
    def f(x):
        global Y_G
        return x * Y_G
    return fn_program(f, (t(2),))
Y_G = 4

@case("syntax")
def y_class_defined_inside_frame():
    def f(x):
        class Local:
            def __init__(self, v):
                self.v = v
            def double(self):
                return self.v * 2
        return Local(x).double()
    return fn_program(f, (t(2),))

@case("syntax")
def y_list_slice_negative_step_and_del_slice():
    def f(x):
        l = list(range(8))
        del l[::3]
        return x * l[::-2][0], l[-3:], l[1:-1:2]
    return fn_program(f, (t(2),))

@case("syntax")
def y_string_multiplication_and_in():
    def f(x):
        s = "ab" * 3
        return x * s.count("a"), "ba" in s, s[::-1]
    return fn_program(f, (t(2),))

@case("syntax")
def y_nested_function_with_same_name_shadowing():
    def f(x):
        def g(v):
            return v + 1
        a = g(x)
        def g(v):
            return v * 10
        return a, g(x)
    return fn_program(f, (t(2),))

@case("syntax")
def y_try_in_loop_with_return_in_finally_absent():
    def f(x):
        out = []
        for i in range(3):
            try:
                if i == 1:
                    continue
                out.append(x * i)
            finally:
                out.append(i)
        return out
    return fn_program(f, (t(2),))

@case("syntax")
def y_operator_on_tensors_bitwise_and_matmul():
    def f(a, b):
        return a @ b, (a > 0) | (b.t() > 0), ~(a > 0), a ** 2, -a, +a, a // 0.3, a % 0.7
    return fn_program(f, (t(2, 2), t(2, 2)))

@case("syntax")
def y_reflected_ops_with_python_scalars():
    def f(x):
        return 2 - x, 3 / (x.abs() + 1), 2 ** x, 5 % (x.abs() + 1), 1 @ x if False else 7 // (x.abs() + 1)
    return fn_program(f, (t(3),))

@case("syntax")
def y_comparison_ops_tensor_scalar_and_eq():
    def f(x, y):
        return x == y, x != 0, x >= y, (x == x).all(), torch.equal(x, y)
    return fn_program(f, (t(3), t(3)))

@case("syntax")
def y_tensor_in_list_membership():
    def f(x, y):
        l = [x]
        return x in l, (y in l) if False else 0
    return fn_program(f, (t(2), t(2)))

@case("syntax")
def y_format_spec_with_tensor_item():
    def f(x):
        return f"{x.shape[0]:>4}|{x.dtype!s}", x + 1
    return fn_program(f, (t(3),))

@case("syntax")
def y_dict_merge_operators():
    def f(x):
        a = {"p": 1}
        b = {"q": 2}
        c = a | b
        a |= {"r": 3}
        return x * len(c) + len(a), c, a
    return fn_program(f, (t(2),))

@case("syntax")
def y_generator_in_any_short_circuit_side_effect():
    log = []
    def check(v):
        log.append(v)
        return v > 1
    def f(x):
        r = any(check(i) for i in range(5))
        return x + r
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("syntax")
def y_sorted_reverse_stable_tuples():
    def f(x):
        data = [(1, "b"), (0, "a"), (1, "a"), (0, "c")]
        s = sorted(data, key=lambda p: p[0], reverse=True)
        return x * s[0][0], s
    return fn_program(f, (t(2),))

@case("syntax")
def y_zip_unzip_star():
    def f(x):
        pairs = [(x, 1), (x * 2, 2)]
        ts, ns = zip(*pairs)
        return sum(ts), ns
    return fn_program(f, (t(2),))

@case("syntax")
def y_integer_float_bool_arith_types():
    def f(x):
        a = True + True
        b = 7 / 2
        c = 7 // 2
        d = -7 // 2
        e = 2 ** -1
        return x * a + b + c + d + e, type(b).__name__, type(e).__name__
    return fn_program(f, (t(2),))

@case("syntax")
def y_isinstance_of_torch_types():
    def f(x, m):
        return isinstance(x, torch.Tensor), isinstance(m, nn.Module), isinstance(m, nn.Linear), isinstance(x.shape, tuple), isinstance(x.dtype, torch.dtype), x * 2
    return fn_program(f, (t(2), nn.Linear(1, 1)))

@case("syntax")
def y_list_remove_and_clear():
    def f(x):
        l = [1, 2, 3, 2]
        l.remove(2)
        k = l[:]
        l.clear()
        return x * len(k), k, l
    return fn_program(f, (t(2),))

@case("syntax")
def y_list_remove_missing_raises():
    def f(x):
        l = [1]
        try:
            l.remove(5)
        except ValueError:
            return x - 1
        return x
    return fn_program(f, (t(2),))

@case("syntax")
def y_dict_missing_key_raises_keyerror():
    def f(x, d):
        return x * d["missing"]
    return fn_program(f, (t(2), {"a": 1}))

@case("syntax")
def y_index_error_on_list_escapes():
    def f(x):
        l = [x]
        return l[3]
    return fn_program(f, (t(2),))

@case("syntax")
def y_type_error_bad_operand():
    def f(x):
        return x + "a"
    return fn_program(f, (t(2),))

@case("syntax")
def y_shape_mismatch_runtime_error():
    def f(x, y):
        return x + y
    return fn_program(f, (t(2), t(3)))
