"""Side effects: writes to globals, attributes, cells, lists and dicts made during
a captured frame happen after the graph runs, with eager's final values; in-place ops on inputs and
buffers show on the caller's tensors; and they replay on every cached call, not only the first."""
from __future__ import annotations

import torch
import torch.nn as nn

import kiln

COUNTER = 0
STORE: dict = {}


def run_twice(fn, make_args):
    """Run eagerly and compiled on fresh copies of the same arguments; return both argument sets."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    results = []
    for _ in range(2):
        eager_args, kiln_args = make_args(), make_args()
        expected = fn(*eager_args)
        with kiln.config.patch(suppress_errors=False):
            got = compiled(*kiln_args)
        torch.testing.assert_close(got, expected)
        results.append((eager_args, kiln_args))
    assert kiln.stats()["fallbacks"] == 0
    return results


def test_global_write_and_read_back():
    global COUNTER

    def f(x):
        global COUNTER
        COUNTER = COUNTER + 1
        return x * COUNTER

    COUNTER = 0
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(compiled(x), x * 1)
        assert COUNTER == 1
        torch.testing.assert_close(compiled(x), x * 2)  # the guard on COUNTER recompiles
    assert COUNTER == 2


def test_list_append_and_dict_update_on_inputs():
    def f(x, out, stats):
        y = x.sin()
        out.append(y)
        out.append("tag")
        stats["calls"] = stats.get("calls", 0) + 1
        stats.update(last=y)
        return y * 2

    for (eager, ours) in run_twice(f, lambda: (torch.arange(3.0), [1], {"a": 1})):
        assert len(eager[1]) == len(ours[1]) == 3
        torch.testing.assert_close(ours[1][1], eager[1][1])
        assert ours[1][2] == "tag"
        assert list(ours[2].keys()) == list(eager[2].keys())
        torch.testing.assert_close(ours[2]["last"], eager[2]["last"])


class Holder:
    def __init__(self) -> None:
        self.count = 0
        self.last = None


def test_object_and_module_attribute_writes():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x, holder):
            self.calls = self.calls + 1
            y = self.lin(x)
            holder.count += 2
            holder.last = y
            self.cache = y.detach()
            return y

    m = M()
    holder = Holder()
    kiln.reset()
    compiled = kiln.compile(m, backend="eager")
    x = torch.randn(2, 3)
    with kiln.config.patch(suppress_errors=False):
        out = compiled(x, holder)
    torch.testing.assert_close(out, m.lin(x))
    assert m.calls == 1 and holder.count == 2
    torch.testing.assert_close(holder.last, out)
    torch.testing.assert_close(m.cache, out.detach())


def test_inplace_on_buffer_and_input():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("steps", torch.zeros(()))

        def forward(self, x):
            self.steps.add_(1)
            x.mul_(2)
            return x + self.steps

    m = M()
    kiln.reset()
    compiled = kiln.compile(m, backend="eager")
    x = torch.ones(3)
    with kiln.config.patch(suppress_errors=False):
        out = compiled(x)
        compiled(torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    torch.testing.assert_close(x, torch.full((3,), 2.0))
    assert m.steps.item() == 2.0


def test_closure_cell_write():
    def make():
        total = 0

        def f(x):
            nonlocal total
            total = total + 1
            return x + total

        return f, lambda: total

    f, read = make()
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(compiled(torch.zeros(2)), torch.ones(2))
    assert read() == 1


def test_effects_before_a_break_happen_before_it():
    order = []

    def f(x, log):
        log.append("before")
        STORE["seen"] = len(log)
        print("break here")
        log.append("after")
        return x + 1

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    with kiln.config.patch(suppress_errors=False):
        compiled(torch.zeros(2), order)
    assert order == ["before", "after"]
    assert STORE["seen"] == 1


def test_local_containers_do_not_leak():
    def f(x, items):
        local = list(items)
        local.append(x)
        return torch.stack(local).sum(0)

    for eager, ours in run_twice(f, lambda: (torch.ones(2), [torch.zeros(2)])):
        assert len(ours[1]) == len(eager[1]) == 1


class _Holder:
    def __init__(self) -> None:
        self.items: list = []


def test_kwargs_renamed_and_inner_container_mutated() -> None:
    """A decorator renaming a keyword (kwargs['new'] = kwargs.pop('old')) around a body that mutates
    an object passed under the old name: the replay reads both the value and the inner container
    before the kwargs dict is rewritten (a glue that re-read kwargs['old'] raised KeyError)."""
    def f(x, **kwargs):
        kwargs["new"] = kwargs.pop("old")
        kwargs["new"].items.append(x * 2)
        return x + 1, kwargs["new"]

    kiln.reset()
    holder = _Holder()
    with kiln.config.patch(suppress_errors=False):
        out, got = kiln.compile(f, backend="eager")(torch.ones(2), old=holder)
    assert got is holder and len(holder.items) == 1
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    torch.testing.assert_close(holder.items[0], torch.full((2,), 2.0))
    assert kiln.stats()["fallbacks"] == 0
