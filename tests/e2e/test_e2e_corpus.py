"""End-to-end: every corpus program through kiln.compile with each backend that exists, compared
with eager (outputs, printed text, buffers and inputs mutated, gradients) and with the real
torch.compile on the same calls (graphs compiled after each call, which shows recompiles).

A backend whose stage has not landed is skipped with the reason; once it exists, any difference is a
failure. Inductor runs a smoke slice by default and the whole corpus under `-m slow`. torch.compile's
graph counts are recorded in e2e_torch_graphs.json (tests/recorded_oracle.py) and reused while a case's
code is unchanged; a sample reruns torch.compile here, every case under `-m slow`, and
`PYTHONPATH=tests python tests/e2e/test_e2e_corpus.py --record` rewrites the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import e2e_functions  # noqa: F401  (fills the corpus)
import e2e_harness
import e2e_modules  # noqa: F401
from e2e_harness import CASES, Case, Run, assert_same_results, kiln_run, missing_stage, run_program, torch_oracle
from recorded_oracle import RecordedTable, sampled

INDUCTOR_SMOKE = {"mlp_sequential", "layer_norm_by_hand", "conv_bn_relu_train", "gpt_training_grads", "varying_batch_sizes"}

ORACLE = RecordedTable(Path(__file__).with_name("e2e_torch_graphs.json"), [Path(e2e_harness.__file__)])
_REFERENCE: dict[str, tuple[Run, list[int]]] = {}


def _source(name: str) -> Path:
    return Path(sys.modules[CASES[name].build.__module__].__file__ or "")


def reference(name: str) -> tuple[Run, list[int]]:
    """Eager's results and torch.compile's cumulative graph counts for a case (once per session; the
    counts as recorded while the case's code is unchanged)."""
    if name not in _REFERENCE:
        build = CASES[name].build
        graphs = ORACLE.get(name, _source(name))
        _REFERENCE[name] = (run_program(build(), lambda fn: fn), graphs if graphs is not None else torch_oracle(build()).graphs)
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


def _counts_message(got: Run, oracle: list[int], entry: Case) -> str:
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
    return f"cumulative graphs after each call: kiln {got.graphs}, torch.compile {oracle}{said}\n{explained}"


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
        if oracle[-1] > 0:
            assert 1 <= got.graphs[-1] <= oracle[-1], _counts_message(got, oracle, entry)
    else:
        assert got.graphs == oracle, _counts_message(got, oracle, entry)


def _oracle_agrees(name: str) -> None:
    """The oracle itself computes what eager computes (or its counts mean nothing), and the counts
    recorded for the case are what it makes now."""
    eager, _ = reference(name)
    live = torch_oracle(CASES[name].build())
    assert_same_results(eager, live, CASES[name].tol)
    recorded = ORACLE.get(name, _source(name))
    assert recorded is None or recorded == live.graphs, (recorded, live.graphs)


@pytest.mark.parametrize("name", sampled(CASES, 6))
def test_torch_oracle_agrees_with_eager(name: str) -> None:
    _oracle_agrees(name)


def test_torch_graph_counts_are_recorded_for_the_code() -> None:
    stale = ORACLE.stale({name: _source(name) for name in CASES})
    assert not stale, (f"torch.compile's graph counts for {stale} are not recorded for their code: run "
                       f"`PYTHONPATH=tests python tests/e2e/test_e2e_corpus.py --record` and commit {ORACLE.path.name}")


def test_corpus_is_substantial() -> None:
    assert len(CASES) >= 30, sorted(CASES)


def test_every_stage_a_backend_needs_exists() -> None:
    """The corpus skips a backend whose stage has not landed; every stage has, so a skip means a module
    moved (capture_frame left tracer.py and the whole corpus was skipped, not run)."""
    for backend in ("eager", "aot_eager", "inductor"):
        assert missing_stage(backend) is None, (backend, missing_stage(backend))


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    ORACLE.write({name: (_source(name), torch_oracle(CASES[name].build()).graphs) for name in CASES})
    print(f"recorded torch.compile's graph counts for {len(CASES)} cases in {ORACLE.path}")
