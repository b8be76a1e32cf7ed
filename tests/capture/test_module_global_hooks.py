"""Global module hooks (torch.nn.modules.module.register_module_forward_hook & co.) run as in eager.

A global hook runs once per module call: around the original of a compiled module (never a second
time around the compiled wrapper, which is not a module of the program), and around every submodule
a traced forward calls. A module call traced while no global hook was registered is guarded on
their absence: registering one later recompiles (the call runs natively around the hooks), and
removing it again traces the plain forward. Compared with eager; torch.compile itself runs a global
hook twice around an OptimizedModule and skips one registered after the first call.
"""
from __future__ import annotations

import contextlib

import pytest

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

import kiln


@contextlib.contextmanager
def global_hook(register, hook):
    handle = register(hook)
    try:
        yield
    finally:
        handle.remove()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return self.inner(x).relu()


def test_global_forward_hook_runs_once_per_module_of_a_compiled_module():
    torch.manual_seed(0)
    model = Outer()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 3)
    for register, hook in ((module_hooks.register_module_forward_hook, lambda m, a, o: o + 1),
                           (module_hooks.register_module_forward_pre_hook, lambda m, a: (a[0] * 2,))):
        seen: list[str] = []

        def recording(*args, hook=hook):
            seen.append(type(args[0]).__name__)
            return hook(*args)

        with global_hook(register, recording):
            expected = model(x)
            eager_seen = list(seen)
            seen.clear()
            got = compiled(x)
        assert seen == eager_seen  # ['Linear', 'Outer'] (or reversed for pre-hooks), not the wrapper too
        torch.testing.assert_close(got, expected)


def test_global_hook_registered_after_the_first_call_runs_on_submodules():
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    model = Outer()

    def f(x):
        return lin(x) * 2

    compiled_f = kiln.compile(f, backend="eager")
    compiled_model = kiln.compile(model, backend="eager")
    x = torch.randn(1, 3)
    torch.testing.assert_close(compiled_f(x), f(x))
    torch.testing.assert_close(compiled_model(x), model(x))
    for register, hook in ((module_hooks.register_module_forward_hook, lambda m, a, o: o + 100),
                           (module_hooks.register_module_forward_pre_hook, lambda m, a: (a[0] + 1,))):
        with global_hook(register, hook):
            torch.testing.assert_close(compiled_f(x), f(x))
            torch.testing.assert_close(compiled_model(x), model(x))
        torch.testing.assert_close(compiled_f(x), f(x))  # removed again: the plain forward
        torch.testing.assert_close(compiled_model(x), model(x))


def test_hooks_on_the_wrapper_itself_still_run():
    model = nn.Linear(3, 3)
    compiled = kiln.compile(model, backend="eager")
    compiled.register_forward_hook(lambda m, a, o: o * 0)
    assert compiled(torch.randn(2, 3)).abs().sum() == 0


@pytest.mark.cpp
def test_global_hooks_do_not_run_on_kiln_graphs_under_the_default_backend():
    # The AOT trace and the ATen runner called the captured GraphModule through Module.__call__:
    # a global hook ran on it (inside the ATen trace, on its output tuple: a crash and a fallback).
    torch.manual_seed(0)
    model = Outer()
    compiled = kiln.compile(model)
    x = torch.randn(2, 3)
    seen: list[str] = []

    def hook(m, a, o):
        seen.append(type(m).__name__)
        return o + 1

    with global_hook(module_hooks.register_module_forward_hook, hook):
        expected = model(x)
        eager_seen = list(seen)
        seen.clear()
        got = compiled(x)
    assert seen == eager_seen
    torch.testing.assert_close(got, expected)


def test_global_hooks_are_inlined_around_a_module_called_in_a_function():
    # fullgraph=True: the global forward (pre-)hooks are traced around the submodule's forward as
    # the module's own are, as torch.compile does (it was a graph break); a global hook
    # with_kwargs gets the kwargs (the compiled module's wrapper passed it none: a TypeError).
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    model = Outer()
    x = torch.randn(2, 3)
    seen: list[str] = []

    def f(v):
        return lin(v) + 1

    def pre(m, a):
        seen.append("pre " + type(m).__name__)
        return (a[0] * 2,)

    def post(m, a, kwargs, o):
        seen.append(f"post {type(m).__name__} {sorted(kwargs)}")
        return o - 3

    with global_hook(module_hooks.register_module_forward_pre_hook, pre), \
            global_hook(lambda h: module_hooks.register_module_forward_hook(h, with_kwargs=True), post):
        for subject, compiled in ((f, kiln.compile(f, backend="eager", fullgraph=True)),
                                  (model, kiln.compile(model, backend="eager"))):
            seen.clear()
            expected = subject(x)
            eager_seen = list(seen)
            seen.clear()
            torch.testing.assert_close(compiled(x), expected)
            assert seen == eager_seen
