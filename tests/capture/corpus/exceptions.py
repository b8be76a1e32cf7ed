"""Corpus: exceptions: try/except/else/finally, raise and re-raise, custom exception classes (with
their own __init__ and attributes), exceptions leaving the frame (the caller sees eager's type),
exception chaining, assert, and side effects made before a raise.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from .program import Program, case, fn_program, t


class ShapeError(Exception):
    pass


class CodedError(ValueError):
    def __init__(self, code, message="failed"):
        super().__init__(message)
        self.code = code


class Plain(Exception):
    def __init__(self, value):
        self.value = value


@case("exceptions")
def try_except_catches_raised_value_error():
    def f(x):
        try:
            raise ValueError("bad")
        except ValueError:
            return x + 1
    return fn_program(f, (t(2),))


@case("exceptions")
def try_except_else_finally_order():
    def f(x):
        order = []
        try:
            y = x * 2
            order.append("body")
        except RuntimeError:
            order.append("except")
        else:
            order.append("else")
            y = y + 1
        finally:
            order.append("finally")
        return y, order
    return fn_program(f, (t(2),))


@case("exceptions")
def finally_runs_on_return():
    def f(x, log):
        try:
            return x * 2
        finally:
            log.append("cleanup")
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("exceptions", fullgraph=False)
def exception_attribute_read_in_handler():
    def f(x):
        try:
            raise CodedError(7, "with code")
        except CodedError as err:
            return x * err.code, str(err), err.args
    return fn_program(f, (t(2),))


@case("exceptions")
def custom_exception_with_python_init():
    def f(x):
        try:
            raise Plain(x.shape[0])
        except Plain as err:
            return x + err.value
    return fn_program(f, (t(3),))


@case("exceptions", fullgraph=False)
def exception_escapes_frame_with_eager_type():
    def f(x):
        if x.shape[0] != 4:
            raise ShapeError(f"expected 4 rows, got {x.shape[0]}")
        return x
    return fn_program(f, (t(3),))


@case("exceptions", fullgraph=False)
def exception_escapes_after_side_effect():
    def f(x, log):
        log.append("before")
        y = x + 1
        raise KeyError("after")
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("exceptions")
def except_tuple_of_types_and_order():
    def f(x, kind):
        try:
            if kind == 0:
                raise KeyError("k")
            if kind == 1:
                raise IndexError("i")
            raise TypeError("t")
        except (KeyError, IndexError):
            return x + 1
        except Exception:
            return x - 1
    return fn_program(f, (t(2), 0), (t(2), 1), (t(2), 2))


@case("exceptions", fullgraph=False)
def subclass_caught_by_base_handler():
    def f(x):
        try:
            raise CodedError(1)
        except ValueError as err:
            return x * 2, isinstance(err, CodedError), type(err).__name__
    return fn_program(f, (t(2),))


@case("exceptions")
def reraise_bare_in_handler_is_caught_outside():
    def f(x):
        try:
            try:
                raise RuntimeError("inner")
            except RuntimeError:
                x = x + 1
                raise
        except RuntimeError:
            x = x * 10
        return x
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_from_chains_cause():
    def f(x):
        try:
            try:
                {}["k"]
            except KeyError as inner:
                raise ValueError("outer") from inner
        except ValueError as err:
            return x + 1, type(err.__cause__).__name__
    return fn_program(f, (t(2),))


@case("exceptions")
def index_error_from_list_caught():
    def f(x):
        items = [x]
        try:
            return items[3]
        except IndexError:
            return x * 0
    return fn_program(f, (t(2),))


@case("exceptions")
def attribute_error_caught_for_optional_field():
    class Thing:
        pass

    def f(x):
        obj = Thing()
        try:
            scale = obj.scale
        except AttributeError:
            scale = 3
        return x * scale
    return fn_program(f, (t(2),))


@case("exceptions")
def zero_division_on_constants_caught():
    def f(x):
        try:
            ratio = 1 / 0
        except ZeroDivisionError:
            ratio = 0.5
        return x * ratio
    return fn_program(f, (t(2),))


@case("exceptions", fullgraph=False)
def assert_passes_and_assert_fails():
    def f(x, n):
        assert x.dim() == 1, "one dim"
        assert n > 0, f"n must be positive, got {n}"
        return x * n
    return fn_program(f, (t(2), 2), (t(2), -1))


@case("exceptions")
def exception_in_loop_continues():
    def f(x):
        total = x * 0
        for k in range(4):
            try:
                if k % 2:
                    raise ValueError(k)
                total = total + k
            except ValueError as err:
                total = total - err.args[0]
        return total
    return fn_program(f, (t(2),))


@case("exceptions")
def finally_overrides_nothing_and_updates_state():
    def f(x):
        state = {"n": 0}
        for _ in range(2):
            try:
                x = x + 1
            finally:
                state["n"] += 1
        return x, state["n"]
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_in_callee_caught_in_caller():
    def check(v):
        if v.shape[0] > 1:
            raise ShapeError("too long")
        return v

    def f(x):
        try:
            return check(x)
        except ShapeError as err:
            return x[:1], str(err)
    return fn_program(f, (t(3),))


@case("exceptions", fullgraph=False)
def exception_raised_by_torch_op_caught():
    def f(x, y):
        try:
            return x @ y
        except RuntimeError:
            return x.sum() + y.sum()
    return fn_program(f, (t(2, 3), t(2, 3)))


@case("exceptions", fullgraph=False)
def exception_type_checked_with_isinstance():
    def f(x):
        errors = [ValueError("a"), KeyError("b"), CodedError(3)]
        count = sum(1 for e in errors if isinstance(e, ValueError))
        return x * count
    return fn_program(f, (t(2),))


@case("exceptions", fullgraph=False)
def exception_object_made_not_raised():
    def f(x):
        err = CodedError(5, "kept")
        return x + err.code, err.args[0]
    return fn_program(f, (t(2),))


@case("exceptions")
def stop_iteration_from_next_in_handler():
    def f(x):
        it = iter([])
        try:
            next(it)
        except StopIteration:
            x = x + 1
        return x
    return fn_program(f, (t(2),))


@case("exceptions")
def not_implemented_error_from_method():
    class Base:
        def run(self, v):
            raise NotImplementedError

    class Impl(Base):
        def run(self, v):
            return v * 2

    def f(x):
        try:
            return Base().run(x)
        except NotImplementedError:
            return Impl().run(x)
    return fn_program(f, (t(2),))


@case("exceptions", fullgraph=False)
def exception_escapes_from_nested_call_with_global_write():
    state = {"calls": 0}

    def inner(v):
        state["calls"] += 1
        raise RuntimeError("inner failed")

    def f(x):
        y = x + 1
        return inner(y)
    return Program(f, ((t(2),), (t(2),)), observe=lambda: state["calls"])


@case("exceptions")
def try_finally_with_break_in_loop():
    def f(x, log):
        for k in range(5):
            try:
                if k == 2:
                    break
                x = x + k
            finally:
                log.append(k)
        return x
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("exceptions")
def exception_with_args_and_str():
    def f(x):
        try:
            raise KeyError("missing", 3)
        except KeyError as err:
            return x + err.args[1], len(err.args)
    return fn_program(f, (t(2),))


@case("exceptions")
def exception_group_like_nested_handlers():
    def f(x):
        out = []
        for kind in (ValueError, TypeError):
            try:
                try:
                    raise kind("x")
                except TypeError:
                    out.append("inner")
            except ValueError:
                out.append("outer")
        return x * len(out), out
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_type_not_instance():
    def f(x):
        try:
            raise ValueError
        except ValueError as err:
            return x + 1, err.args
    return fn_program(f, (t(2),))


@case("exceptions", fullgraph=False)
def user_exception_with_init_caught_while_containers_are_live():
    def f(x, y):
        items = [x, y * 2]
        table = {"a": y}
        try:
            raise CodedError(9)
        except CodedError as err:
            x = x * err.code
        return x, items, table
    return fn_program(f, (t(2), t(2)))


@case("exceptions")
def raising_in_handler_sets_context():
    def f(x):
        try:
            try:
                raise KeyError("first")
            except KeyError:
                raise ValueError("second")
        except ValueError as err:
            ctx = err.__context__
            return x + 1, type(ctx).__name__, ctx.args, err.__cause__ is None, err.__suppress_context__
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_from_none_suppresses_context():
    def f(x):
        try:
            try:
                {}["k"]
            except KeyError:
                raise ValueError("clean") from None
        except ValueError as err:
            return x * 2, err.__cause__ is None, err.__suppress_context__, type(err.__context__).__name__
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_from_exception_class_makes_instance():
    def f(x):
        try:
            raise ValueError("outer") from KeyError
        except ValueError as err:
            cause = err.__cause__
            return x - 1, isinstance(cause, KeyError), cause.args, err.__context__ is None
    return fn_program(f, (t(2),))


@case("exceptions")
def cause_assigned_then_raised():
    def f(x):
        err = CodedError(7, "coded")
        err.__cause__ = ShapeError("shape")
        try:
            raise err
        except CodedError as caught:
            return x + caught.code, str(caught.__cause__), caught.__suppress_context__
    return fn_program(f, (t(2),))


@case("exceptions")
def reraise_of_outer_while_handling_inner_breaks_cycle():
    def f(x):
        try:
            try:
                raise KeyError("a")
            except KeyError as a:
                try:
                    raise ValueError("b")
                except ValueError:
                    raise a
        except KeyError as e:
            inner = e.__context__
            return x + 3, type(inner).__name__, inner.__context__ is None
    return fn_program(f, (t(2),))


@case("exceptions")
def raise_from_non_exception_is_type_error():
    def f(x):
        try:
            raise ValueError("v") from 5
        except TypeError as err:
            return x * 0, str(err)
    return fn_program(f, (t(2),))


@case("exceptions")
def chain_through_callee_and_back():
    def load(d):
        try:
            return d["missing"]
        except KeyError as missing:
            raise CodedError(4, "load failed") from missing

    def f(x):
        try:
            return load({})
        except CodedError as err:
            return x * err.code, type(err.__cause__).__name__, err.__cause__ is err.__context__
    return fn_program(f, (t(2),))


@case("exceptions")
def chained_exception_returned_from_frame():
    def f(x):
        try:
            try:
                raise ShapeError("inner")
            except ShapeError as inner:
                raise ValueError("outer") from inner
        except ValueError as err:
            seen.append(err)
            return x + 1, err

    def chain():
        return [(type(e).__name__, e.args, type(e.__cause__).__name__, e.__cause__.args, e.__suppress_context__,
                 e.__context__ is e.__cause__) for e in seen]
    seen = []
    return Program(f, ((t(2),),), observe=chain)


@case("exceptions", fullgraph=False)
def break_inside_suppressing_manager_then_op_raises():
    # the @ after the break raises on the second call; the manager's __exit__ suppresses it
    log = []

    class Suppress:
        def __init__(self, log):
            self.log = log

        def __enter__(self):
            self.log.append("enter")
            return self

        def __exit__(self, et, ev, tb):
            self.log.append(et.__name__ if et else "ok")
            return et is RuntimeError

    def f(x, y):
        out = x * 0
        with Suppress(log):
            out = x + 1
            print("inside")
            out = out @ y
        return out
    return fn_program(f, (t(2, 2), t(2, 2)), (t(2, 2), t(3, 3)), observe=lambda: list(log))


@case("exceptions")
def sys_exc_info_inside_except():
    def f(x):
        try:
            raise ValueError("coded", 7)
        except ValueError:
            kind, value, tb = sys.exc_info()
            return x + value.args[1], kind is ValueError, value.args[0], tb is not None
    return fn_program(f, (t(2),))


@case("exceptions")
def sys_exception_in_nested_handlers_and_callee():
    def current():
        return sys.exception()

    def f(x):
        try:
            raise KeyError("outer")
        except KeyError as outer:
            try:
                raise IndexError("inner")
            except IndexError:
                inner = current()  # the innermost handled exception, from a callee
            back = sys.exception()  # the inner handler ended: the outer one again
            return x * 2, type(inner).__name__, back is outer, sys.exc_info()[1] is outer
    return fn_program(f, (t(2),))


@case("exceptions")
def exc_info_traceback_identity_and_reraise():
    def f(x):
        try:
            try:
                raise ValueError("v")
            except ValueError as e:
                tb = sys.exc_info()[2]
                same = tb is e.__traceback__
                raise
        except ValueError as again:
            return x - 1, same, again.__traceback__ is not None
    return fn_program(f, (t(2),))


@case("exceptions")
def constant_methods_and_len_raise_in_the_frame():
    # what a builtin or a method of a constant raises at trace time is the frame's to catch
    def f(x, text):
        out = []
        try:
            out.append(len(7))
        except TypeError:
            out.append("len")
        try:
            out.append(text.index("z"))
        except ValueError:
            out.append(-1)
        return x + len(out), out
    return fn_program(f, (t(2), "abc"), (t(2), "xyz"))


@case("exceptions")
def exit_stack_with_callbacks_outside_any_handler():
    # ExitStack.__exit__ asks sys.exc_info() for the caller's exception: None, guarded
    log = []

    def f(x):
        with contextlib.ExitStack() as stack:
            stack.callback(log.append, "first")
            stack.callback(log.append, "second")
            x = x * 2
        return x + len(log)
    return fn_program(f, (t(2),), (t(2),), observe=lambda: list(log))


@case("exceptions")
def with_traceback_returns_the_exception():
    def f(x):
        try:
            raise ValueError("w")
        except ValueError as e:
            cleared = e.with_traceback(None)
            return x + 1, cleared is e, e.__traceback__ is None
    return fn_program(f, (t(2),))
