"""A list, dict or set held by the closure of a method of a class defined in an enclosing function
(the class reached from the frame's closure, its instance built in the trace): the method is found
without a source, so the glue could not reach the container to replay a change. The change was
dropped (a context manager's `__enter__` appending to a log list, around a graph break: the entry
vanished); now changing such a container ends the graph where it happens and runs it as eager does.
"""
from __future__ import annotations

import pytest
import torch

import kiln


def _manager_logging_program(kind: str):
    if kind == "list":
        log: object = []

        def note(event):
            log.append(event)
    elif kind == "dict":
        log = {}

        def note(event):
            log[event] = len(log)
    else:
        log = set()

        def note(event):
            log.add(event)

    class Manager:
        def __enter__(self):
            note("enter")
            return self

        def __exit__(self, *exc):
            note("exit")
            return False

    def f(x, brk):
        with Manager():
            x = x + 1
            if brk:
                print("inside")
            x = x * 2
        return x

    return f, log


def _counting_method_program():
    calls: list = []

    class Counter:
        def bump(self, x):
            calls.append(x.shape[0])
            return x + len(calls)

    def f(x):
        return Counter().bump(x) * 2

    return f, calls


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("kind", ["list", "dict", "set"])
@pytest.mark.parametrize("brk", [True, False])
def test_manager_changes_to_a_closure_container_are_kept(backend, kind, brk, capsys) -> None:
    eager, want_log = _manager_logging_program(kind)
    want = [eager(torch.ones(2), brk) for _ in range(2)]
    kiln.reset()
    f, log = _manager_logging_program(kind)
    compiled = kiln.compile(f, backend=backend)
    got = [compiled(torch.ones(2), brk) for _ in range(2)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert log == want_log


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_method_appending_to_a_closure_list_every_call(backend) -> None:
    eager, want_calls = _counting_method_program()
    want = [eager(torch.ones(n)) for n in (2, 3, 3)]
    kiln.reset()
    f, calls = _counting_method_program()
    compiled = kiln.compile(f, backend=backend)
    got = [compiled(torch.ones(n)) for n in (2, 3, 3)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert calls == want_calls
