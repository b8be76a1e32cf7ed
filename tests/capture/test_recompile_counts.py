"""Kiln compiles no more often than torch.compile on programs whose state changes between calls.

Each case runs the same calls (with the same change between them) under the real
torch.compile(backend="eager") with CompileCounter, and under kiln.compile(backend="eager"): the
results must equal eager's and Kiln must make no more graphs than torch.compile does. The classes:
functions made anew by each call of their maker (guarded by code, not identity), ints in closure
cells (automatic dynamic), items and attributes the program never reads (guarded only when read),
instance attributes a module or object gains without the program reading them, modules compiled
one by one and called in any order, and train()/eval() toggles.
"""
from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls, same, torch_frame_count  # noqa: E402


def kiln_compiles(fn, calls, between=None) -> int:
    check_calls(fn, calls, between=between)  # also compares every call with eager
    return int(kiln.stats()["compiles"])


def _assert_no_more_than_torch(fn, calls, between=None, expected=None) -> None:
    ours = kiln_compiles(fn, calls, between)
    theirs = torch_frame_count(fn, calls, between)
    assert ours <= theirs, f"kiln compiled {ours} times, torch.compile {theirs}"
    if expected is not None:
        assert ours == expected


# ------------------------------------------------------------------ functions made per call


def call_it(x, g):
    return g(x) + 1


def make_scaler(k):
    def scale(y):
        return y * k
    return scale


def make_offset(k):
    return lambda y: y + k


def test_closure_made_per_call_compiles_once() -> None:
    _assert_no_more_than_torch(call_it, [(torch.randn(3), make_scaler(2)) for _ in range(5)], expected=1)


def test_lambda_made_per_call_compiles_once() -> None:
    _assert_no_more_than_torch(call_it, [(torch.randn(3), make_offset(1.5)) for _ in range(5)], expected=1)


def test_closure_over_a_changing_int_becomes_dynamic() -> None:
    _assert_no_more_than_torch(call_it, [(torch.randn(3), make_scaler(i)) for i in range(2, 10)])


def test_closure_with_other_code_recompiles() -> None:
    x = torch.ones(3)
    check_calls(call_it, [(x, make_scaler(2)), (x, make_offset(2)), (x, make_scaler(3))])


def test_function_identity_is_still_guarded_when_used() -> None:
    """A function compared with `is` (or used as a dict key) is guarded by identity after all."""
    first = make_scaler(2)

    def is_first(x, g):
        return x + (1 if g is first else 0)

    check_calls(is_first, [(torch.ones(2), first), (torch.ones(2), make_scaler(2)), (torch.ones(2), first)])

    table = {first: 10}

    def lookup(x, g):
        return x + table.get(g, 0)

    check_calls(lookup, [(torch.ones(2), first), (torch.ones(2), make_scaler(2))])


def test_closure_passed_across_a_graph_break_is_the_one_given(capsys: pytest.CaptureFixture[str]) -> None:
    def breaks(x, g):
        y = x + 1
        print("a graph break")
        return g(y)

    check_calls(breaks, [(torch.ones(2), make_scaler(2)), (torch.ones(2), make_scaler(3))])


# ------------------------------------------------------------------ items and attributes never read

CONFIG = {"lr": 1, "unused": 2, "name": "a", "nested": {"deep": 3}}
SIZES = [1, 2, 3]
SETTINGS = types.SimpleNamespace(used=1, unused=2)


def reads_one_value(x):
    return x * CONFIG["lr"]


def reads_one_item(x):
    return x + SIZES[0]


def reads_the_length(x):
    return x + len(CONFIG) + len(SIZES)


def reads_membership(x):
    return x + ("lr" in CONFIG)


def iterates_the_keys(x):
    for key in CONFIG:
        x = x + len(key)
    return x


def reads_one_attribute(x):
    return x + SETTINGS.used


def _bump(target, key):
    def change(i: int) -> None:
        if isinstance(target, dict):
            target[key] = 100 + i
        elif isinstance(target, list):
            target[key] = 100 + i
        else:
            setattr(target, key, 100 + i)
    return change


@pytest.mark.parametrize("fn, change", [
    (reads_one_value, _bump(CONFIG, "unused")),
    (reads_one_value, _bump(CONFIG, "name")),
    (reads_one_value, _bump(CONFIG["nested"], "deep")),
    (reads_one_item, _bump(SIZES, 2)),
    (reads_the_length, _bump(CONFIG, "unused")),
    (reads_membership, _bump(CONFIG, "unused")),
    (iterates_the_keys, _bump(CONFIG, "unused")),
    (reads_one_attribute, _bump(SETTINGS, "unused")),
], ids=["dict_value", "dict_string_value", "nested_dict_value", "list_item", "lengths", "membership",
        "key_iteration", "object_attribute"])
def test_a_change_the_program_never_reads_does_not_recompile(fn, change) -> None:
    _assert_no_more_than_torch(fn, [(torch.ones(2),)] * 4, between=change, expected=1)


def test_a_change_the_program_reads_still_recompiles() -> None:
    def change(i: int) -> None:
        CONFIG["lr"] = 1 + i

    try:
        check_calls(reads_one_value, [(torch.ones(2),)] * 3, between=change)
    finally:
        CONFIG["lr"] = 1


# ------------------------------------------------------------------ modules


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


def call_module(m, x):
    return m(x)


def test_instances_with_extra_unread_attributes_share_a_graph() -> None:
    a, b, c = Block(), Block(), Block()
    b.note = "extra"  # an attribute the forward never reads
    c.p, c.q = 1, 2
    d = Block()
    d.q, d.p = 2, 1  # the same names in another order
    x = torch.randn(2, 4)
    _assert_no_more_than_torch(call_module, [(m, x) for m in (a, b, c, d, a, b)], expected=1)


def test_an_instance_attribute_shadowing_a_method_recompiles() -> None:
    class WithMethod(nn.Module):
        def scale(self):
            return 2.0

        def forward(self, x):
            return x * self.scale()

    plain, shadowed = WithMethod(), WithMethod()
    shadowed.scale = lambda: 7.0
    check_calls(call_module, [(plain, torch.ones(2)), (shadowed, torch.ones(2)), (plain, torch.ones(2))])


def test_object_attribute_shadowing_a_method_after_compile() -> None:
    class Config:
        def factor(self):
            return 1.0

    config = Config()

    def uses(x):
        return x * config.factor() + (1 if hasattr(config, "extra") else 0)

    def change(i: int) -> None:
        if i == 1:
            config.factor = lambda: 5.0
        if i == 2:
            config.extra = True

    check_calls(uses, [(torch.ones(2),)] * 3, between=change)


def test_compiled_submodules_called_in_any_order() -> None:
    random.seed(0)
    blocks = [Block() for _ in range(6)]
    kiln.reset()
    compiled = [kiln.compile(b, backend="eager") for b in blocks]
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(4):
        order = list(range(6))
        random.shuffle(order)
        want, got = x, x
        for i in order:
            want, got = blocks[i](want), compiled[i](got)
        assert same(got, want)
    assert kiln.stats()["compiles"] == 1


def test_train_eval_toggles() -> None:
    class Dropper(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.lin = nn.Linear(10, 1)

        def forward(self, x):
            return self.drop(self.lin(x))

    model = Dropper()
    kiln.reset()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(10)
    for _ in range(5):
        compiled.eval()
        compiled(x)
        compiled.train()
        compiled(x)
    assert kiln.stats()["compiles"] == 2


@pytest.mark.parametrize("arguments", [{"options": {"opt_level": "-O1"}}, {"mode": "max-autotune"}])
def test_modules_compiled_one_by_one_share_their_caches(arguments) -> None:
    """The inductor backend with a mode or options is a partial made per kiln.compile call; modules
    compiled one by one with the same arguments (torch.compile on each block) share one cache per
    code object, so calling them in any order compiles the block's forward once."""
    kiln.reset()
    first, second = (kiln.compile(Block(), **arguments) for _ in range(2))
    assert first._kiln_forward._kiln_frame.cache is second._kiln_forward._kiln_frame.cache
    other = kiln.compile(Block(), options={"opt_level": "-O2"})
    assert other._kiln_forward._kiln_frame.cache is not first._kiln_forward._kiln_frame.cache
