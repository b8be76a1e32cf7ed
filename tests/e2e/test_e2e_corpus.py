"""End-to-end: every corpus program through kiln.compile with each backend that exists, compared
with eager (outputs, printed text, buffers and inputs mutated, gradients) and with the real
torch.compile on the same calls (graphs compiled after each call, which shows recompiles).

A backend whose stage has not landed is skipped with the reason; once it exists, any difference is a
failure. Inductor runs a smoke slice by default and the whole corpus under `-m slow`.
"""
from __future__ import annotations

import pytest

import e2e_functions  # noqa: F401  (fills the corpus)
import e2e_modules  # noqa: F401
from e2e_harness import CASES, Case, Run, assert_same_results, kiln_run, missing_stage, run_program, torch_oracle

INDUCTOR_SMOKE = {"mlp_sequential", "layer_norm_by_hand", "conv_bn_relu_train", "gpt_training_grads", "varying_batch_sizes"}

_REFERENCE: dict[str, tuple[Run, Run]] = {}


def reference(name: str) -> tuple[Run, Run]:
    """Eager's results and torch.compile's graph counts for a case (computed once per session)."""
    if name not in _REFERENCE:
        build = CASES[name].build
        _REFERENCE[name] = (run_program(build(), lambda fn: fn), torch_oracle(build()))
    return _REFERENCE[name]


def _params():
    for backend in ("eager", "aot_eager", "inductor"):
        for name in CASES:
            marks = []
            if backend == "inductor":
                marks.append(pytest.mark.cpp)
                if name not in INDUCTOR_SMOKE:
                    marks.append(pytest.mark.slow)
            yield pytest.param(backend, name, marks=marks, id=f"{backend}-{name}")


def _counts_message(got: Run, oracle: Run, entry: Case) -> str:
    """The counts, Kiln's warnings, and kiln.explain's account of the first call (its breaks and
    fallbacks), so that a failure says why without a rerun."""
    import kiln

    said = "".join(f"\n  kiln warned: {w}" for w in got.warnings)
    program = entry.build()
    args, kwargs = program.calls[0]
    try:
        explained = str(kiln.explain(program.fn)(*args, **kwargs))
    except Exception as exc:
        explained = f"kiln.explain raised {type(exc).__name__}: {exc}"
    return f"cumulative graphs after each call: kiln {got.graphs}, torch.compile {oracle.graphs}{said}\n{explained}"


@pytest.mark.parametrize("backend,name", list(_params()))
def test_corpus(backend: str, name: str) -> None:
    missing = missing_stage(backend)
    if missing:
        pytest.skip(f"kiln backend {backend!r} not available: {missing}")
    entry = CASES[name]
    eager, oracle = reference(name)
    tol = entry.tol if backend == "eager" else max(entry.tol, 1e-4)
    got = kiln_run(entry.build(), backend)
    assert_same_results(eager, got, tol)
    if entry.breaks:
        # Kiln may capture more than torch.compile (fewer graphs), never less; where torch.compile
        # gives up on the frame (a break inside a loop) there is no count to compare with
        if oracle.graphs[-1] > 0:
            assert 1 <= got.graphs[-1] <= oracle.graphs[-1], _counts_message(got, oracle, entry)
    else:
        assert got.graphs == oracle.graphs, _counts_message(got, oracle, entry)


def test_torch_oracle_agrees_with_eager() -> None:
    """The oracle itself must compute what eager computes, or its counts mean nothing."""
    for name, entry in CASES.items():
        eager, oracle = reference(name)
        assert_same_results(eager, oracle, entry.tol)


def test_corpus_is_substantial() -> None:
    assert len(CASES) >= 30, sorted(CASES)


def test_every_stage_a_backend_needs_exists() -> None:
    """The corpus skips a backend whose stage has not landed; every stage has, so a skip means a module
    moved (capture_frame left tracer.py and the whole corpus was skipped, not run)."""
    for backend in ("eager", "aot_eager", "inductor"):
        assert missing_stage(backend) is None, (backend, missing_stage(backend))
