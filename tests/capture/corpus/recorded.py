"""torch.compile's outcome on each corpus case, recorded once so `make test` does not rerun it.

Running a case through the real torch.compile costs about six times what eager and Kiln cost
together. `torch_outcomes.json` (a tests/recorded_oracle.py table) holds, per case, whether
torch.compile gives eager's values (and the first difference when it does not) and how many graphs
it made, valid for the corpus module that defines the case and the harness (program.py, oracle.py)
as they were recorded; `judge` runs torch.compile where the record does not hold. Rewrite it with

    PYTHONPATH=. python -m tests.capture.corpus.report --record
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from recorded_oracle import RecordedTable

from .program import CASES, Case

HERE = Path(__file__).parent
TABLE = RecordedTable(HERE / "torch_outcomes.json", [HERE / "program.py", HERE / "oracle.py"])


@dataclass(frozen=True)
class TorchOutcome:
    passes: bool  # torch.compile's values, outputs and side effects equal eager's
    why: str | None  # the first difference when it does not
    graphs: int


def source(case: Case) -> Path:
    """The corpus module that defines `case` (its builder and every helper beside it)."""
    return Path(sys.modules[case.build.__module__].__file__ or "")


def stale_cases() -> list[str]:
    return TABLE.stale({name: source(case) for name, case in CASES.items()})


def recorded(case: Case) -> TorchOutcome | None:
    """torch.compile's recorded outcome on `case`, or None when the record does not hold for the code now."""
    value = TABLE.get(case.name, source(case))
    return None if value is None else TorchOutcome(**value)


def record() -> None:
    """Run every case eagerly and through torch.compile and write the table."""
    from .oracle import torch_outcome

    TABLE.write({name: (source(case), asdict(torch_outcome(case, live=True))) for name, case in CASES.items()})
    print(f"recorded torch.compile's outcome on {len(CASES)} cases in {TABLE.path}")
