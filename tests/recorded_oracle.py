"""The real torch.compile's answers recorded on disk, reused while the code that produced them is unchanged.

With torch pinned (2.13.0), what torch.compile does on a test program only changes when the program
does, and running it is often most of a test's time. A `RecordedTable` is a JSON file of per-case
answers (plain JSON values), each stored with a digest of the file that defines the case, under the
torch version and a digest of the harness files that ran it. `get` answers only when all three
still match; a test then runs torch.compile itself. Every table is checked by the suite that uses
it: a stale table fails with the command that rewrites it, a sample reruns torch.compile in
`make test`, and every case reruns under `-m slow`.

tests/ is on sys.path for every test (its conftest.py sits there): `from recorded_oracle import RecordedTable`.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import pytest
import torch


def sampled(names: Iterable[str], every: int) -> list[Any]:
    """Parameters for a test that reruns torch.compile on each case: every `every`-th case (sorted by
    name, a fixed sample) in `make test`, the others marked slow."""
    return [pytest.param(name, id=name, marks=() if i % every == 0 else pytest.mark.slow)
            for i, name in enumerate(sorted(names))]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class RecordedTable:
    def __init__(self, path: Path, harness: Sequence[Path]) -> None:
        self.path = path
        self.harness = list(harness)

    def harness_digest(self) -> str:
        return hashlib.sha256("".join(_digest(p) for p in self.harness).encode()).hexdigest()[:16]

    @cached_property
    def _table(self) -> dict:
        table = json.loads(self.path.read_text()) if self.path.exists() else {}
        if table.get("torch") != torch.__version__ or table.get("harness") != self.harness_digest():
            return {}
        return table.get("cases", {})

    def get(self, name: str, source: Path) -> Any | None:
        """The recorded answer for case `name` defined in `source`, or None where the record does not hold."""
        entry = self._table.get(name)
        if entry is None or entry["source"] != _digest(source):
            return None
        return entry["value"]

    def stale(self, sources: dict[str, Path]) -> list[str]:
        """The cases (name -> the file defining it) whose answer cannot be used."""
        return sorted(name for name, source in sources.items() if self.get(name, source) is None)

    def write(self, answers: dict[str, tuple[Path, Any]]) -> None:
        cases = {name: {"source": _digest(source), "value": value} for name, (source, value) in answers.items()}
        table = {"torch": torch.__version__, "harness": self.harness_digest(), "cases": cases}
        self.path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        self.__dict__.pop("_table", None)
