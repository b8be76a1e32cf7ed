"""Run one generated program eagerly and through each Kiln backend, and say how they differ.

`check(program)` returns None when every backend agrees with eager: the same outputs (dtype,
shape, values within float tolerance), the same input values afterwards (in-place updates),
the same gradients for programs checked with gradients, the same exception type when eager
raises, and no fallback (kiln.stats()["fallbacks"] unchanged, no KilnWarning). Otherwise it
returns a message that names the backend and carries the program's source as a repro.
Used by tests/fuzz/test_random_programs.py and `python tests/fuzz/differential.py [first [count]]`.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

import kiln
from kiln.log import KilnWarning

sys.path.insert(0, str(Path(__file__).parent))
from program_generator import Program, generate  # noqa: E402

BACKENDS = ("eager", "aot_eager", "inductor")
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-7, rtol=1e-7)}


def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds


def run(fn: Callable[..., Any], program: Program) -> dict[str, Any]:
    """Outputs, inputs afterwards and gradients of one run (or the exception it raised)."""
    inputs = program.make_inputs()
    try:
        outputs = fn(*inputs)
        grads = None
        if program.with_grad:
            weights = torch.Generator().manual_seed(program.seed + 1)
            terms = [(o * torch.randn(o.shape, dtype=o.dtype, generator=weights)).sum()
                     for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
            leaves = [x for x in inputs if x.requires_grad]
            if terms and leaves:
                grads = torch.autograd.grad(torch.stack([t.to(torch.float64) for t in terms]).sum(), leaves,
                                            allow_unused=True)
    except Exception as exc:  # eager's exception is part of what must match
        return {"error": exc}
    return {"outputs": [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs],
            "inputs": [x.detach() for x in inputs], "grads": grads}


def _computes_in_float32(program: Program) -> bool:
    """Whether float32 rounding can reach a float64 output: a float32 input or conversion. A sum
    in float32 may then differ from eager's by its last bit (another order of adds), which float64's
    tolerance would call a wrong answer once promoted (x64 - x32.sum())."""
    return any(spec.dtype == torch.float32 for spec in program.inputs) or any(
        text in program.source for text in ("float32", ".float()"))


def _differ(name: str, got: Any, expected: Any, loose: bool = False) -> str | None:
    """What differs between `got` and eager's `expected`; `loose`: float64 values are compared with
    float32's tolerance (see _computes_in_float32)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{name}: got {type(got).__name__}, expected a tensor"
        if (got.dtype, tuple(got.shape)) != (expected.dtype, tuple(expected.shape)):
            return f"{name}: got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
        dtype = torch.float32 if loose and expected.dtype == torch.float64 else expected.dtype
        tolerance = TOLERANCE.get(dtype, dict(atol=0, rtol=0))
        try:
            torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
        except AssertionError as err:
            return f"{name}: " + " ".join(str(err).split())[:300]
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{name}: got {got!r}, expected {expected!r}"
        for k, (g, e) in enumerate(zip(got, expected)):
            why = _differ(f"{name}[{k}]", g, e, loose)
            if why:
                return why
        return None
    return None if got == expected else f"{name}: got {got!r}, expected {expected!r}"


def check(program: Program, backends: tuple[str, ...] = BACKENDS) -> str | None:
    """None if every backend agrees with eager on `program`, else what differs and the repro."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's own warnings (var with one element, ...)
        expected = run(program.fn, program)
    for backend in backends:
        kiln.reset()
        compiled = kiln.compile(program.compile_source(), backend=backend, options=_options(backend))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = run(compiled, program)
        problem = None
        fell_back = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
        if fell_back or kiln.stats()["fallbacks"]:
            problem = f"internal error, fell back to eager: {fell_back[:1]}"
        elif "error" in expected or "error" in got:
            if type(got.get("error")) is not type(expected.get("error")):
                problem = f"raised {got.get('error')!r}, eager raised {expected.get('error')!r}"
        else:
            for part in ("outputs", "inputs", "grads"):
                problem = problem or _differ(part, got[part], expected[part], _computes_in_float32(program))
        if problem:
            return f"backend {backend}: {problem}\n{program.repro()}"
    return None


def main() -> None:
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    failures = 0
    for seed in range(first, first + count):
        problem = check(generate(seed))
        if problem:
            failures += 1
            print(f"--- seed {seed}\n{problem}\n", flush=True)
    print(f"{count - failures}/{count} programs agree with eager on {', '.join(BACKENDS)}")


if __name__ == "__main__":
    main()
