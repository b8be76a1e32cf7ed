"""Resume code run natively: build it at a real offset, feed it what the frame held there, compare.

No tracer is involved. Each function calls `brk(...)` where a graph break would be; the resume code
starts right after that call, so its stack is the frame's stack with brk's result on top, and the
test passes exactly those values (iterators advanced, context managers entered) plus the live locals.
"""
from __future__ import annotations

import contextlib
import dis
import inspect
import types

import pytest
import torch

from kiln.capture import code as kcode
from kiln.errors import Unsupported


_RAISE: list[BaseException] = []


def brk(*args):
    if _RAISE:
        raise _RAISE[0]
    return "brk"


@contextlib.contextmanager
def brk_raises(exc: BaseException):
    _RAISE.append(exc)
    try:
        yield
    finally:
        _RAISE.clear()


def after_brk(fn, occurrence: int = 0) -> int:
    """Offset of the instruction right after the CALL that invokes `brk` (its `occurrence`th use)."""
    instrs = [i for i in dis.get_instructions(fn.__code__) if i.opname != "EXTENDED_ARG"]
    seen = -1
    for n, ins in enumerate(instrs):
        if ins.opname == "LOAD_GLOBAL" and ins.argval == "brk":
            seen += 1
            if seen == occurrence:
                call = next(m for m in range(n, len(instrs)) if instrs[m].opname == "CALL")
                return instrs[call + 1].offset
    raise AssertionError("no brk call")


def resume(fn, offset, stack, locals_: dict, null_slots=()):
    # A live local that is unbound at the break (assigned later, read on some path) is not passed:
    # it stays an unbound local of the resume code, as in the original frame. A cell variable is
    # passed as a cell (empty when unbound), as the glue passes the frame's own cell.
    cellvars = fn.__code__.co_cellvars
    live = [name for name in kcode.live_locals_at(fn.__code__, offset) if name in locals_ or name in cellvars]
    code = kcode.make_resume_code(fn.__code__, offset, len(stack) + len(null_slots), live,
                                  null_slots=null_slots)
    f = kcode.make_function(code, fn.__globals__, fn.__closure__)
    values = [(types.CellType(locals_[name]) if name in locals_ else types.CellType()) if name in cellvars
              else locals_[name] for name in live]
    return f(*stack, *values)


# ------------------------------------------------------------------------------- straight line


def straight(x):
    y = x.sin()
    brk()
    z = y.cos() + x
    return z * 2


def test_straight_line():
    x = torch.randn(4)
    off = after_brk(straight)
    assert kcode.live_locals_at(straight.__code__, off) == ("x", "y")
    out = resume(straight, off, ["brk"], {"x": x, "y": x.sin()})
    torch.testing.assert_close(out, straight(x))


def test_resume_code_shape_and_name():
    off = after_brk(straight)
    code = kcode.make_resume_code(straight.__code__, off, 1, ("x", "y"))
    assert code.co_varnames[:3] == ("___stack0", "x", "y")
    assert code.co_argcount == 3
    assert code.co_name == f"__resume_straight_at_{straight.__code__.co_firstlineno + 2}"
    assert code.co_filename == straight.__code__.co_filename


def test_same_request_gives_same_code_object():
    off = after_brk(straight)
    a = kcode.make_resume_code(straight.__code__, off, 1, ("x", "y"))
    b = kcode.make_resume_code(straight.__code__, off, 1, ["x", "y"])
    c = kcode.make_resume_code(straight.__code__, off, 1, ("y", "x"))
    assert a is b
    assert a is not c
    kcode.reset()
    assert kcode.make_resume_code(straight.__code__, off, 1, ("x", "y")) is not a


def two_breaks(x, n):
    y = x * n
    brk()
    for i in range(n):
        y = y + i
        brk(i)
    return y


def test_resume_of_a_resume_function():
    # The resume function is captured in turn and breaks again: its own code gets a resume code.
    first = kcode.make_resume_code(two_breaks.__code__, after_brk(two_breaks), 1,
                                   kcode.live_locals_at(two_breaks.__code__, after_brk(two_breaks)))
    resumed = kcode.make_function(first, two_breaks.__globals__)
    off = after_brk(resumed, occurrence=1)  # the prologue is dead code: brk(i) is the second LOAD_GLOBAL
    live = kcode.live_locals_at(first, off)
    assert live == ("y",)  # i is rebound by the loop, n was only read by range(n)
    second_code = kcode.make_resume_code(first, off, 2, live)
    # It is the resume code of the user's function at that point: a loop that breaks every
    # iteration meets the same code object (and so the same compiled entry) each time.
    assert second_code is kcode.make_resume_code(two_breaks.__code__, after_brk(two_breaks, 1), 2, live)
    second = kcode.make_function(second_code, two_breaks.__globals__)
    assert second.__code__.co_name == f"__resume_two_breaks_at_{two_breaks.__code__.co_firstlineno + 5}"
    it = iter(range(3))
    next(it)
    assert second(it, "brk", 2.0 * 3 + 0) == two_breaks(2.0, 3)


# --------------------------------------------------------------------------------------- loops


def for_loop(xs, w):
    acc = []
    for i, x in enumerate(xs):
        h = x * w
        brk(i)
        acc.append(h + i)
    return torch.stack(acc)


def test_inside_for_loop_iterator_on_stack():
    xs = [torch.randn(3) for _ in range(5)]
    w = torch.randn(3)
    expected = for_loop(xs, w)
    # Break in iteration 2: the enumerate iterator has yielded 0, 1, 2.
    it = enumerate(xs)
    for _ in range(3):
        next(it)
    acc = [xs[0] * w + 0, xs[1] * w + 1]
    off = after_brk(for_loop)
    live = kcode.live_locals_at(for_loop.__code__, off)
    assert set(live) == {"acc", "h", "i", "w"}
    out = resume(for_loop, off, [it, "brk"], {"acc": acc, "h": xs[2] * w, "i": 2, "w": w})
    torch.testing.assert_close(out, expected)


def while_loop(x, n):
    i = 0
    while i < n:
        x = x * 2
        brk()
        i += 1
    return x, i


def test_inside_while_loop():
    x = torch.ones(2)
    off = after_brk(while_loop)
    out, i = resume(while_loop, off, ["brk"], {"x": x * 4, "n": 5, "i": 1})
    assert i == 5
    torch.testing.assert_close(out, while_loop(x, 5)[0])


def branch(x, flag):
    if flag:
        y = x + 1
    else:
        y = x - 1
    return y * 3


def test_data_dependent_branch_resumes_on_both_sides():
    code = branch.__code__
    jump = next(i for i in dis.get_instructions(code) if i.opname.startswith("POP_JUMP"))
    x = torch.randn(3)
    taken = kcode.make_resume_code(code, jump.argval, 0, kcode.live_locals_at(code, jump.argval))
    fall = kcode.next_offset(code, jump.offset)
    not_taken = kcode.make_resume_code(code, fall, 0, kcode.live_locals_at(code, fall))
    f_taken = kcode.make_function(taken, branch.__globals__)
    f_fall = kcode.make_function(not_taken, branch.__globals__)
    torch.testing.assert_close(f_taken(x), branch(x, False))
    torch.testing.assert_close(f_fall(x), branch(x, True))


# ------------------------------------------------------------------------------ with blocks


def in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        brk()
        z = y + 1
    return z, torch.is_grad_enabled()


def test_inside_no_grad_exit_on_stack_and_grad_mode_restored():
    x = torch.randn(3, requires_grad=True)
    ctx = torch.no_grad()
    ctx.__enter__()
    assert not torch.is_grad_enabled()
    off = after_brk(in_no_grad)
    with torch.no_grad():
        y = x * 2
    z, inside = resume(in_no_grad, off, [ctx.__exit__, "brk"], {"y": y})
    assert torch.is_grad_enabled()
    assert inside is True  # read after the with block: grad mode back on
    assert not z.requires_grad
    torch.testing.assert_close(z, in_no_grad(x)[0])


class Recorder:
    def __init__(self, log, suppress=False):
        self.log = log
        self.suppress = suppress

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.log.append(("exit", kind.__name__ if kind else None))
        return self.suppress


def in_user_cm(log, x, fail, suppress):
    with Recorder(log, suppress) as r:
        log.append("before")
        brk()
        log.append("after")
        if fail:
            raise KeyError("boom")
    log.append(("done", r.suppress))
    return x + 1


@pytest.mark.parametrize("fail,suppress", [(False, False), (True, True), (True, False)])
def test_inside_user_context_manager(fail, suppress):
    eager_log: list = []
    try:
        expected = in_user_cm(eager_log, 1, fail, suppress)
    except KeyError:
        expected = "raised"
    log: list = []
    cm = Recorder(log, suppress)
    r = cm.__enter__()
    log.append("before")
    off = after_brk(in_user_cm)
    try:
        got = resume(in_user_cm, off, [cm.__exit__, "brk"],
                     {"log": log, "x": 1, "fail": fail, "r": r})
    except KeyError:
        got = "raised"
    assert got == expected
    assert log == eager_log


def test_resume_right_after_before_with():
    # A manager capture cannot model: the glue runs BEFORE_WITH natively and resumes with
    # [bound __exit__, __enter__'s result] on the stack, so the whole body runs in the resume code.
    code = in_user_cm.__code__
    before = next(i for i in dis.get_instructions(code) if i.opname == "BEFORE_WITH")
    off = kcode.next_offset(code, before.offset)
    for fail, suppress in [(False, False), (True, True), (True, False)]:
        eager_log: list = []
        try:
            expected = in_user_cm(eager_log, 1, fail, suppress)
        except KeyError:
            expected = "raised"
        log: list = []
        cm = Recorder(log, suppress)
        live = kcode.live_locals_at(code, off)
        assert set(live) == {"log", "x", "fail"}
        resumed = kcode.make_function(kcode.make_resume_code(code, off, 2, live), in_user_cm.__globals__)
        entered = type(cm).__enter__(cm)
        try:
            got = resumed(type(cm).__exit__.__get__(cm), entered, log, 1, fail)
        except KeyError:
            got = "raised"
        assert (got, log) == (expected, eager_log)


# -------------------------------------------------------------------------------- try blocks


def in_try(log, x, exc):
    try:
        log.append("try")
        brk()
        if exc is not None:
            raise exc
        log.append("no error")
    except ValueError as e:
        log.append(("caught", str(e)))
    finally:
        log.append("finally")
    return x * 2


@pytest.mark.parametrize("exc", [None, ValueError("v"), KeyError("k")])
def test_inside_try_except_finally(exc):
    eager_log: list = []
    try:
        expected = in_try(eager_log, 3, exc)
    except KeyError:
        expected = "raised"
    log = ["try"]
    off = after_brk(in_try)
    try:
        got = resume(in_try, off, ["brk"], {"log": log, "x": 3, "exc": exc})
    except KeyError:
        got = "raised"
    assert got == expected
    assert log == eager_log


def in_try_loop(xs):
    out = []
    for x in xs:
        try:
            brk(x)
            out.append(10 // x)
        except ZeroDivisionError:
            out.append(None)
    return out


def test_inside_try_inside_loop():
    xs = [1, 0, 2, 0, 5]
    it = iter(xs)
    next(it)
    next(it)
    off = after_brk(in_try_loop)
    out = resume(in_try_loop, off, [it, "brk"], {"out": [10], "x": 0})
    assert out == in_try_loop(xs)


def brk_call(fn, occurrence: int = 0) -> int:
    """Offset of the CALL that invokes `brk`: where it raises when it does."""
    after = after_brk(fn, occurrence)
    instrs = [i for i in dis.get_instructions(fn.__code__) if i.opname != "EXTENDED_ARG"]
    return instrs[[i.offset for i in instrs].index(after) - 1].offset


def raise_into(fn, exc, stack, locals_: dict):
    """Continue `fn` as if brk() had raised `exc`: what the glue does when the native call raises."""
    code = fn.__code__
    handler = kcode.handler_at(code, brk_call(fn))
    live = [n for n in kcode.live_locals_at(code, handler.target) if n in locals_]
    resumed = kcode.make_function(kcode.make_handler_code(code, brk_call(fn), live), fn.__globals__,
                                  fn.__closure__)
    try:  # as in the glue, the exception was raised (a `with` exit reads its __traceback__)
        raise exc
    except BaseException as caught:
        exc = caught
    return resumed(*stack[: handler.depth], exc, *[locals_[n] for n in live])


@pytest.mark.parametrize("exc", [ValueError("v"), KeyError("k")])
def test_exception_from_the_break_reaches_the_users_except_and_finally(exc):
    eager_log: list = []
    with brk_raises(exc):
        try:
            expected = in_try(eager_log, 3, None)
        except KeyError:
            expected = "raised"
    assert kcode.handler_at(in_try.__code__, brk_call(in_try)).depth == 0
    log = ["try"]
    try:
        got = raise_into(in_try, exc, [], {"log": log, "x": 3, "exc": None})
    except KeyError:
        got = "raised"
    assert (got, log) == (expected, eager_log)


@pytest.mark.parametrize("suppress", [True, False])
def test_exception_from_the_break_reaches_with_exit_and_keeps_the_line(suppress):
    eager_log: list = []
    with brk_raises(KeyError("k")):
        try:
            expected = in_user_cm(eager_log, 1, False, suppress)
        except KeyError:
            expected = "raised"
    handler = kcode.handler_at(in_user_cm.__code__, brk_call(in_user_cm))
    assert handler.depth == 1 and handler.lasti  # [__exit__], and the raising index for RERAISE
    # The pushed index must name brk's CALL in the new code object (the prologue moved everything).
    code = kcode.make_handler_code(in_user_cm.__code__, brk_call(in_user_cm), ("log", "x", "r"))
    lasti = next(i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_CONST")
    called = kcode.instruction_at(code, 2 * lasti)
    assert called.opname == "CALL"
    assert kcode.line_of(code, called.offset) == in_user_cm.__code__.co_firstlineno + 3
    log: list = []
    cm = Recorder(log, suppress)
    r = cm.__enter__()
    log.append("before")
    try:
        got = raise_into(in_user_cm, KeyError("k"), [cm.__exit__],
                         {"log": log, "x": 1, "fail": False, "r": r})
    except KeyError:
        got = "raised"
    assert (got, log) == (expected, eager_log)


def test_exception_from_the_break_restores_grad_mode():
    ctx = torch.no_grad()
    ctx.__enter__()
    with pytest.raises(ZeroDivisionError):
        raise_into(in_no_grad, ZeroDivisionError(), [ctx.__exit__], {"y": torch.ones(1)})
    assert torch.is_grad_enabled()


def test_handler_at_outside_any_block():
    assert kcode.handler_at(straight.__code__, brk_call(straight)) is None
    with pytest.raises(ValueError):
        kcode.make_handler_code(straight.__code__, brk_call(straight), ())


def test_break_inside_except_handler_is_unsupported():
    def handler(x):
        try:
            x = x + 1
        except ValueError:
            brk()
            x = 0
        return x

    off = after_brk(handler)
    with pytest.raises(Unsupported) as info:
        kcode.make_resume_code(handler.__code__, off, 1, ("x",))
    assert info.value.kind == "unsupported_bytecode"


# ------------------------------------------------------------------------------------ closures


def make_closure(k):
    def inner(x):
        y = x + k
        brk()
        return y * k
    return inner


def test_closure_free_variable():
    inner = make_closure(torch.tensor(3.0))
    x = torch.randn(2)
    off = after_brk(inner)
    assert inner.__code__.co_freevars == ("k",)
    out = resume(inner, off, ["brk"], {"y": x + 3.0})
    torch.testing.assert_close(out, inner(x))


def test_closure_cell_count_checked():
    inner = make_closure(1)
    code = kcode.make_resume_code(inner.__code__, after_brk(inner), 1, ("y",))
    with pytest.raises(ValueError):
        kcode.make_function(code, inner.__globals__, None)


def cell_vars(x, c):
    d = x * 2
    brk()
    add = lambda t: t + c + d  # noqa: E731 - the cells are made after the break on purpose
    d = d + 1
    return add(x)


def test_cell_variables_passed_as_cells():
    assert set(cell_vars.__code__.co_cellvars) == {"c", "d"}
    x = torch.randn(3)
    off = after_brk(cell_vars)
    live = kcode.live_locals_at(cell_vars.__code__, off)
    assert set(live) == {"x", "c", "d"}
    out = resume(cell_vars, off, ["brk"], {"x": x, "c": 5, "d": x * 2})
    torch.testing.assert_close(out, cell_vars(x, 5))


# ----------------------------------------------------------------------- calls and methods


def scale(x, *, factor, shift=0):
    return x * factor + shift


def kw_call(x):
    y = scale(x, factor=brk(), shift=1)
    return scale(y, factor=2)


def test_keyword_call_with_null_and_partial_call_on_stack():
    # At the break the stack is [NULL, scale, x, brk()]; KW_NAMES + CALL follow.
    x = torch.randn(3)
    off = after_brk(kw_call)
    out = resume(kw_call, off, [scale, x, 3], {}, null_slots=(0,))
    torch.testing.assert_close(out, scale(scale(x, factor=3, shift=1), factor=2))


def varargs(x, /, *args, scale, **kwargs):
    y = x * scale
    brk()
    return y + sum(args) + kwargs.get("shift", 0)


def test_varargs_kwargs_and_keyword_only_become_plain_arguments():
    off = after_brk(varargs)
    live = kcode.live_locals_at(varargs.__code__, off)
    assert set(live) == {"y", "args", "kwargs"}
    code = kcode.make_resume_code(varargs.__code__, off, 1, live)
    assert code.co_argcount == 1 + len(live) and code.co_kwonlyargcount == 0
    assert not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    values = {"y": 2.0 * 3, "args": (1, 2), "kwargs": {"shift": 10}}
    out = kcode.make_function(code, varargs.__globals__)("brk", *[values[n] for n in live])
    assert out == varargs(2.0, 1, 2, scale=3, shift=10)


class Model:
    def __init__(self):
        self.w = torch.randn(3)
        self.log = []

    def step(self, x):
        h = x * self.w
        self.log.append(brk())
        return self.finish(h, bias=1.0)

    def finish(self, h, bias):
        return h.sum() + bias


def test_method_with_method_call_on_stack():
    m = Model()
    x = torch.randn(3)
    expected = m.step(x)
    m.log.clear()
    off = after_brk(Model.step)
    # LOAD_METHOD left [list.append, m.log] below brk()'s result.
    out = resume(Model.step, off, [list.append, m.log, "brk"], {"self": m, "h": x * m.w})
    assert m.log == ["brk"]
    torch.testing.assert_close(out, expected)


class Child(Model):
    def step(self, x):
        h = x + 1
        brk()
        return super().step(h)  # zero-argument super() finds `self` in local slot 0

    def finish(self, h, bias):
        scale = lambda: self.w.sum()  # noqa: E731 - makes `self` a cell variable as well
        brk()
        return super().finish(h, bias) * scale()


def test_zero_argument_super_in_a_resumed_method():
    m = Child()
    x = torch.randn(3)
    expected = m.step(x)
    m.log.clear()
    off = after_brk(Child.step)
    assert kcode.live_locals_at(Child.step.__code__, off) == ("self", "h")
    out = resume(Child.step, off, ["brk"], {"self": m, "h": x + 1})
    torch.testing.assert_close(out, expected)
    assert m.log == ["brk"]  # Model.step ran on the right object


def test_zero_argument_super_when_self_is_a_cell():
    m = Child()
    h = torch.randn(3)
    assert "self" in Child.finish.__code__.co_cellvars
    off = after_brk(Child.finish)
    scale = lambda: m.w.sum()  # noqa: E731 - what the frame's lambda would be at the break
    out = resume(Child.finish, off, ["brk"], {"self": m, "h": h, "bias": 2.0, "scale": scale})
    torch.testing.assert_close(out, m.finish(h, 2.0))


# ------------------------------------------------------------------------- unsupported input


def test_generators_and_coroutines_are_unsupported():
    def gen(x):
        yield brk()
        yield x

    async def coro(x):
        brk()
        return x

    for fn in (gen, coro):
        with pytest.raises(Unsupported) as info:
            kcode.make_resume_code(fn.__code__, after_brk(fn), 0, ())
        assert info.value.kind == "unsupported_bytecode"


def test_bad_offsets_and_arguments():
    with pytest.raises(ValueError):
        kcode.instruction_at(straight.__code__, 1)
    with pytest.raises(ValueError):
        kcode.make_resume_code(straight.__code__, after_brk(straight), 1, ("___stack0",))
    with pytest.raises(ValueError):
        kcode.make_resume_code(straight.__code__, after_brk(straight), 1, ("x",), null_slots=(3,))


# ---------------------------------------------------------------------------- inspection


def test_instruction_at_and_next_offset():
    off = after_brk(straight)
    assert kcode.instruction_at(straight.__code__, off).opname == "POP_TOP"
    nxt = kcode.next_offset(straight.__code__, off)
    assert kcode.instruction_at(straight.__code__, nxt).opname == "LOAD_FAST"
    assert kcode.line_of(straight.__code__, off) == straight.__code__.co_firstlineno + 2


def test_live_locals_follow_exception_edges():
    def f(x, y):
        z = x + 1
        try:
            brk()
        except Exception:
            return y
        return z

    off = after_brk(f)
    assert kcode.live_locals_at(f.__code__, off) == ("y", "z")
    assert kcode.live_locals_at(f.__code__, 0) == ("x", "y")


def test_render_code_is_readable():
    off = after_brk(in_try)
    text = kcode.render_code(in_try.__code__)
    assert "code in_try" in text
    assert f"# line {in_try.__code__.co_firstlineno + 3}: brk()" in text
    assert "exception table:" in text and "lasti" in text
    resumed = kcode.make_resume_code(in_try.__code__, off, 1, kcode.live_locals_at(in_try.__code__, off))
    rtext = kcode.render_code(resumed)
    assert "args: ___stack0, log, x, exc" in rtext
    assert ">>" in rtext and "JUMP_FORWARD" in rtext


def test_resume_code_is_a_plain_code_object():
    off = after_brk(straight)
    code = kcode.make_resume_code(straight.__code__, off, 1, ("x", "y"))
    assert isinstance(code, types.CodeType)
    # The exception table of a resume inside try keeps the original depths (the segfault pitfall).
    off = after_brk(in_try)
    resumed = kcode.make_resume_code(in_try.__code__, off, 1, kcode.live_locals_at(in_try.__code__, off))
    assert sorted(e.depth for e in dis.Bytecode(resumed).exception_entries) == sorted(
        e.depth for e in dis.Bytecode(in_try.__code__).exception_entries)


def test_kiln_logs_bytecode_shows_each_new_resume_function():
    import logging

    from kiln import log

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Collect()
    logging.getLogger("kiln").addHandler(handler)
    log.configure("bytecode")
    try:
        kcode.reset()
        off = after_brk(straight)
        kcode.make_resume_code(straight.__code__, off, 1, ("x", "y"))
        kcode.make_resume_code(straight.__code__, off, 1, ("x", "y"))  # memoized: not printed again
    finally:
        log.configure("")
        logging.getLogger("kiln").removeHandler(handler)
    assert len(seen) == 1
    assert seen[0].startswith(f"__resume_straight_at_{straight.__code__.co_firstlineno + 2}: "
                              f"straight continued at offset {off} ")
    assert "code __resume_straight_at_" in seen[0] and "# line" in seen[0]


def _long_function():
    # Enough code inside the `if` that its jump needs EXTENDED_ARG: jump targets and offsets then
    # differ between dis (which lists EXTENDED_ARG) and the bytecode library (which folds it).
    body = "".join(f"        x = x + {i}\n" for i in range(160))
    source = f"def long_function(x, flag):\n    if flag:\n{body}    brk()\n" \
             "    for i in range(3):\n        x = x * 2 - i\n    return x\n"
    namespace = {"brk": brk}
    exec(compile(source, "<long_function>", "exec"), namespace)
    return namespace["long_function"]


def test_resume_after_extended_arg_jumps():
    long_function = _long_function()
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(long_function.__code__))
    off = after_brk(long_function)
    for flag in (True, False):
        start = sum(range(160)) if flag else 0
        out = resume(long_function, off, ["brk"], {"x": 1 + start})
        assert out == long_function(1, flag)
    # A jump target that is an EXTENDED_ARG means the instruction it extends.
    ext = next(i for i in dis.get_instructions(long_function.__code__) if i.opname == "EXTENDED_ARG")
    assert kcode.instruction_at(long_function.__code__, ext.offset).opname != "EXTENDED_ARG"
