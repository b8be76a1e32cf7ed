import torch, contextlib, sys
from harness import case, fn_program, t, Program, kw

@case("q_fl")
def q_try_except_else_finally_order():
    log = []
    def f(x):
        try:
            log.append("try")
            y = x + 1
        except ValueError:
            log.append("exc")
            y = x
        else:
            log.append("else")
            y = y * 2
        finally:
            log.append("fin")
        return y
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_reraise_bare_caught_outer():
    def inner(x):
        try:
            raise ValueError("v1")
        except ValueError:
            x = x + 1
            raise
    def f(x):
        try:
            inner(x)
        except ValueError as e:
            return x * 2, e.args[0]
    return fn_program(f, (t(3),))

@case("q_fl")
def q_raise_from_cause_attrs():
    def f(x):
        try:
            try:
                {}["k"]
            except KeyError as e:
                raise RuntimeError("wrapped") from e
        except RuntimeError as e:
            return x + 1, type(e.__cause__).__name__, e.__suppress_context__, type(e.__context__).__name__
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_context_implicit():
    def f(x):
        try:
            try:
                1 / 0
            except ZeroDivisionError:
                raise ValueError("second")
        except ValueError as e:
            return x, type(e.__context__).__name__, e.__cause__ is None
    return fn_program(f, (t(3),))

@case("q_fl")
def q_custom_exception_attrs():
    class MyErr(Exception):
        def __init__(self, code, msg="m"):
            super().__init__(msg)
            self.code = code
    def f(x):
        try:
            raise MyErr(7, msg="boom")
        except MyErr as e:
            return x * e.code, str(e), e.args
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_hierarchy_match_order():
    class Base(Exception): pass
    class Child(Base): pass
    def f(x):
        out = []
        for E in (Child, Base, KeyError):
            try:
                raise E("z")
            except Child:
                out.append("child")
            except Base:
                out.append("base")
            except LookupError:
                out.append("lookup")
        return x + len(out), out
    return fn_program(f, (t(3),))

@case("q_fl")
def q_except_tuple_and_as_cleared():
    def f(x):
        try:
            int("zz")
        except (TypeError, ValueError) as err:
            kind = type(err).__name__
        try:
            err
            bound = True
        except NameError:
            bound = False
        return x + 1, kind, bound
    return fn_program(f, (t(3),))

@case("q_fl")
def q_finally_overrides_return():
    def g(x):
        try:
            return x + 1
        finally:
            x.add_(0)
    def h(x):
        for i in range(3):
            try:
                if i == 1:
                    break
            finally:
                x = x * 2
        return x
    def f(x):
        return g(x), h(x)
    return fn_program(f, (t(3),))

@case("q_fl")
def q_finally_return_swallows_exception():
    def g(x):
        try:
            raise ValueError
        finally:
            return x * 3
    def f(x):
        return g(x)
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_in_loop_continue():
    def f(xs):
        out = []
        for v in xs:
            try:
                if v is None:
                    raise TypeError
                out.append(v * 2)
            except TypeError:
                continue
        return out
    return fn_program(f, ([t(3), None, t(3)],))

@case("q_fl")
def q_assert_raises_assertionerror_msg():
    def f(x, n):
        try:
            assert n > 2, f"n={n}"
        except AssertionError as e:
            return x - 1, str(e)
        return x + 1
    return fn_program(f, (t(3), 1), (t(3), 5))

@case("q_fl")
def q_exception_propagates_to_caller():
    def f(x):
        y = x * 2
        raise KeyError(("k", 1))
    return fn_program(f, (t(3),))

@case("q_fl")
def q_sys_exc_info_inside_handler():
    def f(x):
        try:
            raise IndexError("ix")
        except IndexError:
            et, ev, tb = sys.exc_info()
            return x + 1, et.__name__, str(ev)
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_group_like_nested_finally():
    log = []
    def f(x):
        try:
            try:
                log.append(1)
                raise ValueError
            finally:
                log.append(2)
        except ValueError:
            log.append(3)
        finally:
            log.append(4)
        return x + len(log)
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_ctx_manager_suppress_true():
    log = []
    class Sup:
        def __enter__(self):
            log.append("enter")
            return 5
        def __exit__(self, et, ev, tb):
            log.append(et.__name__ if et else None)
            return True
    def f(x):
        with Sup() as v:
            x = x + v
            raise ValueError
        return x * 2
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_ctx_manager_exit_receives_value():
    seen = []
    class C:
        def __enter__(self):
            return self
        def __exit__(self, et, ev, tb):
            seen.append((et is KeyError, ev.args if ev else None))
            return False
    def f(x):
        try:
            with C():
                raise KeyError("kk")
        except KeyError:
            x = x + 1
        return x
    return fn_program(f, (t(3),), observe=lambda: list(seen))

@case("q_fl")
def q_contextmanager_generator_cleanup():
    log = []
    @contextlib.contextmanager
    def scope(tag):
        log.append(("in", tag))
        try:
            yield tag * 2
        finally:
            log.append(("out", tag))
    def f(x):
        with scope(1) as a, scope(2) as b:
            y = x * a + b
        return y
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_contextmanager_handles_exception():
    @contextlib.contextmanager
    def catch():
        try:
            yield
        except ZeroDivisionError:
            pass
    def f(x):
        with catch():
            x = x + 1
            1 / 0
        return x
    return fn_program(f, (t(3),))

@case("q_fl")
def q_contextlib_suppress_and_nullcontext():
    def f(x):
        with contextlib.suppress(KeyError, IndexError):
            [][1]
        with contextlib.nullcontext(x * 2) as y:
            pass
        return y
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exitstack_enter_context_order():
    log = []
    class C:
        def __init__(self, n):
            self.n = n
        def __enter__(self):
            log.append(self.n)
            return self.n
        def __exit__(self, *a):
            log.append(-self.n)
    def f(x):
        with contextlib.ExitStack() as st:
            vals = [st.enter_context(C(i)) for i in (1, 2, 3)]
            y = x * sum(vals)
        return y
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_no_grad_nested_enable_grad():
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
        return a, b, a.requires_grad, b.requires_grad
    return fn_program(f, (t(3, requires_grad=True),))

@case("q_fl")
def q_set_grad_enabled_as_function():
    def f(x):
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        y = x * 2
        torch.set_grad_enabled(prev)
        return y.requires_grad, y, torch.is_grad_enabled()
    return fn_program(f, (t(3, requires_grad=True),))

@case("q_fl")
def q_generator_send_protocol():
    def acc():
        total = 0
        while True:
            v = yield total
            if v is None:
                break
            total = total + v
    def f(x):
        g = acc()
        next(g)
        g.send(x)
        r = g.send(x * 2)
        return r
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_yield_from_return_value():
    def inner(x):
        yield x
        yield x * 2
        return "done"
    def outer(x):
        r = yield from inner(x)
        yield r
    def f(x):
        items = list(outer(x))
        return items[0] + items[1], items[2]
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_close_runs_finally():
    log = []
    def gen(x):
        try:
            yield x
            yield x * 2
        finally:
            log.append("closed")
    def f(x):
        g = gen(x)
        a = next(g)
        g.close()
        return a + 1
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_generator_throw_handled():
    def gen():
        while True:
            try:
                yield 1
            except ValueError:
                yield 99
    def f(x):
        g = gen()
        next(g)
        v = g.throw(ValueError)
        return x * v
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_stopiteration_value():
    def gen():
        yield 1
        return 42
    def f(x):
        g = gen()
        next(g)
        try:
            next(g)
        except StopIteration as e:
            return x + e.value
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_next_default():
    def f(x):
        g = (v for v in [x])
        a = next(g, None)
        b = next(g, None)
        return a, b is None
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_infinite_islice_zip():
    def nat():
        n = 0
        while True:
            yield n
            n += 1
    def f(xs):
        return [v * i for i, v in zip(nat(), xs)]
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("q_fl")
def q_generator_partial_consume_twice():
    def gen(x):
        for i in range(4):
            yield x + i
    def f(x):
        g = gen(x)
        first = [next(g) for _ in range(2)]
        rest = list(g)
        return first, rest, list(g)
    return fn_program(f, (t(3),))

@case("q_fl")
def q_generator_with_side_effect_order():
    log = []
    def gen():
        log.append("start")
        yield 1
        log.append("mid")
        yield 2
        log.append("end")
    def f(x):
        for v in gen():
            log.append(("body", v))
            x = x + v
        return x
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_match_literal_and_capture():
    def f(x, cmd):
        match cmd:
            case "double":
                return x * 2
            case ("scale", k):
                return x * k
            case {"add": v}:
                return x + v
            case [a, b, *rest]:
                return x + a + b + len(rest)
            case _:
                return x
    return fn_program(f, (t(3), "double"), (t(3), ("scale", 3)), (t(3), {"add": 4}), (t(3), [1, 2, 3, 4]), (t(3), 0))

@case("q_fl")
def q_match_class_pattern_guard():
    class Pt:
        __match_args__ = ("a", "b")
        def __init__(self, a, b):
            self.a, self.b = a, b
    def f(x, p):
        match p:
            case Pt(0, b):
                return x + b
            case Pt(a, b) if a > b:
                return x * a
            case Pt(a=a):
                return x - a
    return fn_program(f, (t(3), Pt(0, 2)), (t(3), Pt(3, 1)), (t(3), Pt(1, 3)))

@case("q_fl")
def q_match_or_pattern_and_as():
    def f(x, v):
        match v:
            case 1 | 2 as n:
                return x * n
            case int(n) if n > 10:
                return x + n
            case str() | bytes():
                return x - 1
            case None:
                return x
        return x * 0
    return fn_program(f, (t(3), 2), (t(3), 11), (t(3), "s"), (t(3), None), (t(3), 5))

@case("q_fl")
def q_match_dataclass_keyword():
    import dataclasses
    @dataclasses.dataclass
    class Op:
        kind: str
        k: float
    def f(x, op):
        match op:
            case Op(kind="mul", k=k):
                return x * k
            case Op(kind="add", k=k):
                return x + k
    return fn_program(f, (t(3), Op("mul", 2.0)), (t(3), Op("add", 1.0)))

@case("q_fl")
def q_match_mapping_rest():
    def f(x, d):
        match d:
            case {"w": w, **rest}:
                return x * w + len(rest)
    return fn_program(f, (t(3), {"w": 2, "a": 1, "b": 2}))

@case("q_fl")
def q_match_tensor_in_sequence_pattern():
    def f(pair):
        match pair:
            case (a, b):
                return a + b
            case _:
                return None
    return fn_program(f, ((t(3), t(3)),))

@case("q_fl")
def q_while_else_break():
    def f(x):
        i = 0
        while i < 5:
            if i == 7:
                break
            i += 1
        else:
            x = x + 100
        for j in range(3):
            if j == 1:
                break
        else:
            x = x - 1000
        return x
    return fn_program(f, (t(3),))

@case("q_fl")
def q_chained_comparisons_and_ternary():
    def f(x, n):
        return x * (1 if 0 < n <= 3 else -1), 1 < n < 2 < 3, (n if n else -1)
    return fn_program(f, (t(3), 2), (t(3), 5))

@case("q_fl")
def q_del_local_then_unbound():
    def f(x):
        y = x + 1
        del y
        try:
            return y
        except UnboundLocalError:
            return x * 5
    return fn_program(f, (t(3),))

@case("q_fl")
def q_nested_functions_default_mutable():
    def g(v, acc=[]):
        acc.append(1)
        return v * len(acc)
    def f(x):
        return g(x)
    return fn_program(f, (t(3),), (t(3),))

@case("q_fl")
def q_exception_raised_in_generator_propagates():
    def gen(x):
        yield x
        raise ValueError("gen")
    def f(x):
        out = []
        try:
            for v in gen(x):
                out.append(v)
        except ValueError as e:
            out.append(str(e))
        return out
    return fn_program(f, (t(3),))

@case("q_fl")
def q_ctx_manager_enter_raises():
    class Bad:
        def __enter__(self):
            raise RuntimeError("enter")
        def __exit__(self, *a):
            return True
    def f(x):
        try:
            with Bad():
                x = x * 100
        except RuntimeError:
            x = x + 1
        return x
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_with_tensor_payload():
    class TE(Exception):
        def __init__(self, val):
            self.val = val
    def f(x):
        try:
            raise TE(x * 2)
        except TE as e:
            return e.val + 1
    return fn_program(f, (t(3),))

@case("q_fl")
def q_try_finally_in_generator_with_break():
    log = []
    def gen():
        try:
            for i in range(5):
                yield i
        finally:
            log.append("fin")
    def f(x):
        for v in gen():
            if v == 2:
                break
            x = x + v
        return x
    return fn_program(f, (t(3),), observe=lambda: list(log))

@case("q_fl")
def q_stopiteration_in_user_next_loop():
    class It:
        def __init__(self):
            self.i = 0
        def __iter__(self):
            return self
        def __next__(self):
            self.i += 1
            if self.i > 2:
                raise StopIteration
            return self.i
    def f(x):
        it = It()
        a = next(it)
        return x * a + sum(it), next(it, -1)
    return fn_program(f, (t(3),))

@case("q_fl")
def q_exception_str_repr_variants():
    def f(x):
        es = [ValueError("a"), KeyError("k"), TypeError(1, 2), RuntimeError()]
        return x + len(es), [str(e) for e in es], [repr(e) for e in es]
    return fn_program(f, (t(3),))

@case("q_fl")
def q_isinstance_exception_classes():
    def f(x):
        e = KeyError("z")
        return x + isinstance(e, LookupError) + issubclass(KeyError, Exception) * 2, isinstance(e, (ValueError, IndexError))
    return fn_program(f, (t(3),))

@case("q_fl")
def q_user_ctx_tracks_tensor_state():
    class Scaled:
        def __init__(self, holder):
            self.holder = holder
        def __enter__(self):
            self.holder["k"] = self.holder["k"] * 2
            return self.holder["k"]
        def __exit__(self, *a):
            self.holder["k"] = self.holder["k"] / 2
            return False
    holder = {"k": torch.ones(3)}
    def f(x):
        with Scaled(holder) as k:
            y = x * k
        return y + holder["k"]
    return fn_program(f, (t(3),), observe=lambda: holder["k"])

@case("q_fl")
def q_generator_in_class_method_iter():
    class Seq:
        def __init__(self, vals):
            self.vals = vals
        def __iter__(self):
            for v in self.vals:
                yield v * 2
    def f(x, y):
        return sum(Seq([x, y])), list(Seq([1, 2]))
    return fn_program(f, (t(3), t(3)))
