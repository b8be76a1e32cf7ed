"""Corpus: context managers: grad modes (no_grad, enable_grad, set_grad_enabled, inference_mode,
as decorators too), autocast, @contextlib.contextmanager generators, user classes with
__enter__/__exit__, nullcontext, ExitStack, suppress, redirect_stdout, and state set inside and
restored on the way out (also when the block raises).

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import contextlib
import io

import torch

from .program import Program, case, fn_program, t

LOG: list = []


@contextlib.contextmanager
def tagged(name):
    LOG.append(("enter", name))
    try:
        yield name.upper()
    finally:
        LOG.append(("exit", name))


@contextlib.contextmanager
def grad_off():
    previous = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(previous)


class Scope:
    def __init__(self, log, name):
        self.log = log
        self.name = name

    def __enter__(self):
        self.log.append("enter " + self.name)
        return self

    def __exit__(self, kind, value, tb):
        self.log.append("exit " + self.name + (" with " + kind.__name__ if kind else ""))
        return False


class Swallow:
    def __enter__(self):
        return None

    def __exit__(self, kind, value, tb):
        return kind is ValueError


@torch.no_grad()
def _decorated_no_grad(x):
    return x * 2


@torch.enable_grad()
def _decorated_enable_grad(x):
    return x * 3


@case("context_managers")
def no_grad_block_output_requires_no_grad():
    def f(x):
        with torch.no_grad():
            y = x * 2
        z = x * 3
        return y, z, y.requires_grad, z.requires_grad
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def enable_grad_inside_no_grad():
    def f(x):
        with torch.no_grad():
            a = x + 1
            with torch.enable_grad():
                b = x * 2
        return a, b, torch.is_grad_enabled()
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def set_grad_enabled_with_flag():
    def f(x, flag):
        with torch.set_grad_enabled(flag):
            y = x * 2
        return y, y.requires_grad
    return fn_program(f, (t(2, requires_grad=True), False), (t(2, requires_grad=True), True))


@case("context_managers")
def set_grad_enabled_as_function():
    def f(x):
        torch.set_grad_enabled(False)
        y = x * 2
        torch.set_grad_enabled(True)
        return y, (x * 3).requires_grad
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def no_grad_as_decorator_called():
    def f(x):
        return _decorated_no_grad(x), (x + 1).requires_grad
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def enable_grad_as_decorator_under_no_grad():
    def f(x):
        with torch.no_grad():
            return _decorated_enable_grad(x)
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def no_grad_decorator_defined_in_frame():
    def f(x):
        @torch.no_grad()
        def inner(v):
            return v + 1
        return inner(x), x * 2
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers", fullgraph=False)
def inference_mode_block():
    def f(x):
        with torch.inference_mode():
            y = x * 2
        return y.sum(), y.is_inference()
    return fn_program(f, (t(2),))


@case("context_managers", fullgraph=False)
def grad_mode_queries():
    def f(x):
        out = x
        if torch.is_grad_enabled():
            out = out + 1
        with torch.no_grad():
            if not torch.is_grad_enabled():
                out = out * 2
        return out, torch.is_inference_mode_enabled()
    return fn_program(f, (t(2),))


@case("context_managers")
def user_context_manager_sets_grad_with_private_api():
    def f(x):
        with grad_off():
            y = x * 2
        return y, y.requires_grad, (x * 2).requires_grad
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers")
def autocast_cpu_bfloat16_matmul():
    def f(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = x @ y
        return z.dtype, z.float()
    return fn_program(f, (t(2, 2), t(2, 2)))


@case("context_managers")
def autocast_disabled_inside_enabled():
    def f(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ y
            with torch.autocast("cpu", enabled=False):
                b = x @ y
        return a.dtype, b.dtype, b
    return fn_program(f, (t(2, 2), t(2, 2)))


@case("context_managers")
def autocast_query_functions():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            enabled = torch.is_autocast_enabled("cpu")
            dtype = torch.get_autocast_dtype("cpu")
        return x + 1, enabled, dtype
    return fn_program(f, (t(2),))


@case("context_managers")
def contextmanager_generator_yields_value():
    def f(x):
        with tagged("a") as label:
            y = x * len(label)
        return y, label
    LOG.clear()
    return Program(f, ((t(2),),), observe=lambda: list(LOG))


@case("context_managers")
def contextmanager_generator_nested():
    def f(x):
        with tagged("outer"):
            with tagged("inner"):
                x = x + 1
        return x
    LOG.clear()
    return Program(f, ((t(2),),), observe=lambda: list(LOG))


@case("context_managers")
def contextmanager_defined_in_frame():
    def f(x):
        events = []

        @contextlib.contextmanager
        def step(name):
            events.append(name)
            yield
            events.append("/" + name)

        with step("a"):
            x = x * 2
        return x, events
    return fn_program(f, (t(2),))


@case("context_managers")
def contextmanager_exit_runs_when_block_raises():
    def f(x):
        try:
            with tagged("risky"):
                raise ValueError("boom")
        except ValueError:
            x = x - 1
        return x
    LOG.clear()
    return Program(f, ((t(2),),), observe=lambda: list(LOG))


@case("context_managers")
def user_class_context_manager():
    def f(x, log):
        with Scope(log, "s") as scope:
            y = x * 2
        return y, scope.name
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("context_managers")
def user_class_context_manager_sees_exception():
    def f(x, log):
        try:
            with Scope(log, "s"):
                raise KeyError("k")
        except KeyError:
            return x + 1
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("context_managers")
def context_manager_suppressing_exception():
    def f(x):
        with Swallow():
            x = x + 1
            raise ValueError("ignored")
        return x * 2
    return fn_program(f, (t(2),))


@case("context_managers")
def contextlib_suppress():
    def f(x):
        with contextlib.suppress(KeyError):
            x = x + {}["missing"]
        return x * 3
    return fn_program(f, (t(2),))


@case("context_managers")
def nullcontext_and_conditional_context():
    def f(x, use_no_grad):
        ctx = torch.no_grad() if use_no_grad else contextlib.nullcontext()
        with ctx:
            y = x * 2
        return y.requires_grad
    return fn_program(f, (t(2, requires_grad=True), True), (t(2, requires_grad=True), False))


@case("context_managers", fullgraph=False)
def exit_stack_of_contexts():
    def f(x):
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            y = x * 2
        return y.requires_grad, y
    return fn_program(f, (t(2, requires_grad=True),))


@case("context_managers", fullgraph=False)
def redirect_stdout_in_frame():
    def f(x):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            y = x + 1
        return y
    return fn_program(f, (t(2),))


@case("context_managers", fullgraph=False)
def redirect_stderr_in_frame():
    def f(x):
        with contextlib.redirect_stderr(io.StringIO()):
            y = x * 5
        return y
    return fn_program(f, (t(2),))


@case("context_managers")
def set_default_dtype_inside_frame():
    def f(x):
        torch.set_default_dtype(torch.float64)
        y = torch.ones(2)
        torch.set_default_dtype(torch.float32)
        return x + 1, y.dtype
    return fn_program(f, (t(2),))


@case("context_managers")
def disable_saved_tensors_hooks_block():
    def f(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("not allowed here"):
            y = x.sin()
        return y
    return fn_program(f, (t(2),))


@case("context_managers", fullgraph=False)
def saved_tensors_hooks_pack_unpack():
    def f(x):
        with torch.autograd.graph.saved_tensors_hooks(lambda v: v * 1, lambda v: v):
            y = x.exp()
        return y

    def drive(compiled):
        x = torch.ones(2, requires_grad=True)
        compiled(x).sum().backward()
        return x.grad
    return Program(f, drive=drive)


@case("context_managers")
def no_grad_around_module_call():
    lin = torch.nn.Linear(2, 2)

    def f(x):
        with torch.no_grad():
            frozen = lin(x)
        return frozen, lin(x), frozen.requires_grad
    return fn_program(f, (t(2),))


@case("context_managers")
def context_manager_return_inside_with():
    def f(x, log):
        with Scope(log, "ret"):
            return x * 7
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("context_managers")
def multiple_managers_in_one_with():
    def f(x, log):
        with Scope(log, "a"), Scope(log, "b") as b:
            y = x + len(b.name)
        return y
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("context_managers")
def grad_mode_restored_after_frame():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    def drive(compiled):
        out = compiled(torch.ones(2, requires_grad=True))
        enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(True)
        return out, enabled
    return Program(f, drive=drive)


def _inference(*shape):
    with torch.inference_mode():
        return t(*shape) * 1


@case("context_managers")
def inference_tensor_argument_queried():
    def f(x, w):
        return x + w, x.is_inference(), w.is_inference()
    return fn_program(f, (_inference(2), t(2)), (t(2), t(2)))


@case("context_managers", fullgraph=False)
def view_of_inference_argument_queried():
    def f(x):
        v = x[1:]
        y = x * 2
        return v.is_inference(), y.is_inference(), y
    return fn_program(f, (_inference(3),))


@case("context_managers", fullgraph=False)
def inference_mode_result_used_after_block():
    def f(x):
        with torch.inference_mode():
            y = x.sin()
        z = y[0:1]
        return z.is_inference(), (y + 1).is_inference(), y + 1
    return fn_program(f, (t(2),))


# held-out probes (probec): context_managers

@case("context_managers")
def contextmanager_user_probec():
    log = []

    @contextlib.contextmanager
    def scope(name):
        log.append("enter " + name)
        try:
            yield name.upper()
        finally:
            log.append("exit " + name)

    def f(x):
        with scope("a") as tag:
            y = x * len(tag)
        return y
    return fn_program(f, (t(3),), observe=lambda: list(log))


@case("context_managers")
def contextmanager_exception_inside_probec():
    log = []

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except ValueError:
            log.append("caught")

    def f(x):
        with guard():
            raise ValueError("x")
        return x + 1
    return fn_program(f, (t(3),), observe=lambda: list(log))


@case("context_managers")
def nullcontext_variants_probec():
    def f(x, use):
        cm = torch.no_grad() if use else contextlib.nullcontext()
        with cm:
            y = x * 2
        with contextlib.nullcontext(5) as v:
            z = y + v
        return z, z.requires_grad
    return fn_program(f, (t(3, requires_grad=True), False), (t(3, requires_grad=True), True))


@case("context_managers")
def no_grad_decorator_callee_probec():
    @torch.no_grad()
    def helper(y):
        return y * 2

    def f(x):
        z = helper(x)
        return z, z.requires_grad, (x * 2).requires_grad
    return fn_program(f, (t(3, requires_grad=True),))


@case("context_managers")
def autocast_disabled_inner_probec():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autocast("cpu", enabled=False):
                c = a @ b
            d = a @ b
        return c.dtype, d.dtype, c
    return fn_program(f, (t(2, 3), t(3, 2)))


@case("context_managers")
def contextmanager_with_return_value_and_state_probec():
    state = {"depth": 0}

    @contextlib.contextmanager
    def deeper():
        state["depth"] += 1
        try:
            yield state["depth"]
        finally:
            state["depth"] -= 1

    def f(x):
        with deeper() as a:
            with deeper() as b:
                y = x * (a * 10 + b)
        return y, state["depth"]
    return fn_program(f, (t(3),), observe=lambda: dict(state))


@case("context_managers")
def contextmanager_decorator_form_probec():
    log = []

    @contextlib.contextmanager
    def traced():
        log.append("in")
        yield
        log.append("out")

    @traced()
    def helper(y):
        return y * 2

    def f(x):
        return helper(x) + 1
    return fn_program(f, (t(3),), observe=lambda: list(log))


@case("context_managers")
def autocast_decorator_and_nested_dtype_probec():
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def mm(a, b):
        return a @ b

    def f(a, b):
        c = mm(a, b)
        return c.dtype, (a @ b).dtype, c.float()
    return fn_program(f, (t(2, 3), t(3, 2)))


# ExitStack.enter_context binds the manager's __exit__ with types.MethodType and calls a
# @contextmanager object's __enter__ through its class: both traced (they broke the graph).

@case("context_managers")
def exit_stack_enters_user_managers_and_exits_in_reverse():
    log = []

    class Scope:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append("+" + self.name)
            return len(self.name)

        def __exit__(self, kind, value, tb):
            log.append("-" + self.name)
            return False

    def f(x):
        with contextlib.ExitStack() as stack:
            sizes = [stack.enter_context(Scope(n)) for n in ("a", "bb", "ccc")]
            y = x * sum(sizes)
        return y, list(log)
    return fn_program(f, (t(3),), (t(3),))


@case("context_managers")
def exit_stack_enters_generator_managers():
    trail = []

    @contextlib.contextmanager
    def level(k):
        trail.append(("in", k))
        try:
            yield k * 10
        finally:
            trail.append(("out", k))

    def f(x):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(level(1))
            second = stack.enter_context(level(2))
            y = x + first + second
        return y
    return fn_program(f, (t(3),), observe=lambda: list(trail))


@case("context_managers")
def exit_stack_manager_suppresses_the_block_error():
    seen = []

    class Absorb:
        def __enter__(self):
            return self

        def __exit__(self, kind, value, tb):
            seen.append(None if kind is None else kind.__name__)
            return kind is ValueError

    def f(x):
        y = x * 2
        with contextlib.ExitStack() as stack:
            stack.enter_context(Absorb())
            y = y + 1
            raise ValueError("dropped")
        return y * 3
    return fn_program(f, (t(3),), observe=lambda: list(seen))
