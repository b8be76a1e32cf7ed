"""The C++ path's tests re-run through the Triton code generator (on CPU, under Triton's interpreter).

Every test of tests/lower/test_fusion.py runs with its `check` replaced: each graph is compiled
through Triton and compared with eager, and must have the C++ schedule's kernel and extern counts
(one scheduled program feeds both generators); the test's own assertions about generated C++ then
read the C++ compile of the same graph. Then an OpInfo forward slice (the C++ CI slice plus
reductions, views and indexing ops) in CI, and the whole OpInfo forward sweep as a slow test.
"""
from __future__ import annotations

import os

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from kiln import config

from . import conftest
from . import test_fusion as fusion

sys.path.insert(0, str(Path(__file__).parent))
from opinfo_sweep import check_op, op_db  # noqa: E402
from test_opinfo import CI_SLICE  # noqa: E402

pytest.importorskip("triton")
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              # Triton interprets or compiles for the whole process: with a GPU, tests/gpu runs it compiled
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")]

FUSION_TESTS = [getattr(fusion, name) for name in sorted(dir(fusion)) if name.startswith("test_")]


def _check_through_triton(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    with config.patch(cpu_backend="triton"):
        triton = conftest.check(fn, *args, **kw)
    cpp = conftest.check(fn, *args, **kw)
    assert triton.codegen == "triton" and cpp.codegen == "cpp"
    assert (triton.kernel_count, triton.extern_count) == (cpp.kernel_count, cpp.extern_count)
    return cpp


@pytest.mark.cpp
@pytest.mark.parametrize("case", FUSION_TESTS, ids=lambda f: f.__name__)
def test_fusion_case_through_triton(case: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fusion, "check", _check_through_triton)
    case()


TRITON_SLICE = CI_SLICE + [
    "floor_divide", "fmod", "pow", "atan2", "log1p", "expm1", "erf", "sqrt", "round", "trunc", "sign", "nan_to_num",
    "lerp", "addcmul", "bitwise_and", "logical_not", "isnan", "clamp_min", "prod", "amin", "argmin", "any", "all",
    "std", "norm", "nn.functional.softmin", "flip", "roll", "transpose", "narrow", "select", "unsqueeze", "reshape",
    "repeat", "tril", "nn.functional.pad.constant", "nn.functional.pad.reflect", "index_add", "index_put", "scatter", "scatter_add", "take_along_dim",
    "index_fill",
]


@pytest.mark.parametrize("name", TRITON_SLICE)
def test_opinfo_slice_through_triton(name: str) -> None:
    with config.patch(cpu_backend="triton"):
        result = check_op(name)
    assert result == "pass" or result.startswith("skip"), result


def test_slice_is_large_enough() -> None:
    assert len(set(TRITON_SLICE)) >= 60 and set(TRITON_SLICE) <= set(op_db())


@pytest.mark.slow
def test_opinfo_full_sweep_through_triton() -> None:
    """The whole forward sweep through Triton; passes when it reaches 97% of the ops the C++ path
    passes (`python tests/lower/opinfo_sweep.py` prints the C++ table)."""
    with config.patch(cpu_backend="triton"):
        results = {n: check_op(n) for n in sorted(op_db())}
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    passed = sum(r == "pass" for r in tried.values())
    print(f"OpInfo forward sweep through Triton: {passed}/{len(tried)} passed")
    assert passed / len(tried) > 0.95, {n: r for n, r in tried.items() if r != "pass"}
