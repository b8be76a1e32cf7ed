"""Tier-up (kiln.runtime.native.TieredWrapper): a CPU graph runs its Python wrapper first and, once
called config.native_wrapper_after times, its native wrapper, built on a background thread. The
outputs and gradients stay eager's across the switch, a build that fails keeps the Python wrapper
with one warning, small or cold graphs are never built, and a graph stored on disk comes back with
its native wrapper in a process after the one that built it."""
from __future__ import annotations

import functools
import hashlib
import os
import warnings
from typing import Any

import pytest
import torch

import kiln
from kiln import config
from kiln.lower import compile_graph
from kiln.runtime import artifact, build, native
from tests.lower.conftest import aten_graph


@pytest.fixture(autouse=True)
def _compiled_native_wrappers(monkeypatch: pytest.MonkeyPatch) -> Any:
    """These tests are about each graph's own compiled C++ wrapper; plans (config.native_plan) have
    theirs in tests/runtime/test_native_plan.py. Subprocesses get the setting through the environment."""
    monkeypatch.setenv("KILN_NATIVE_PLAN", "0")
    with config.patch(native_plan=False):
        yield

pytestmark = pytest.mark.cpp

_WAIT_S = 600  # a fresh cache builds the precompiled header first (tens of seconds on two cores)


def _is_native(fn: Any) -> bool:
    return isinstance(fn, functools.partial) and fn.func is native.boundary().call


def _block(x, w, b):
    h = torch.addmm(b, x, w).relu()
    return torch.softmax(h @ w.t(), -1) * 2, h.sum(0)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(6, 5), torch.randn(5, 5), torch.randn(5)]


def _tiered(after: int) -> Any:
    args = _inputs()
    gm, examples = aten_graph(_block, *args)
    with config.patch(cpu_wrapper="auto", native_wrapper_after=after):
        compiled = compile_graph(gm, examples)
    assert isinstance(compiled.fn, native.TieredWrapper)
    return compiled, args


def test_a_hot_graph_switches_to_its_native_wrapper_and_computes_the_same() -> None:
    compiled, args = _tiered(after=3)
    want = _block(*args)
    firsts = [compiled(*args) for _ in range(3)]  # the third call starts the build
    assert not _is_native(compiled.fn.current) and compiled.fn.future is not None
    assert native.wait_for_tier_up(_WAIT_S)
    after = compiled(*args)  # picks the finished build up, and runs it
    assert _is_native(compiled.fn.current) and compiled.fn.after is None
    for got in firsts + [after, compiled(*args)]:
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    same = [torch.equal(p, n) for p, n in zip(firsts[0], after)]
    assert all(same), "the native wrapper runs the Python wrapper's kernels: bit for bit the same"


def test_a_build_that_fails_keeps_the_python_wrapper_with_one_warning(monkeypatch: Any) -> None:
    compiled, args = _tiered(after=1)

    def broken(source: str) -> Any:
        raise build.BuildError("the compiler is gone")

    monkeypatch.setattr(native, "load_graph_library", broken)
    compiled(*args)
    assert native.wait_for_tier_up(_WAIT_S)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got = compiled(*args)
    messages = [str(w.message) for w in caught if "native wrapper" in str(w.message)]
    assert len(messages) == 1 and "the compiler is gone" in messages[0]
    assert compiled.fn.current is compiled.fn.python and compiled.fn.after is None
    for g, w in zip(got, _block(*args)):
        torch.testing.assert_close(g, w)


def test_cold_and_one_step_graphs_are_not_built() -> None:
    args = _inputs()
    gm, examples = aten_graph(_block, *args)
    with config.patch(cpu_wrapper="auto", native_wrapper_after=0):
        assert not isinstance(compile_graph(gm, examples).fn, native.TieredWrapper)
    with config.patch(cpu_wrapper="python"):
        assert not isinstance(compile_graph(gm, examples).fn, native.TieredWrapper)
    one, one_examples = aten_graph(lambda x: (torch.sin(x) + 1,), torch.randn(8))
    with config.patch(cpu_wrapper="auto", native_wrapper_after=1, native_plan=False):
        small = compile_graph(one, one_examples)
    assert not isinstance(small.fn, native.TieredWrapper)  # one kernel: no compiled wrapper pays back
    with config.patch(cpu_wrapper="auto", native_wrapper_after=1, native_plan=True):
        planned = compile_graph(one, one_examples)
    # its plan costs no build (test_native_plan.py::test_a_graph_of_one_step_runs_its_plan_too)
    assert isinstance(planned.fn, native.TieredWrapper) and planned.fn.name.endswith("(plan)")
    compiled, args = _tiered(after=50)
    submitted = native.BACKGROUND.pending
    for _ in range(49):
        compiled(*args)
    assert compiled.fn.future is None and native.BACKGROUND.pending == submitted  # not hot yet


def test_training_switches_forward_and_backward_and_the_gradients_stay_eagers() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    kiln.reset()
    with config.patch(native_wrapper_after=2):
        compiled = kiln.compile(model)
        for step in range(5):
            if step == 2:
                assert native.wait_for_tier_up(_WAIT_S)
            x = torch.randn(5, 8)
            loss = compiled(x).square().mean()
            loss.backward()
            expected = reference(x).square().mean()
            expected.backward()
            torch.testing.assert_close(loss, expected)
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad)
    kiln.reset()


def _stored_recipe(rows: int) -> tuple[Any, list[torch.Tensor]]:
    """The recipe the frame cache stores for a graph (round-tripped through its record format),
    on a shape no other test uses, so that no library of its native wrapper exists yet."""
    from kiln.capture import persist

    torch.manual_seed(rows)
    args = [torch.randn(rows, 5), torch.randn(5, 5), torch.randn(5)]
    gm, examples = aten_graph(_block, *args)
    with config.patch(cpu_wrapper="auto", native_wrapper_after=10**6):
        compiled = compile_graph(gm, examples)
    recipe = artifact.describe(compiled.fn)
    assert recipe is not None and recipe.kind == "tiered" and recipe.fields["python"].kind == "wrapper"
    return persist.loads(persist.dumps(recipe)), args


def test_a_stored_graph_tiers_up_in_a_later_process_and_then_loads_native() -> None:
    rows = 1000 + int.from_bytes(os.urandom(2), "little")  # a new source, so a new library, per run
    recipe, args = _stored_recipe(rows)
    ref = recipe.fields["native"]
    assert isinstance(ref, native.NativeRef) and not any(build.load_cached(r) for r in ref.graph_libraries)
    with config.patch(native_wrapper_after=2):
        loaded = artifact.rebuild(recipe)  # what a later process rebuilds: no library yet, so Python first
    assert isinstance(loaded, native.TieredWrapper) and not _is_native(loaded.current)
    loaded(*args)
    loaded(*args)  # hot: the stored program is read and checked, its source written and built
    assert native.wait_for_tier_up(_WAIT_S)
    got = loaded(*args)
    assert _is_native(loaded.current)
    again = artifact.rebuild(recipe)  # a process after that one: the built library, at once
    assert _is_native(again)
    for outs in (got, again(*args)):  # a sum over many rows: eager adds in another order
        for g, w in zip(outs, _block(*args)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_stored_program_that_is_not_the_recorded_one_is_not_built() -> None:
    import dataclasses

    recipe, args = _stored_recipe(999)
    ref = recipe.fields["native"]
    forged = dataclasses.replace(ref, program=(ref.program[0], "0" * 64),
                                 graph_libraries=tuple(r + ".none" for r in ref.graph_libraries))
    python = artifact.rebuild(recipe.fields["python"])
    with config.patch(native_wrapper_after=1):
        loaded = native.load_tiered(python, forged)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = loaded(*args)
    assert any("not the stored one" in str(w.message) for w in caught)
    assert loaded.current is python and loaded.after is None
    for g, w in zip(got, _block(*args)):
        torch.testing.assert_close(g, w)


def test_a_stored_program_with_a_name_that_is_code_is_not_built(tmp_path: Any) -> None:
    """A record that matches its recorded hash (a same-user forgery) but names a kernel with C++ in
    it: the writer refuses the program, nothing is compiled from it, the Python wrapper keeps running."""
    import dataclasses

    from kiln.lower.schedule import Kernel
    from kiln.runtime import records, store

    recipe, args = _stored_recipe(998)
    ref = recipe.fields["native"]
    program = records.loads(store.read_sealed(store.absolute(ref.program[0])), packages=("kiln.lower.",))
    marker = tmp_path / "ran"
    evil = f'kernel0(){{}} __attribute__((constructor)) static void p(){{__builtin_puts("{marker}");}} void k'
    steps = tuple(dataclasses.replace(s, name=evil) if isinstance(s, Kernel) and s.name == "kernel0" else s
                  for s in program.steps)
    forged_body = records.dumps(dataclasses.replace(program, steps=steps))
    forged_rel = ref.program[0] + ".forged"
    assert store.write_sealed(store.absolute(ref.program[0]) + ".forged", forged_body)
    forged = dataclasses.replace(ref, program=(forged_rel, hashlib.sha256(forged_body).hexdigest()),
                                 graph_libraries=tuple(r + ".none" for r in ref.graph_libraries))
    python = artifact.rebuild(recipe.fields["python"])
    with config.patch(native_wrapper_after=1):
        loaded = native.load_tiered(python, forged)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded(*args)
        assert native.wait_for_tier_up(_WAIT_S)
        got = loaded(*args)
    assert any("not a stored program" in str(w.message) and "not a name" in str(w.message) for w in caught)
    assert loaded.current is python and loaded.after is None
    for g, w in zip(got, _block(*args)):
        torch.testing.assert_close(g, w)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_builds_on_its_own_thread() -> None:
    """A DataLoader worker forked while the parent's builder thread exists: the child's graphs still
    tier up (the child starts its own builder; the parent's thread is not in the child)."""
    compiled, args = _tiered(after=1)
    native.BACKGROUND.submit(lambda: None).result(timeout=60)  # the parent's builder thread exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: tier up, report, and leave without running the parent's atexit
        ok = b"0"
        try:
            compiled(*args)
            if native.wait_for_tier_up(_WAIT_S):
                compiled(*args)
                ok = b"1" if _is_native(compiled.fn.current) else b"0"
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
