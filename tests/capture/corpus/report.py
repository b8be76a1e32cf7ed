"""Run the whole corpus and print Kiln's pass rate against torch.compile, by category and case.

`PYTHONPATH=. python -m tests.capture.corpus.report [substring ...]` judges every case (or those
whose name or category contains one of the substrings) and prints: each case Kiln does not pass
with its verdict and the difference, the cases torch.compile itself fails, the cases whose graph
counts differ from torch.compile's, the rate per category, and the lines of a KNOWN_FAILURES table
for tests/capture/test_dynamo_style_corpus.py. torch.compile's outcomes come from
corpus/torch_outcomes.json where recorded for the code as it is; `--record` reruns torch.compile on
every case and rewrites that table.
"""
from __future__ import annotations

import re
import sys
import time
from collections import Counter, defaultdict

from . import CASES, judge
from .oracle import COUNT, CRASH, PASS, WRONG, Outcome
from .recorded import record

ORDER = ["wrong", "crash", "error", "break", "count", "pass"]


def main(selection: list[str]) -> None:
    cases = [c for c in CASES.values()
             if not selection or any(s in c.name or s == c.category for s in selection)]
    started = time.perf_counter()
    outcomes: list[Outcome] = [judge(c) for c in cases]
    seconds = time.perf_counter() - started
    counted = [o for o in outcomes if o.torch_passes]
    passed = [o for o in counted if o.kiln == PASS]
    print("== torch.compile does not pass (not counted; Kiln must still give no wrong answer)")
    for o in outcomes:
        if not o.torch_passes:
            print(f"  {o.case.name:50} {o.case.category:16} kiln={o.kiln:6} torch: {' '.join((o.torch_why or '').split())[:300]}")
    print("== Kiln does not pass")
    for o in sorted(counted, key=lambda o: (ORDER.index(o.kiln), o.case.category, o.case.name)):
        if o.kiln != PASS:
            print(f"  {o.kiln.upper():6} {o.case.name:50} {o.case.category:16} {' '.join((o.kiln_why or '').split())[:400]}")
    print("== graph counts that differ where Kiln gives eager's values (kiln vs torch.compile)")
    for o in counted:
        if o.kiln in (PASS, COUNT) and o.kiln_graphs != o.torch_graphs:
            print(f"  {o.case.name:50} kiln {o.kiln_graphs} ({o.kiln_breaks} breaks), torch {o.torch_graphs}")
    print("== per category (kiln passes / torch.compile passes)")
    per: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        per[o.case.category]["cases"] += 1
        per[o.case.category]["counted"] += o.torch_passes
        per[o.case.category]["passed"] += o.torch_passes and o.kiln == PASS
    for category, n in sorted(per.items()):
        print(f"  {category:18} {n['passed']:4} / {n['counted']:4}   ({n['cases']} cases)")
    wrong = [o for o in outcomes if o.kiln == WRONG]
    print(f"== {len(passed)} / {len(counted)} = {len(passed) / max(len(counted), 1):.1%} "
          f"of what torch.compile passes; {len(wrong)} wrong answers; {len(outcomes)} cases in {seconds:.1f}s")
    print("== KNOWN_FAILURES lines")
    for o in sorted(outcomes, key=lambda o: (ORDER.index(o.kiln), o.case.category, o.case.name)):
        if (o.torch_passes and o.kiln != PASS) or (not o.torch_passes and o.kiln in (WRONG, CRASH)):
            print(f'    "{o.case.name}": ({o.kiln.upper()}, "{short_reason(o.kiln_why)}"),')
    print("== TORCH_FAILS lines")
    for o in outcomes:
        if not o.torch_passes:
            print(f'    "{o.case.name}": "{short_reason(o.torch_why)}",')


def short_reason(why: str | None) -> str:
    """One line for a table: a break's reason, or the start of the difference."""
    text = " ".join((why or "").split()).replace('"', "'")
    if "reason: " in text:
        text = text.split("reason: ", 1)[1].split(" / hint:")[0].split(", expected")[0]
    elif "got raised" in text:
        text = text.split("got raised ", 1)[1].split(", expected")[0]
    text = re.sub(r"/\S*/(tests|kiln)/", r"\1/", text)
    return text[:120]


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        record()
    else:
        main(sys.argv[1:])
