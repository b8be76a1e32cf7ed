"""The wrapper's memory plan (kiln.lower.codegen.memory): a dead buffer's storage goes to a later one,
and never while anything can still read it.

Three kinds of check: the planner on hand-made facts (each rule that keeps a buffer from being
reused); whole graphs built to tempt it (a buffer read later through an extern's view, an output
returned as a view, a transposed read in the very kernel that allocates the candidate), compared
with eager and read line by line (no donor is named after its reuse line); and planners broken on
purpose, which those graphs must catch, so the tests above cannot pass by accident.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import sympy
import torch

import kiln.lower.codegen.wrapper as wrapper_module
from kiln.lower.codegen.memory import Allocation, MemoryFacts, MemoryPlan, check_plan, plan_memory
from kiln.lower.codegen.wrapper import WrapperWriter
from kiln.runtime import kernel_wrapper

from kiln.lower import compile_graph

from .conftest import aten_graph

F32, I64 = torch.float32, torch.int64


def _facts(allocs, last_use, *, outputs=(), aliases=(), produced=(), steps=None) -> MemoryFacts:
    allocations = tuple(Allocation(n, s, d, sympy.sympify(e)) for n, s, d, e in allocs)
    steps = steps if steps is not None else 1 + max([s for _, s, _, _ in allocs] + list(last_use.values()))
    return MemoryFacts(allocations, tuple(produced), dict(last_use), frozenset(outputs),
                       tuple(frozenset(g) for g in aliases), steps)


def test_a_dead_buffer_of_the_same_size_is_reused() -> None:
    facts = _facts([("a", 0, F32, 64), ("b", 2, F32, 64)], {"a": 1, "b": 3})
    plan = plan_memory(facts)
    assert plan.reuse == {"b": "a"} and plan.kept == {"a"}
    check_plan(facts, plan)


@pytest.mark.parametrize("why, facts", [
    ("read in the step that allocates", _facts([("a", 0, F32, 64), ("b", 2, F32, 64)], {"a": 2, "b": 3})),
    ("an output", _facts([("a", 0, F32, 64), ("b", 2, F32, 64)], {"a": 1, "b": 3}, outputs={"a"})),
    ("shares storage with an extern's view",
     _facts([("a", 0, F32, 64), ("b", 2, F32, 64)], {"a": 1, "v": 4, "b": 3}, aliases=[{"a", "v"}])),
    ("another dtype", _facts([("a", 0, I64, 64), ("b", 2, F32, 64)], {"a": 1, "b": 3})),
    ("too small", _facts([("a", 0, F32, 32), ("b", 2, F32, 64)], {"a": 1, "b": 3})),
    ("never used (no known death)", _facts([("a", 0, F32, 64), ("b", 2, F32, 64)], {"b": 3})),
])
def test_a_buffer_is_not_reused_when(why, facts) -> None:
    assert plan_memory(facts).reuse == {}, why


def test_in_place_only_for_a_buffer_the_recipient_may_overwrite() -> None:
    allocs = [("a", 0, F32, 64), ("b", 2, F32, 64)]
    facts = _facts(allocs, {"a": 2, "b": 3})
    assert plan_memory(facts).reuse == {}  # a is read in b's step
    facts = dataclasses.replace(facts, allocations=(facts.allocations[0],
                                                    dataclasses.replace(facts.allocations[1], inplace=frozenset("a"))))
    plan = plan_memory(facts)
    assert plan.reuse == {"b": "a"} and plan.kept == frozenset()  # a is freed after the kernel, as before
    check_plan(facts, plan)


def test_a_fresh_extern_result_donates() -> None:
    facts = dataclasses.replace(_facts([("b", 2, F32, 64)], {"m": 1, "b": 3}, produced=[("m", 0, 256)]),
                                results=(Allocation("m", 0, F32, sympy.Integer(64)),))
    assert plan_memory(facts).reuse == {"b": "m"}
    check_plan(facts, plan_memory(facts))


def test_keeping_a_donor_alive_must_not_raise_the_peak() -> None:
    # a (1 KiB) dies after step 0; step 1 holds a 4 KiB extern result, the peak; b needs a's size at
    # step 2. Holding a through step 1 would make the peak 5 KiB: b is allocated afresh.
    facts = _facts([("a", 0, F32, 256), ("b", 2, F32, 256)], {"a": 0, "m": 1, "b": 2},
                   produced=[("m", 1, 4096)])
    assert plan_memory(facts).reuse == {}
    # with a step that needs more than both together earlier on, the same reuse is free
    facts = _facts([("t", 0, F32, 2048), ("a", 0, F32, 256), ("b", 2, F32, 256)], {"t": 0, "a": 0, "m": 1, "b": 2},
                   produced=[("m", 1, 4096)])
    assert plan_memory(facts).reuse == {"b": "a"}


def test_a_donor_is_not_held_above_the_peak_that_other_reuses_reach() -> None:
    # x (400 B of int64) dies in step 1. Step 2 makes a 1600 B extern result m, which b (its size)
    # overwrites in place in step 3: without that reuse step 3 would hold 3200 B, with it 1600 B.
    # y needs x's size and dtype in step 4. Holding x through steps 2 and 3 stays under the 3200 B of the unplanned graph
    # but raises the planned peak from 1600 B to 2000 B: y is allocated afresh, b still reuses m.
    m = Allocation("m", 2, F32, sympy.Integer(400))
    base = _facts([("x", 0, I64, 50), ("b", 3, F32, 400), ("y", 4, I64, 50)],
                  {"x": 1, "m": 3, "b": 3, "y": 4}, produced=[("m", 2, 1600)])
    b = dataclasses.replace(base.allocations[1], inplace=frozenset({"m"}))
    facts = dataclasses.replace(base, allocations=(base.allocations[0], b, base.allocations[2]), results=(m,))
    plan = plan_memory(facts)
    assert plan.reuse == {"b": "m"}
    check_plan(facts, plan)


def test_a_larger_donor_serves_a_smaller_buffer_and_the_smallest_fit_wins() -> None:
    facts = _facts([("big", 0, F32, 1024), ("mid", 0, F32, 128), ("b", 2, F32, 100)],
                   {"big": 1, "mid": 1, "b": 3}, steps=4)
    plan = plan_memory(facts)
    assert plan.reuse == {"b": "mid"}
    check_plan(facts, plan)


def test_an_output_takes_only_a_donor_of_its_own_size() -> None:
    facts = _facts([("a", 0, F32, 128), ("out", 2, F32, 100)], {"a": 1, "out": 2}, outputs={"out"})
    assert plan_memory(facts).reuse == {}
    facts = _facts([("a", 0, F32, 100), ("out", 2, F32, 100)], {"a": 1, "out": 2}, outputs={"out"})
    assert plan_memory(facts).reuse == {"out": "a"}


def test_symbolic_sizes_reuse_only_equal_sizes_with_nothing_allocated_between() -> None:
    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    facts = _facts([("a", 0, F32, s0 * s1), ("b", 2, F32, s1 * s0)], {"a": 1, "b": 3})
    assert plan_memory(facts).reuse == {"b": "a"}
    check_plan(facts, plan_memory(facts))
    between = _facts([("a", 0, F32, s0 * s1), ("c", 2, F32, s0), ("b", 2, F32, s0 * s1)], {"a": 1, "b": 3, "c": 3})
    assert plan_memory(between).reuse == {}
    unequal = _facts([("a", 0, F32, s0 * s1 + 1), ("b", 2, F32, s0 * s1)], {"a": 1, "b": 3})
    assert plan_memory(unequal).reuse == {}


def test_a_chain_of_reuses_hands_one_storage_along() -> None:
    facts = _facts([("a", 0, F32, 64), ("b", 2, F32, 64), ("c", 4, F32, 64)], {"a": 1, "b": 3, "c": 5})
    plan = plan_memory(facts)
    assert plan.reuse == {"b": "a", "c": "b"}
    check_plan(facts, plan)


@pytest.mark.parametrize("plan", [
    MemoryPlan({"b": "a"}, frozenset({"a"})),  # a is read in b's step
    MemoryPlan({"b": "a", "c": "a"}, frozenset({"a"})),  # one donor, two recipients
])
def test_check_plan_refuses_a_plan_that_aliases_a_live_buffer(plan) -> None:
    facts = _facts([("a", 0, F32, 64), ("b", 2, F32, 64), ("c", 3, F32, 64)], {"a": 2, "b": 3, "c": 3})
    with pytest.raises(AssertionError):
        check_plan(facts, plan)


# ---------------------------------------------------------------------------------------------------
# Whole graphs built to tempt the planner


def extern_view_read_late(x, w):
    a = x.sin()
    v = torch.ops.aten.t.default(a)  # an ATen call (aten_fallback below) whose result is a view of a
    c = (x @ w).t().cos()  # a's size, allocated once a's name is dead, while v still reads a's storage
    return c @ w + v


def output_returned_as_a_view(x, w):
    a = x.sin()
    c = (a @ w).t().cos()  # a's size, allocated after a's last read; a lives on in the caller as a.t()
    return a.t(), c @ w


def transposed_read_in_the_allocating_kernel(x, w):
    a = x.sin()
    b = (a @ w).t().cos() * a.t()  # b is a's size, and its kernel reads a transposed: a may not donate to b
    return b @ w


def in_place_over_an_extern_result(x, w):
    m = x @ w
    # one kernel may overwrite m; the other reads it transposed (into a row-major result)
    return (m.sin() * 2 + m.cos(), m.t().contiguous().exp())


def layer_norm_over_a_matmul(x, w):
    return torch.nn.functional.layer_norm(x @ w, (x.shape[-1],))  # mean and variance sweep m, then overwrite it


def softmax_over_a_matmul(x, w):
    return (x @ w * 3).softmax(-1)


def softmax_then_a_sum_that_reads_the_matmul_again(x, w):
    m = x @ w
    a = (m * 3).softmax(-1)
    s = (a * a).sum(-1, keepdim=True)
    return a, m * s  # m * s is a block after a's that reads m: a may not overwrite m (m * s may)


def chain_of_same_sized_buffers(x, w):
    y = x
    for _ in range(4):
        y = (y @ w).relu() * 0.5 + y.t()  # each step: an extern, then a kernel of the same size
    return y


TEMPTING = [extern_view_read_late, output_returned_as_a_view, transposed_read_in_the_allocating_kernel,
            in_place_over_an_extern_result, chain_of_same_sized_buffers, layer_norm_over_a_matmul,
            softmax_over_a_matmul, softmax_then_a_sum_that_reads_the_matmul_again]
OPTIONS = {"aten_fallback": frozenset({"aten.t.default"})}


def _compile(fn, *args):
    gm, examples = aten_graph(fn, *args)
    return compile_graph(gm, examples, options=OPTIONS if fn is extern_view_read_late else None)


def _reuse_lines_name_no_donor_later(source: str) -> int:
    """Read the wrapper as text: after `b = a...; del a  # reuse`, no line names a; after
    `b = a  # reuse in place`, only the next line (the kernel that writes b over a) and the `del`
    right after it do. Returns the number of reuse lines."""
    lines = source.splitlines()
    found = 0
    for k, line in enumerate(lines):
        handed = re.match(r"\s+(\w+) = (\w+)(\.as_strided\(.*\))?; del \2  # reuse$", line)
        in_place = re.match(r"\s+(\w+) = (\w+)(\.as_strided\(.*\))?  # reuse in place$", line)
        if not handed and not in_place:
            continue
        found += 1
        m = handed or in_place
        assert m is not None
        donor, later = m.group(2), lines[k + 1:]
        if in_place:
            assert re.match(r"\s+kernel\d+\(", later[0]) and re.search(rf"\b{m.group(1)}\b", later[0]), later[0]
            assert re.match(rf"\s+del .*\b{donor}\b", later[1]), f"{donor} outlives the kernel that overwrote it"
            later = later[2:]
        named = [ln for ln in later if re.search(rf"\b{donor}\b", ln)]
        assert not named, f"{donor} is named after it was handed to {m.group(1)}: {named[0].strip()}"
    return found


def _inputs(n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, n, generator=g), torch.randn(n, n, generator=g) / n


def _assert_eager(fn, compiled, x, w) -> None:
    got, want = compiled(x, w), fn(x, w)
    want = want if isinstance(want, tuple) else (want,)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


@pytest.mark.cpp
@pytest.mark.parametrize("fn", TEMPTING, ids=lambda f: f.__name__)
def test_tempting_graphs_match_eager_and_reuse_only_dead_buffers(fn) -> None:
    x, w = _inputs()
    compiled = _compile(fn, x, w)
    _assert_eager(fn, compiled, x, w)
    _reuse_lines_name_no_donor_later(compiled.wrapper_source)
    writer = WrapperWriter(compiled.program, compiled._signatures)
    writer.write()
    check_plan(writer.facts, writer.plan)


@pytest.mark.cpp
def test_the_chain_reuses_and_the_cache_admits_the_source() -> None:
    x, w = _inputs()
    compiled = _compile(chain_of_same_sized_buffers, x, w)
    assert _reuse_lines_name_no_donor_later(compiled.wrapper_source) >= 2
    names = set(compiled._signatures) | kernel_wrapper.THREAD_GLOBALS | {"torch_float32"}
    names |= {n for n in re.findall(r"\b(extern_\w+)\(", compiled.wrapper_source)}
    kernel_wrapper.check_wrapper_source(compiled.wrapper_source, names)
    recipe = compiled.artifact_recipe()
    assert recipe is not None  # persistable: the cache took the source with its reuse lines
    if recipe.kind == "tiered":  # the Python wrapper's recipe, with where its native wrapper will be
        recipe = recipe.fields["python"]
    rebuilt = kernel_wrapper.load_wrapper(recipe.fields["wrapper"])
    torch.testing.assert_close(rebuilt(x, w)[0], chain_of_same_sized_buffers(x, w), atol=1e-4, rtol=1e-4)


@pytest.mark.cpp
def test_in_place_only_where_the_kernel_reads_the_donor_at_the_element_it_writes() -> None:
    x, w = _inputs()
    chain = _compile(chain_of_same_sized_buffers, x, w).wrapper_source
    assert chain.count("# reuse in place") >= 3  # each kernel overwrites the matmul result it reads
    mixed = _compile(in_place_over_an_extern_result, x, w).wrapper_source
    assert "# reuse" not in mixed  # m is also read transposed in the same kernel
    # a row's reductions read the matmul result in earlier blocks, at the elements the row's store
    # writes: the normalized row overwrites it
    for fn in (layer_norm_over_a_matmul, softmax_over_a_matmul):
        assert "# reuse in place" in _compile(fn, x, w).wrapper_source, fn.__name__
    again = _compile(softmax_then_a_sum_that_reads_the_matmul_again, x, w).wrapper_source
    _, product = re.search(r"return \((\w+), (\w+)\)", again).groups()
    assert re.findall(r"(\w+) = \w+  # reuse in place", again) == [product]


@pytest.mark.parametrize("line", ["    buf9 = buf0.clear(); del buf0  # reuse",
                                  "    buf9 = buf0.__class__; del buf0  # reuse",
                                  "    buf9 = buf0.as_strided((4,), (1,)).storage; del buf0"])
def test_the_cache_still_refuses_what_a_reuse_line_is_not(line) -> None:
    source = "def call(arg0):\n    buf0 = torch.empty_strided((4,), (1,), dtype=torch_float32)\n" \
             f"{line}\n    return (buf9,)\n"
    kernel_wrapper.check_wrapper_source(source.replace(line, "    buf9 = buf0; del buf0  # reuse"),
                                        {"torch_float32"})
    with pytest.raises(ValueError):
        kernel_wrapper.check_wrapper_source(source, {"torch_float32"})


# ---------------------------------------------------------------------------------------------------
# Planners broken on purpose: the graphs above must catch each


def _ignores_aliases_and_outputs(facts: MemoryFacts) -> MemoryPlan:
    return plan_memory(dataclasses.replace(facts, aliases=(), outputs=frozenset()))


def _anything_in_place(facts: MemoryFacts) -> MemoryPlan:
    names = frozenset(facts.last_use)
    return plan_memory(dataclasses.replace(
        facts, allocations=tuple(dataclasses.replace(a, inplace=names) for a in facts.allocations)))


def _frees_one_step_early(facts: MemoryFacts) -> MemoryPlan:
    return plan_memory(dataclasses.replace(facts, last_use={k: v - 1 for k, v in facts.last_use.items()}))


@pytest.mark.cpp
@pytest.mark.parametrize("broken, fn", [
    (_ignores_aliases_and_outputs, extern_view_read_late),
    (_ignores_aliases_and_outputs, output_returned_as_a_view),
    (_frees_one_step_early, transposed_read_in_the_allocating_kernel),
    (_anything_in_place, in_place_over_an_extern_result),
    (_anything_in_place, softmax_then_a_sum_that_reads_the_matmul_again),
])
def test_a_broken_planner_is_caught(monkeypatch, broken, fn) -> None:
    monkeypatch.setattr(wrapper_module, "plan_memory", broken)
    x, w = _inputs()
    compiled = _compile(fn, x, w)
    writer = WrapperWriter(compiled.program, compiled._signatures)
    writer.write()
    with pytest.raises(AssertionError):
        check_plan(writer.facts, writer.plan)
    # wrong values, or an output handed on and unbound (NameError in the Python wrapper; a plan,
    # which runs from the first call, raises a RuntimeError on a freed buffer it reads)
    with pytest.raises((AssertionError, NameError, RuntimeError)):
        _assert_eager(fn, compiled, x, w)



@pytest.mark.cpp
def test_a_kernel_written_in_place_declares_no_restrict_on_the_shared_storage() -> None:
    """Where the plan writes a kernel's output over an input it reads, the C++ signature must not
    promise the compiler that the two pointers never alias (`__restrict__` on both would make the
    kernel undefined behaviour); the kernel's other pointers keep it."""
    x, w = _inputs()
    compiled = _compile(chain_of_same_sized_buffers, x, w)
    shared = re.findall(r"\s+(\w+) = (\w+)  # reuse in place$", compiled.wrapper_source, re.M)
    assert shared
    for out, donor in shared:
        call = next(ln for ln in compiled.wrapper_source.splitlines()
                    if re.match(r"\s+kernel\d+\(", ln) and re.search(rf"\b{out}\b", ln))
        kernel = re.match(r"\s+(kernel\d+)\(", call).group(1)
        signature = re.search(rf"void {kernel}\(([^)]*)\)", compiled.cpp_source).group(1)
        params = {p.split()[-1]: p for p in signature.split(",")}
        for name in (out, donor):
            assert name in params and "__restrict__" not in params[name], (name, signature)
    assert "__restrict__" in compiled.cpp_source  # kernels without in-place pairs keep it


def _inference_batch_norm_then_a_matmul(x, w, b, mean, var):
    out, _saved_mean, _saved_invstd = torch.ops.aten._native_batch_norm_legit.default(x, w, b, mean, var, False,
                                                                                      0.1, 1e-5)
    return (out.t() @ x[:, :1],)  # a matmul's result of the statistics' (meta) size, allocated after them


@pytest.mark.cpp
def test_empty_batch_norm_statistics_do_not_donate() -> None:
    # ATen's CPU BatchNorm returns empty statistics in inference, where its meta kernel says one value
    # per channel: a buffer of that size handed their storage would be written out of bounds (the
    # BatchNorm runs as an ATen call here, as it does whenever its statistics are read)
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(4, 48, generator=g), torch.randn(48, generator=g), torch.randn(48, generator=g),
            torch.randn(48, generator=g), torch.rand(48, generator=g) + 0.5)
    gm, examples = aten_graph(_inference_batch_norm_then_a_matmul, *args)
    compiled = compile_graph(gm, examples,
                             options={"aten_fallback": frozenset({"aten._native_batch_norm_legit.default"})})
    assert "extern_aten__native_batch_norm_legit_default" in compiled.wrapper_source
    torch.testing.assert_close(compiled(*args)[0], _inference_batch_norm_then_a_matmul(*args)[0])
    writer = WrapperWriter(compiled.program, compiled._signatures)
    writer.write()
    produced = {name for name, _, _ in writer.facts.produced}
    donors = {a.name for a in writer.facts.results}
    statistics = {name for name in produced if re.fullmatch(r"buf\d+_[12]", name)}
    assert len(statistics) == 2 and not statistics & donors, (statistics, donors)
    check_plan(writer.facts, writer.plan)
