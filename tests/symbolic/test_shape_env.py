"""ShapeEnv: symbol creation, guards (recording, dedup, rendering, eval), folding, relations, errors."""
from __future__ import annotations


import pytest
import sympy
import torch
from torch._dispatch.python import enable_python_dispatcher

import kiln
from kiln import log
from kiln.errors import DataDependentOutputError
from kiln.symbolic import (ConstraintViolation, GuardOnDataDependentSymNode, ShapeEnv, expr_of,
                           is_symbolic)


def sizes(**values: tuple[int, ...]) -> dict:
    """An `L` whose tensors have the given sizes (meta tensors: no memory)."""
    return {name: torch.empty(shape, device="meta") for name, shape in values.items()}


def pythons(env: ShapeEnv) -> list[str]:
    return [g.python for g in env.guards]


def holds(env: ShapeEnv, L: dict) -> bool:
    return all(eval(g.python, {"L": L}) for g in env.guards)


def test_create_symbol_basics():
    env = ShapeEnv()
    s = env.create_symbol(5, "L['x'].size()[0]")
    assert isinstance(s, torch.SymInt) and is_symbolic(s)
    assert env.size_hint(s) == 5 and env.size_hint(3) == 3
    assert str(expr_of(s)) == "s0"
    assert env.symbol_sources() == {"s0": "L['x'].size()[0]"}
    # the same source is the same symbol
    again = env.create_symbol(5, "L['x'].size()[0]")
    assert expr_of(again) == expr_of(s)
    with pytest.raises(ValueError):
        env.create_symbol(6, "L['x'].size()[0]")
    # backed sizes carry the >= 2 assumption as a guard
    assert pythons(env) == ["L['x'].size()[0] >= 2"]


@pytest.mark.parametrize("hint", [0, 1])
def test_zero_one_specialized(hint):
    env = ShapeEnv()
    assert env.create_symbol(hint, "L['x'].size()[0]") == hint
    assert type(env.create_symbol(hint, "L['x'].size()[0]")) is int
    assert env.guards == [] and env.symbol_sources() == {}


def test_arithmetic_and_hints():
    env = ShapeEnv()
    a = env.create_symbol(6, "L['x'].size()[0]")
    b = env.create_symbol(4, "L['x'].size()[1]")
    assert env.size_hint(a * b + 3) == 27
    assert env.size_hint(a // 4) == 1 and env.size_hint((a - 9) // 4) == -1  # Python floor division
    assert env.size_hint((a - 9) % 4) == 1  # Python modulo (sign of the divisor)
    assert env.size_hint(torch.sym_max(a, b)) == 6 and env.size_hint(torch.sym_min(a, b)) == 4
    assert str(expr_of(8 * a // (2 * a))) == "4"  # exact quotients cancel
    f = a / b
    assert isinstance(f, torch.SymFloat) and abs(float(f.node.hint) - 1.5) < 1e-12
    assert env.guards[2:] == []  # arithmetic alone never guards


def test_broadcast_folds_eq_one():
    env = ShapeEnv()
    s0 = env.create_symbol(5, "L['x'].size()[0]")
    with enable_python_dispatcher():
        x = torch.empty(s0, 8, device="meta")
        out = x + torch.empty(8, device="meta")
        out2 = x * torch.empty(s0, 1, device="meta")
        assert x.is_contiguous()
    assert [str(d) for d in out.shape] == ["s0", "8"] and [str(d) for d in out2.shape] == ["s0", "8"]
    assert pythons(env) == ["L['x'].size()[0] >= 2"]  # no Eq(s0, 1), no s0 < 2
    # direct questions about 1 fold to plain bools without a guard
    assert (s0 == 1) is False and (s0 != 1) is True and (s0 >= 2) is True and (s0 < 2) is False
    assert len(env.guards) == 1


def test_guard_recorded_once_and_renders():
    env = ShapeEnv()
    s0 = env.create_symbol(8, "L['x'].size()[0]")
    for _ in range(3):
        assert bool(s0 % 8 == 0)
        assert bool(s0 > 4) and bool(4 < s0) and bool(s0 >= 5)  # one fact, three spellings
    assert pythons(env) == ["L['x'].size()[0] >= 2", "L['x'].size()[0] % 8 == 0", "L['x'].size()[0] >= 5"]
    assert holds(env, sizes(x=(16,)))
    assert not holds(env, sizes(x=(12,)))  # 12 % 8 != 0
    assert not holds(env, sizes(x=(1,)))
    assert env.failing_guard(sizes(x=(4,))).python == "L['x'].size()[0] % 8 == 0"
    assert [g.words() for g in env.guards][1] == "x.size()[0] % 8 == 0"


def test_learnt_range_folds_later_questions():
    env = ShapeEnv()
    s0 = env.create_symbol(10, "L['x'].size()[0]")
    assert bool(s0 > 6)
    n = len(env.guards)
    assert bool(s0 > 3) and bool(s0 != 4) and not bool(s0 < 5)
    assert len(env.guards) == n  # settled by the range s0 >= 7


def test_false_branch_records_negation():
    env = ShapeEnv()
    s0 = env.create_symbol(3, "L['x'].size()[0]")
    assert not bool(s0 > 4)
    assert pythons(env)[-1] == "L['x'].size()[0] <= 4"
    assert holds(env, sizes(x=(4,))) and not holds(env, sizes(x=(5,)))


def test_relations_between_sizes_become_replacements():
    env = ShapeEnv()
    a = env.create_symbol(5, "L['x'].size()[0]")
    b = env.create_symbol(5, "L['y'].size()[1]")
    c = env.create_symbol(7, "L['z'].size()[0]")
    with enable_python_dispatcher():
        out = torch.empty(a, 8, device="meta") + torch.empty(8, b, device="meta").t()
        with pytest.raises(RuntimeError):
            torch.empty(a, 8, device="meta") + torch.empty(c, 8, device="meta")
    assert [str(d) for d in out.shape] == ["s0", "8"]
    assert "L['x'].size()[0] == L['y'].size()[1]" in pythons(env)
    # after learning s1 == s0, expressions in s1 are expressions in s0
    assert str(expr_of(b + 1)) == "s0 + 1"
    assert holds(env, {**sizes(x=(9,), y=(8, 9)), **sizes(z=(3,))})
    assert not holds(env, {**sizes(x=(9,), y=(8, 10)), **sizes(z=(3,))})


def test_guard_int_specializes():
    env = ShapeEnv()
    s0 = env.create_symbol(5, "L['x'].size()[0]")
    assert int(s0) == 5
    assert "L['x'].size()[0] == 5" in pythons(env)
    assert str(expr_of(s0 + 1)) == "6" and not is_symbolic(s0 + 1)
    assert holds(env, sizes(x=(5,))) and not holds(env, sizes(x=(6,)))
    with enable_python_dispatcher():
        parts = torch.empty(env.create_symbol(9, "L['y'].size()[0]"), device="meta").split(4)
    assert len(parts) == 3
    assert "(L['y'].size()[0] + 3) // 4 == 3" in pythons(env)


def test_mark_dynamic_constraint_names_location():
    env = ShapeEnv()
    env.location_provider = lambda: "model.py:12"
    s0 = env.create_symbol(5, "L['x'].size()[0]", constraint="dynamic")
    assert bool(s0 > 3)  # relations are fine
    with pytest.raises(ConstraintViolation) as info:
        int(s0)
    assert "model.py:12" in str(info.value) and "x.size()[0]" in str(info.value)
    assert info.value.source == "L['x'].size()[0]"
    # specialization through a linear equation (view(5, -1) of [s, 3] asks 3*s == 15)
    s1 = env.create_symbol(5, "L['z'].size()[0]", constraint="dynamic")
    with enable_python_dispatcher(), pytest.raises(ConstraintViolation, match="specialized it to 5"):
        torch.empty(s1, 3, device="meta").view(5, -1)
    # torch.compile specializes a marked dim of size 0/1 without complaint; so does Kiln
    assert env.create_symbol(1, "L['y'].size()[0]", constraint="dynamic") == 1


def test_linear_equalities_and_bounds_are_solved():
    env = ShapeEnv()
    s0 = env.create_symbol(5, "L['x'].size()[0]")
    s1 = env.create_symbol(9, "L['y'].size()[0]")
    assert bool(3 * s0 == 15)
    assert str(expr_of(s0 + 1)) == "6"  # s0 is now the constant 5
    assert bool(2 * s1 >= 15)  # s1 >= 8 (ceil of 7.5)
    n = len(env.guards)
    assert bool(s1 > 7) and len(env.guards) == n
    assert not bool(-3 * s1 + 40 < 0)  # 3*s1 <= 40: s1 <= 13
    assert bool(s1 < 14) and len(env.guards) == n + 1


def test_guards_carry_location():
    env = ShapeEnv()
    lines = iter(["f.py:3", "f.py:4"])
    env.location_provider = lambda: next(lines)
    s0 = env.create_symbol(5, "L['x'].size()[0]")
    assert bool(s0 > 3)
    # the >= 2 assumption comes from wrapping the input, not from a line of the program
    assert [g.location for g in env.guards] == [None, "f.py:3"]


def test_symbolic_int_argument():
    env = ShapeEnv()
    n = env.create_symbolic_int(3, "L['n']")
    assert env.guards == []  # ints have no range assumption
    assert bool(n == 1) is False  # decided from the hint, so guarded
    assert pythons(env) == ["L['n'] != 1"]
    assert eval(env.guards[0].python, {"L": {"n": -4}}) and not eval(env.guards[0].python, {"L": {"n": 1}})


def test_unbacked_size_oblivious_and_errors():
    env = ShapeEnv()
    env.location_provider = lambda: "f.py:9"
    u = env.create_unbacked_symint("aten.nonzero")
    assert str(expr_of(u)).startswith("u")
    with enable_python_dispatcher():
        t = torch.empty(u, 2, device="meta")
        assert [str(d) for d in t.view(-1).shape] == [str(expr_of(2 * u))]
        assert t.sum(0).shape == (2,)
        with pytest.raises(DataDependentOutputError):
            t[1:]  # the slice decomposition branches on `1 > u0`: capture must break here
    assert (u >= 0) is True  # learnt from making a tensor of size u (a runtime assert)
    assert [a.words for a in env.runtime_asserts] == ["u0 >= 0"]
    assert torch.fx.experimental.symbolic_shapes.guard_or_false(u == 3) is False  # no guard, no error
    assert (u == 1).node.guard_size_oblivious("", 0) is False  # size-oblivious: u is treated as >= 2
    with pytest.raises(GuardOnDataDependentSymNode) as info:
        bool(u > 3)
    assert isinstance(info.value, DataDependentOutputError)
    assert "aten.nonzero" in str(info.value) and "f.py:9" in str(info.value)
    with pytest.raises(DataDependentOutputError):
        env.size_hint(u)
    assert env.guards == []


def test_torch_check_on_unbacked_is_a_runtime_assert():
    env = ShapeEnv()
    u = env.create_unbacked_symint("item()")
    assert (u >= 0) is not True  # an .item() value may be negative: nothing assumed
    with pytest.raises(DataDependentOutputError):
        bool(u >= 0)
    torch._check(u >= 4)
    assert bool(u > 2)  # learnt from the assert, no hint needed
    assert env.guards == [] and [a.words for a in env.runtime_asserts] == ["u0 >= 4"]
    # equating it with a backed size makes it backed
    s = env.create_symbol(6, "L['x'].size()[0]")
    torch._check(u == s)
    assert env.size_hint(u + 1) == 7 and bool(u > 5)


def test_backed_torch_check_false_raises():
    env = ShapeEnv()
    s = env.create_symbol(6, "L['x'].size()[0]")
    with pytest.raises(RuntimeError):
        torch._check(s == 7)


def test_dynamic_log_lines(caplog):
    caplog.set_level("INFO", logger="kiln.dynamic")
    log.configure("dynamic")
    try:
        env = ShapeEnv()
        env.location_provider = lambda: "user.py:7"
        s0 = env.create_symbol(5, "L['x'].size()[0]")
        assert bool(s0 > 3)
    finally:
        log.configure("")
    err = caplog.text
    assert "create_symbol s0 = 5 for L['x'].size()[0]" in err
    assert "guard x.size()[0] >= 4  [user.py:7]" in err


def test_pow_float_and_rounding_helpers():
    env = ShapeEnv()
    s = env.create_symbol(3, "L['x'].size()[0]")
    assert env.size_hint(s ** 2) == 9
    f = s / 2
    assert isinstance(torch.sym_int(f), (torch.SymInt, int))
    assert int(torch.sym_int(f)) == 1
    assert round(float(f)) == 2
    assert isinstance(torch.sym_float(s), torch.SymFloat)
    assert math_ceil(f) == 2


def math_ceil(x):
    import math
    return int(math.ceil(x))


def test_duck_typed_entry_points_of_torch_helpers():
    env = ShapeEnv()
    s = env.create_symbol(5, "L['x'].size()[0]")
    from torch.fx.experimental.symbolic_shapes import statically_known_true, guard_or_true
    assert statically_known_true(s >= 2) and not statically_known_true(s >= 3)
    assert len(env.guards) == 1  # statically_known_true never guards
    assert guard_or_true(s >= 3) and len(env.guards) == 2  # a backed guard_or_true guards on the hint
    assert env._maybe_evaluate_static(sympy.Integer(3)) == 3


def test_steady_state_is_memoized():
    """A second identical op builds no new sympy expressions and records no new guards."""
    env = ShapeEnv()
    s0 = env.create_symbol(6, "L['x'].size()[0]")
    s1 = env.create_symbol(5, "L['x'].size()[1]")
    with enable_python_dispatcher():
        x = torch.empty(s0, s1, 16, device="meta")
        w = torch.empty(16, 4, device="meta")

        def step():
            return torch.nn.functional.layer_norm(x @ w + 1, [4]).view(-1, 2).softmax(0)

        step()
        built, guards = len(env._op_cache), len(env.guards)
        step()
    assert len(env._op_cache) == built and len(env.guards) == guards


def test_layout_predicates_and_copies():
    import copy

    env = ShapeEnv()
    s0 = env.create_symbol(6, "L['x'].size()[0]")
    n = s0.node
    sizes = [n, n.wrap_int(8)]
    assert n.is_contiguous(sizes, [n.wrap_int(8), n.wrap_int(1)]).maybe_as_bool() is True
    assert n.is_contiguous(sizes, [n.wrap_int(1), n]).guard_bool("", 0) is False
    nchw = [n.wrap_int(2), n.wrap_int(3), n, n.wrap_int(4)]
    nhwc_strides = [n.mul(n.wrap_int(12)), n.wrap_int(1), n.wrap_int(12), n.wrap_int(3)]
    assert n.is_channels_last_contiguous_2d(nchw, nhwc_strides).maybe_as_bool() is True
    assert copy.deepcopy(s0).node is s0.node and copy.copy(s0).node is s0.node


def test_constraint_registered_by_source_before_the_symbol():
    """Capture marks the source; kiln.fake's from_real then creates the symbol without knowing."""
    import kiln.fake as fake
    env = ShapeEnv()
    env.location_provider = lambda: "train.py:40"
    env.constrain("L['x'].size()[0]")
    x = fake.FakeTensorMode(shape_env=env).from_real(torch.randn(6, 4), source="L['x']", dynamic_dims=(0,))
    with pytest.raises(ConstraintViolation, match="train.py:40"):
        int(x.shape[0])


def test_negated_disjunction_becomes_separate_guards():
    """`if a < 3 or b < 3: raise` taken false (conv's size check) guards a >= 3 and b >= 3."""
    env = ShapeEnv()
    a = env.create_symbol(16, "L['x'].size()[2]")
    b = env.create_symbol(16, "L['x'].size()[3]")
    cond = torch.sym_not((a < 3) | (b < 3))
    assert bool(cond)
    assert pythons(env)[2:] == ["L['x'].size()[2] >= 3", "L['x'].size()[3] >= 3"]
    assert not bool((a < 3) | (b < 3))  # the same fact, asked the other way round: no new guard
    assert len(env.guards) == 4


def test_describe_lists_symbols_learnt_facts_and_guards():
    env = ShapeEnv()
    env.location_provider = lambda: "m.py:1"
    a = env.create_symbol(5, "L['x'].size()[0]")
    b = env.create_symbol(5, "L['y'].size()[0]")
    u = env.create_unbacked_symint("aten.nonzero")
    assert bool(a == b)
    torch._check(u >= 3)
    text = env.describe()
    assert "s1 = L['y'].size()[0]  hint=5  range=[2, inf]  -> s0" in text
    assert "u2 = unbacked, from aten.nonzero" in text
    assert "L['x'].size()[0] == L['y'].size()[0]  # m.py:1" in text
    assert "runtime asserts:\n  u2 >= 3  # m.py:1" in text


def test_int_arithmetic_past_int64_is_decided_and_large_results_are_bounded():
    # The lowering computes integer expressions in int64, Python has no width: a result or constant
    # past int64 makes the operation a constant (its operands guarded); a power, or a product already
    # past 2**31, keeps a guard that holds it within int64 for the graph's other inputs.
    env = ShapeEnv()
    n = env.create_symbolic_int(8, "L['n']")
    wide = n * 2 ** 70 + 12345
    assert not is_symbolic(wide) and wide == 8 * 2 ** 70 + 12345
    assert holds(env, {"n": 8}) and not holds(env, {"n": 9})
    env = ShapeEnv()
    n = env.create_symbolic_int(5, "L['n']")
    power = n ** 25
    assert is_symbolic(power) and env.size_hint(power) == 5 ** 25
    assert holds(env, {"n": 5}) and holds(env, {"n": -5}) and not holds(env, {"n": 11})
    env = ShapeEnv()
    a, b = env.create_symbolic_int(7, "L['a']"), env.create_symbolic_int(9, "L['b']")
    small = a * b + a  # sizes: no guard
    assert is_symbolic(small) and env.guards == []


@pytest.mark.cpp
def test_compiled_int_argument_arithmetic_past_int64_matches_python():
    # the whole stack: the lowering computes the graph's integer arithmetic in int64
    def wide(x, n):
        return x + (n * 2 ** 70 + 12345) % 1000

    def power(x, n):
        return x + (n ** 25) % 97

    for fn, values in ((wide, (3, 8, 11)), (power, (3, 5, 11, 4))):
        kiln.reset()
        compiled = kiln.compile(fn)
        for n in values:
            x = torch.zeros(2)
            assert torch.equal(compiled(x, n), fn(x, n)), (fn.__name__, n)
