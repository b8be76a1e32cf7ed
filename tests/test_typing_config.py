"""The type-checking setup `make test` runs: the whole package is checked, and no module is excused.

mypy itself runs from the Makefile (over kiln/, configured in pyproject.toml's [tool.mypy]); this
test keeps its configuration honest: mypy's files are the package, and no override turns errors off
for a module (a stub gap is a targeted `# type: ignore[code]` with its reason, in the module).
"""
from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _mypy_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def test_mypy_checks_the_whole_package():
    assert _mypy_config()["files"] == ["kiln"]


def test_no_module_is_excused():
    excused = [override.get("module") for override in _mypy_config().get("overrides", [])
               if override.get("ignore_errors")]
    assert excused == []
