"""An instruction that breaks the graph inside a with-block of a user context manager (an `@` whose
shapes fake tensors refuse, `1 // d` by a dynamic zero) runs under the block: its exception reaches
the manager's __exit__, which may suppress it, as in eager.

Only calls were run under the block's handlers; a breaking binary op ran in the glue outside it, so
the exception escaped a manager that suppresses it and its __exit__ never ran.
"""
from __future__ import annotations

import pytest
import torch

import kiln


class Suppress:
    def __init__(self, log: list) -> None:
        self.log = log

    def __enter__(self) -> "Suppress":
        self.log.append("enter")
        return self

    def __exit__(self, et, ev, tb) -> bool:
        self.log.append(et.__name__ if et else "ok")
        return et in (RuntimeError, ZeroDivisionError)


def _matmul_after_print(log):
    def f(x, y):
        with Suppress(log):
            out = x + 1
            print("inside")
            out = out @ y
        return out
    return f


def _floordiv_by_int(log):
    def f(x, d):
        with Suppress(log):
            x = x + 1
            x = x / (1 // d)
        return x * 2
    return f


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("make, calls", [
    (_matmul_after_print, [(torch.ones(2, 2), torch.ones(2, 2)), (torch.ones(2, 2), torch.ones(3, 3))]),
    (_floordiv_by_int, [(torch.ones(2), 1), (torch.ones(2), 0), (torch.ones(2), 2)]),
])
def test_exception_of_a_breaking_instruction_reaches_exit(backend, make, calls, capsys) -> None:
    eager_log: list = []
    eager = make(eager_log)
    expected = [eager(*args) for args in calls]
    kiln.reset()
    log: list = []
    compiled = kiln.compile(make(log), backend=backend)
    got = [compiled(*args) for args in calls]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert log == eager_log
