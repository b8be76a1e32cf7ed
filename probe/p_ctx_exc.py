import contextlib
import torch
from harness import case, fn_program, t, Program, kw

class Recorder:
    def __init__(self, log):
        self.log = log
    def __enter__(self):
        self.log.append("enter")
        return self
    def __exit__(self, et, ev, tb):
        self.log.append(("exit", et.__name__ if et else None))
        return False

class Swallow:
    def __enter__(self):
        return 5
    def __exit__(self, et, ev, tb):
        return et is ValueError

@contextlib.contextmanager
def scaled(log, k):
    log.append(("in", k))
    try:
        yield k * 2
    finally:
        log.append(("out", k))

@case("ctx")
def x_no_grad_region_result_requires_grad():
    def f(x):
        with torch.no_grad():
            a = x * 2
        b = x * 3
        return a, b, a.requires_grad, b.requires_grad
    return fn_program(f, (t(3, requires_grad=True),))

@case("ctx")
def x_enable_grad_inside_no_grad():
    def f(x):
        with torch.no_grad():
            with torch.enable_grad():
                a = x * 2
            b = x * 2
        return a.requires_grad, b.requires_grad, a + b
    return fn_program(f, (t(3, requires_grad=True),))

@case("ctx")
def x_set_grad_enabled_false_fn():
    def f(x):
        torch.set_grad_enabled(False)
        a = x + 1
        torch.set_grad_enabled(True)
        return a, a.requires_grad
    return fn_program(f, (t(3, requires_grad=True),))

@case("ctx")
def x_is_grad_enabled_branch():
    def f(x):
        if torch.is_grad_enabled():
            return x * 2
        return x * 3
    def drive(cf):
        x = torch.ones(2)
        a = cf(x)
        with torch.no_grad():
            b = cf(x)
        return a, b
    return Program(f, drive=drive)

@case("ctx")
def x_autocast_cpu_bf16_matmul_dtype():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            z = y.float() + 1
        return y.dtype, z.dtype, (y.float() - (x @ w)).abs().max() < 0.5
    return fn_program(f, (t(4, 4), t(4, 4)))

@case("ctx")
def x_autocast_disabled_nested():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autocast("cpu", enabled=False):
                y = x @ x
            z = x @ x
        return y.dtype, z.dtype
    return fn_program(f, (t(3, 3),))

@case("ctx")
def x_custom_ctx_manager_log():
    log = []
    def f(x):
        with Recorder(log) as r:
            y = x * 2
            r.log.append("body")
        return y
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("ctx")
def x_custom_ctx_exit_sees_exception():
    log = []
    def f(x):
        try:
            with Recorder(log):
                raise KeyError("k")
        except KeyError:
            return x - 1
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("ctx")
def x_ctx_swallows_value_error():
    def f(x):
        y = x
        with Swallow() as k:
            y = x + k
            raise ValueError()
        return y * 2
    return fn_program(f, (t(2),))

@case("ctx")
def x_contextmanager_decorator_generator():
    log = []
    def f(x):
        with scaled(log, 3) as k:
            y = x * k
        return y
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("ctx")
def x_contextmanager_finally_on_error():
    log = []
    def f(x):
        try:
            with scaled(log, 1):
                raise RuntimeError("boom")
        except RuntimeError as e:
            return x + len(str(e))
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("ctx")
def x_nullcontext_and_exitstack():
    def f(x):
        with contextlib.nullcontext(x) as v:
            a = v * 2
        with contextlib.ExitStack() as st:
            st.enter_context(torch.no_grad())
            b = x * 3
        return a, b.requires_grad
    return fn_program(f, (t(2, requires_grad=True),))

@case("ctx")
def x_suppress():
    def f(x):
        with contextlib.suppress(IndexError):
            [][1]
        return x + 1
    return fn_program(f, (t(2),))

@case("ctx")
def x_no_grad_decorator_on_helper():
    @torch.no_grad()
    def helper(v):
        return v * 2
    def f(x):
        y = helper(x)
        return y, y.requires_grad
    return fn_program(f, (t(2, requires_grad=True),))

@case("ctx")
def x_inference_mode_region():
    def f(x):
        with torch.inference_mode():
            y = x * 2
        return y + 0, y.is_inference()
    return fn_program(f, (t(2),))

@case("ctx")
def x_default_dtype_changed_in_frame():
    def f(x):
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        y = torch.ones(2)
        torch.set_default_dtype(old)
        return y.dtype, x + y.float()
    return fn_program(f, (t(2),))

@case("ctx")
def x_ctx_manager_graph_break_inside():
    def f(x):
        with torch.no_grad():
            a = x * 2
            print("inside")
            b = a * 2
        return b, b.requires_grad
    return fn_program(f, (t(2, requires_grad=True),))

@case("ctx")
def x_custom_ctx_graph_break_inside():
    log = []
    def f(x):
        with Recorder(log):
            a = x + 1
            torch._dynamo.graph_break()
            b = a + 1
        return b
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("exceptions")
def e_try_except_else_finally_order():
    log = []
    def f(x):
        try:
            y = x + 1
        except Exception:
            log.append("except")
        else:
            log.append("else")
            y = y * 2
        finally:
            log.append("finally")
        return y
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("exceptions")
def e_raise_caught_in_frame():
    def f(x):
        try:
            if x.shape[0] > 2:
                raise ValueError("big")
            return x
        except ValueError as e:
            return x * 0, e.args
    return fn_program(f, (t(3),), (t(2),))

@case("exceptions")
def e_raise_escapes_frame():
    def f(x):
        y = x * 2
        if y.shape[0] == 3:
            raise IndexError(f"bad {y.shape[0]}")
        return y
    return fn_program(f, (t(3),), (t(2),))

@case("exceptions")
def e_exception_from_helper_caught():
    def helper(v):
        raise KeyError(v.shape[0])
    def f(x):
        try:
            helper(x)
        except KeyError as e:
            return x + e.args[0]
    return fn_program(f, (t(2),))

@case("exceptions")
def e_nested_try_reraise():
    def f(x):
        try:
            try:
                raise TypeError("inner")
            except TypeError:
                raise ValueError("outer")
        except ValueError as e:
            return x + 1, type(e.__context__).__name__
    return fn_program(f, (t(2),))

@case("exceptions")
def e_raise_from_cause():
    def f(x):
        try:
            try:
                {}["a"]
            except KeyError as k:
                raise RuntimeError("wrapped") from k
        except RuntimeError as r:
            return x, type(r.__cause__).__name__, r.__suppress_context__
    return fn_program(f, (t(2),))

@case("exceptions")
def e_user_exception_class():
    class MyErr(Exception):
        def __init__(self, code):
            super().__init__(f"code {code}")
            self.code = code
    def f(x):
        try:
            raise MyErr(7)
        except MyErr as e:
            return x * e.code, str(e)
    return fn_program(f, (t(2),))

@case("exceptions")
def e_finally_runs_on_return():
    log = []
    def f(x):
        try:
            return x + 1
        finally:
            log.append("fin")
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("exceptions")
def e_except_tuple_and_bare_raise():
    def f(x, k):
        try:
            try:
                [1, 2][k]
            except (IndexError, KeyError):
                raise
        except IndexError:
            return x - 1
        return x + 1
    return fn_program(f, (t(2), 5), (t(2), 0))

@case("exceptions")
def e_assert_passes_and_fails():
    def f(x):
        assert x.shape[0] == 2, "need two"
        return x + 1
    return fn_program(f, (t(2),), (t(3),))

@case("exceptions")
def e_stop_iteration_from_next():
    def f(x):
        it = iter([x])
        a = next(it)
        b = next(it, None)
        try:
            next(it)
        except StopIteration:
            return a * 2, b
    return fn_program(f, (t(2),))

@case("exceptions")
def e_exception_in_loop_continue():
    def f(x):
        total = x * 0
        for i in range(4):
            try:
                if i % 2:
                    raise ValueError
                total = total + i
            except ValueError:
                continue
        return total
    return fn_program(f, (t(2),))

@case("exceptions")
def e_zero_division_python():
    def f(x, d):
        try:
            return x * (1 / d)
        except ZeroDivisionError:
            return x * 0
    return fn_program(f, (t(2), 0), (t(2), 2))

@case("exceptions")
def e_attribute_error_caught():
    def f(x):
        class O: pass
        try:
            return O().missing
        except AttributeError:
            return x + 2
    return fn_program(f, (t(2),))

@case("exceptions")
def e_isinstance_of_exception_and_args():
    def f(x):
        try:
            raise ValueError(1, "two")
        except Exception as e:
            return x + e.args[0], isinstance(e, ValueError), len(e.args)
    return fn_program(f, (t(2),))

@case("exceptions")
def e_torch_error_escapes_frame():
    def f(x):
        y = x + 1
        return y.view(5)
    return fn_program(f, (t(3),))

@case("exceptions")
def e_exception_var_deleted_after_except():
    def f(x):
        try:
            raise ValueError
        except ValueError as e:
            pass
        try:
            e
            return x
        except NameError:
            return x + 1
    return fn_program(f, (t(2),))
