"""torch.compile's outcome on each corpus case, recorded once so `make test` does not rerun it.

Running a case through the real torch.compile costs about six times what eager and Kiln cost
together, and with torch pinned (2.13.0) the answer only changes when the case does. So
`torch_outcomes.json` holds, per case, whether torch.compile gives eager's values (and the first
difference when it does not) and how many graphs it made, next to a digest of the corpus module that
defines the case and of the harness (program.py, oracle.py). `judge` uses a recorded outcome only
when the torch version and both digests still match; otherwise it runs torch.compile. The table is
checked: a sample of cases reruns torch.compile in `make test`, every case under `-m slow`, and a
stale table fails the suite with the command that rewrites it:

    PYTHONPATH=. python -m tests.capture.corpus.report --record
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from .program import CASES, Case

TABLE = Path(__file__).with_name("torch_outcomes.json")
HARNESS = ("program.py", "oracle.py")


@dataclass(frozen=True)
class TorchOutcome:
    passes: bool  # torch.compile's values, outputs and side effects equal eager's
    why: str | None  # the first difference when it does not
    graphs: int


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def module_digest(case: Case) -> str:
    """The digest of the corpus module that defines `case` (its builder and every helper beside it)."""
    return _digest(Path(sys.modules[case.build.__module__].__file__ or ""))


def harness_digest() -> str:
    here = Path(__file__).parent
    return hashlib.sha256("".join(_digest(here / name) for name in HARNESS).encode()).hexdigest()[:16]


@cache
def _table() -> dict:
    if not TABLE.exists():
        return {}
    return json.loads(TABLE.read_text())


def stale_cases() -> list[str]:
    """The cases whose recorded outcome cannot be used (not recorded, or recorded for other code)."""
    table = _table()
    if table.get("torch") != torch.__version__ or table.get("harness") != harness_digest():
        return sorted(CASES)
    cases = table.get("cases", {})
    return sorted(name for name, case in CASES.items()
                  if name not in cases or cases[name]["module"] != module_digest(case))


def recorded(case: Case) -> TorchOutcome | None:
    """torch.compile's recorded outcome on `case`, or None when the record does not hold for the code now."""
    table = _table()
    entry = table.get("cases", {}).get(case.name)
    if (entry is None or table.get("torch") != torch.__version__ or table.get("harness") != harness_digest()
            or entry["module"] != module_digest(case)):
        return None
    return TorchOutcome(entry["passes"], entry["why"], entry["graphs"])


def record() -> None:
    """Run every case eagerly and through torch.compile and write the table."""
    from .oracle import torch_outcome

    cases = {}
    for name, case in CASES.items():
        outcome = torch_outcome(case, live=True)
        cases[name] = {"module": module_digest(case), "passes": outcome.passes, "why": outcome.why,
                       "graphs": outcome.graphs}
    table = {"torch": torch.__version__, "harness": harness_digest(), "cases": cases}
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"recorded torch.compile's outcome on {len(cases)} cases in {TABLE}")
