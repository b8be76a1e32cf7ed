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
    "lerp", "addcmul", "logical_and", "logical_xor", "logical_not", "isnan", "clamp_min", "prod", "amin", "argmin", "any", "all",
    "std", "norm", "nn.functional.softmin", "flip", "roll", "transpose", "select", "unsqueeze", "reshape",
    "repeat", "tril", "nn.functional.pad.constant", "nn.functional.pad.reflect", "index_add", "index_put", "scatter", "scatter_add", "take_along_dim",
    "index_fill",
]


@pytest.mark.parametrize("name", TRITON_SLICE)
def test_opinfo_slice_through_triton(name: str) -> None:
    with config.patch(cpu_backend="triton"):
        result = check_op(name)
    assert result == "pass", result  # every op of the slice has samples and a lowering: a skip is a failure


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


_SIGNATURE_TYPES = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int64": "i64",
                    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}

_COMPILE_ALL = """
import json, sys, importlib.util
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
failed = []
for k, (path, name, signature, constexprs) in enumerate(json.load(open(sys.argv[1]))):
    spec = importlib.util.spec_from_file_location(f"kernels{k}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        triton.compile(ASTSource(getattr(module, name), signature=signature, constexprs=constexprs),
                       target=GPUTarget("cuda", 80, 32))
    except Exception as e:
        failed.append(f"{path} {name}: {str(e).strip().splitlines()[-1][:300]}")
print(json.dumps(failed))
"""


@pytest.mark.slow
def test_every_kernel_of_the_slice_compiles_for_a_gpu(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel the OpInfo slice generates, through Triton's real compiler down to sm_80 PTX (no GPU
    needed): the interpreter accepts code a compiler would reject (types, shapes), this does not."""
    import json
    import os
    import subprocess

    import opinfo_sweep

    from kiln.lower import compile_graph
    from kiln.lower.codegen.triton_kernel import generate

    jobs: list = []

    def compile_and_keep(gm, example_inputs, options=None):
        compiled = compile_graph(gm, example_inputs, options=options)
        source, launches = generate(compiled.program)
        path = tmp_path / f"kernels{len(jobs)}.py"
        path.write_text(source)
        storage = {}
        for b in compiled.program.ir.buffers:
            storage[b.name] = b.layout.dtype
            storage.update({name: lay.dtype for name, lay, _ in getattr(b, "results", ())})
        for name, launch in launches.items():
            signature = {b: "*" + _SIGNATURE_TYPES[str(storage[b]).replace("torch.", "")] for b in launch.buffers}
            signature.update({s: "i32" for s in launch.symbols})
            signature.update({"seed": "i64"} if launch.seed else {})
            signature.update({"index_error": "*i32"} if launch.index_check else {})
            signature.update({"kiln_err": "*i64"} if launch.error_sites else {})
            constexprs = {"XBLOCK": launch.xblock, **({"RBLOCK": launch.rblock} if launch.rblock else {})}
            signature.update({k: "constexpr" for k in constexprs})
            jobs.append((str(path), name, signature, constexprs))
        return compiled

    monkeypatch.setattr(opinfo_sweep, "compile_graph", compile_and_keep)
    with config.patch(cpu_backend="triton"):
        for name in TRITON_SLICE:
            check_op(name)
    listing = tmp_path / "jobs.json"
    listing.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE_ALL, str(listing)], capture_output=True, text=True,
                         env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(jobs) > 100 and json.loads(out.stdout.strip().splitlines()[-1]) == []
