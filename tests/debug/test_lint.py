"""kiln lint: each hazard found with its hint, no finding on compile-friendly code, and precision and
recall against the graph breaks kiln.explain reports on the e2e and real-model corpora."""
from __future__ import annotations

import os
import sys
import sysconfig
import textwrap
import threading
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch

import kiln
from kiln.debug.lint import Finding, lint_paths, lint_source

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(os.path.dirname(HERE), "e2e")

HAZARDS = '''
import logging, random, time
import numpy as np
import torch

logger = logging.getLogger(__name__)


def f(x: torch.Tensor, w: torch.Tensor, n: int = 3):
    print("x", x.shape)                      # print
    logger.info("step")                       # logging
    y = x @ w
    s = y.sum().item()                        # item
    if y.max() > 0:                           # data_dependent_branch
        y = y * 2
    k = float(y.mean())                       # item
    r = random.random()                       # unsupported_call
    t = time.time()                           # unsupported_call
    a = np.exp(y)                             # numpy
    m = f"{y}"                                # format_tensor
    for i in range(x.shape[0]):               # shape_loop
        y = y + i
    return y.tolist()                         # item
'''

EXPECTED = [(10, "print"), (11, "logging"), (13, "item"), (14, "data_dependent_branch"), (16, "item"),
            (17, "unsupported_call"), (18, "unsupported_call"), (19, "numpy"), (20, "format_tensor"),
            (21, "shape_loop"), (23, "item")]

CLEAN = '''
import math
import numpy as np
import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def forward(self, x, mask=None, scale: float = 1.0):
        if mask is not None:
            x = x.masked_fill(mask, 0.0)
        if x.dim() == 3 and x.shape[-1] > 4:
            x = x.transpose(1, 2)
        if x.dtype == torch.float16:
            x = x.float()
        if self.training:
            x = F.dropout(x, 0.1)
        factor = float(np.sqrt(16.0)) * math.pi
        return torch.where(x > 0, x, x * factor * scale)


def helper(t, name: str):
    if name != "relu":
        return t
    if not torch.jit.is_tracing() and t.all():
        return t
    return F.relu(t)
'''


def test_each_hazard_is_found_with_its_hint():
    findings = lint_source(textwrap.dedent(HAZARDS), "hazards.py")
    assert [(f.lineno, f.kind) for f in findings] == EXPECTED, "\n".join(map(str, findings))
    branch = next(f for f in findings if f.kind == "data_dependent_branch")
    assert "torch.where" in branch.hint  # the hint graph breaks of this kind give
    assert all(f.function == "f" for f in findings)
    assert not next(f for f in findings if f.kind == "shape_loop").breaks
    assert str(findings[0]).startswith("hazards.py:10: print() inside compiled code (graph break: print)")


def test_compile_friendly_code_has_no_finding():
    assert lint_source(textwrap.dedent(CLEAN), "clean.py") == []


def test_branch_behind_a_static_check_is_advice():
    source = textwrap.dedent('''
        import torch
        def g(h: torch.Tensor):
            if h.dtype == torch.float16 and not torch.isfinite(h).all():
                h = h.clamp(-1, 1)
            return h
    ''')
    (finding,) = lint_source(source, "g.py")
    assert finding.kind == "guarded_branch" and not finding.breaks


def test_paths_and_missing_path(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(textwrap.dedent(HAZARDS))
    (tmp_path / "pkg" / "b.py").write_text(textwrap.dedent(CLEAN))
    findings = lint_paths([str(tmp_path)])
    assert {os.path.basename(f.filename) for f in findings} == {"a.py"}
    with pytest.raises(FileNotFoundError):
        lint_paths([str(tmp_path / "nope.py")])


# ---------------------------------------------------------------------------------------------------
# Measured against capture: every finding on a line the program ran vs the breaks explain reports


def executed_lines(call: Callable[[], Any]) -> set[tuple[str, int]]:
    """(file, line) of every line run while `call` runs eagerly, in the code capture traces into: not
    torch, kiln, the standard library or numpy (capture runs those natively; a call into them breaks
    at the user's line)."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(kiln.__file__), "<", sysconfig.get_paths()["stdlib"],
            os.path.dirname(np.__file__))
    lines: set[tuple[str, int]] = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def start(frame, event, arg):
        if frame.f_code.co_filename.startswith(skip):
            return None
        lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    sys.settrace(start)
    threading.settrace(start)
    try:
        call()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return lines


def e2e_programs() -> Iterator[tuple[str, Callable, Callable]]:
    sys.path.insert(0, E2E)
    import e2e_functions  # noqa: F401  (registers its cases)
    import e2e_modules  # noqa: F401
    from e2e_harness import CASES

    for name, case in CASES.items():
        run_prog, explain_prog = case.build(), case.build()  # separate objects: no state shared
        (args, kwargs), (args2, kwargs2) = run_prog.calls[0], explain_prog.calls[0]
        yield (name, lambda p=run_prog, a=args, k=kwargs: p.fn(*a, **k),
               lambda p=explain_prog, a=args2, k=kwargs2: kiln.explain(p.fn)(*a, **k))


def real_programs(names: list[str] | None) -> Iterator[tuple[str, Callable, Callable]]:
    pytest.importorskip("transformers")
    sys.path.insert(0, E2E)
    from real_models import MODELS

    for name, model in MODELS.items():
        if names is not None and name not in names:
            continue
        # two fresh models: a first call may install hooks that change what a second call runs
        ran, explained, inputs = model.build().eval(), model.build().eval(), model.inputs(False)

        def run(m=ran, i=inputs):
            with torch.no_grad():
                return m(**i)

        def explain(m=explained, i=inputs):
            with torch.no_grad():
                return kiln.explain(m)(**i)

        yield name, run, explain


def measure(programs: Iterator[tuple[str, Callable, Callable]]) -> tuple[int, int, int, list[str]]:
    """(true positives, false positives, missed breaks, notes) over every program: a finding counts
    when it is a graph-break finding on a line the program ran; it is true when explain reports a
    break on its lines; a break (file, line) is missed when no such finding covers it."""
    tp = fp = fn = 0
    notes: list[str] = []
    linted: dict[str, list[Finding]] = {}
    for name, run, explain in programs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lines = executed_lines(run)
            out = explain()
        breaks = {(os.path.abspath(b.filename), b.lineno) for b in out.break_reasons}
        files = sorted({f for f, _ in lines if f.endswith(".py") and os.path.exists(f)})
        findings = []
        for f in files:
            if f not in linted:
                linted[f] = lint_paths([f])
            findings += [x for x in linted[f] if x.breaks and any((f, k) in lines for k in range(x.lineno, x.end_lineno + 1))]
        for x in findings:
            if any(x.covers(*b) for b in breaks):
                tp += 1
            else:
                fp += 1
                notes.append(f"{name}: false positive {x.filename}:{x.lineno} {x.kind}")
        for b in breaks:
            if not any(x.covers(*b) for x in findings):
                fn += 1
                notes.append(f"{name}: missed break {b[0]}:{b[1]}")
    return tp, fp, fn, notes


def report(label: str, tp: int, fp: int, fn: int, notes: list[str]) -> tuple[float, float]:
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    print(f"\nlint vs kiln.explain on {label}: precision {precision:.0%} ({tp}/{tp + fp}), "
          f"recall {recall:.0%} ({tp}/{tp + fn})")
    for note in notes:
        print("  " + note)
    return precision, recall


def test_precision_and_recall_on_the_corpora():
    e2e = measure(e2e_programs())
    assert e2e[0] >= 3  # the corpus' print, .item() and print-in-a-loop programs
    breaks = measure(break_corpus_programs())
    assert breaks[0] >= 40  # tests/capture/test_breaks_oracle.py: 37 programs that break, some on several inputs
    real = measure(real_programs(["segformer"]))  # the real model with a break; all 28: -m slow
    tp, fp, fn, notes = (a + b + c for a, b, c in zip(e2e, breaks, real))
    precision, recall = report("the e2e corpus + the break corpus + segformer", tp, fp, fn, notes)
    assert precision >= 0.9 and recall >= 0.9


@pytest.mark.slow
def test_precision_and_recall_on_every_real_model():
    tp, fp, fn, notes = (a + b + c for a, b, c in zip(measure(e2e_programs()), measure(break_corpus_programs()),
                                                       measure(real_programs(None))))
    precision, recall = report("the e2e corpus + the break corpus + all 28 real models", tp, fp, fn, notes)
    assert precision >= 0.9 and recall >= 0.9


def break_corpus_programs() -> Iterator[tuple[str, Callable, Callable]]:
    """tests/capture/test_breaks_oracle.py's corpus: functions that break in common ways (each input)."""
    from tests.capture.test_breaks_oracle import CASES

    for case in CASES:
        for make in case.inputs:
            yield (case.name, lambda f=case.fn, m=make: _quiet(f, m()),
                   lambda f=case.fn, m=make: kiln.explain(f)(*m()))


def _quiet(fn: Callable, args: tuple) -> Any:
    try:
        return fn(*args)
    except Exception:  # a case whose eager run raises is part of the corpus (capture must raise the same)
        return None


def test_data_dependent_shapes_disabled_calls_and_fake_less_custom_ops():
    source = textwrap.dedent('''
        import math
        import kiln
        import torch

        @torch.library.custom_op("demo::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @kiln.disable
        def logged(t):
            print(float(t.sum()))   # never traced: no finding
            return t

        def f(x):
            y = x.sin()
            u = torch.unique(y)
            z = y[y > 0]
            s = math.sqrt(y.abs().sum())
            return twice(logged(y)) * s + u.sum() + z.sum()
    ''')
    found = [(f.lineno, f.kind) for f in lint_source(source, "m.py")]
    assert found == [(17, "data_dependent_shape"), (18, "data_dependent_shape"), (19, "item"),
                     (20, "disabled"), (20, "missing_fake_impl")], found
    faked = source + "\n@twice.register_fake\ndef _(x):\n    return torch.empty_like(x)\n"
    assert (20, "missing_fake_impl") not in [(f.lineno, f.kind) for f in lint_source(faked, "m.py")]
