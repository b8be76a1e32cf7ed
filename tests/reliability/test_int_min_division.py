"""The one integer quotient that overflows: the type's minimum divided by -1, in compiled code.

x86's division instruction traps (SIGFPE, the process dies) on it. Eager gives the minimum for `//`,
`torch.div(rounding_mode="floor")` and 0 for `%`, remainder and fmod; `rounding_mode="trunc"` traps in
eager itself on int64 and int32 (the wrapped quotient, the minimum, is what Kiln gives). Each check
runs in a subprocess, so a trap kills that process and fails the test instead of killing pytest:
every int dtype, the divisor -1 as a tensor element and as a Python scalar, inside a fused chain and a
reduction, the C++ and the Triton code generators, and capture's constant folder (which computes with
eager's kernels while tracing).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = r'''
import sys, warnings
import torch
import kiln
from kiln import config

warnings.simplefilter("error")  # a fallback to eager would warn: the kernels must answer
OPS = {
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b),
    "fmod": lambda a, b: torch.fmod(a, b),
}


def expected(name, a, b):
    """eager's answer; trunc division traps in eager on int64/int32, so it is spelled out there"""
    if name != "div_trunc":
        return OPS[name](a, b)
    b = torch.as_tensor(b, dtype=a.dtype).expand_as(a)
    q = torch.where(b == -1, 0 - a, torch.div(a, torch.where(b == -1, 1, b), rounding_mode="trunc"))
    return q


def all_ops(a, b):
    return tuple(f(a, b) for f in OPS.values())


failures = []
with config.patch(cpu_backend=sys.argv[1]):
    for dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
        low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        a = torch.tensor([low, low, high, -7, 7, low, low + 1, 0, low] * 3, dtype=dtype)
        b = torch.tensor([-1, 1, -1, -1, -1, 2, -1, -1, 3] * 3, dtype=dtype)
        cases = {
            "tensor": (all_ops, (a, b), lambda: tuple(expected(n, a, b) for n in OPS)),
            "scalar": (lambda a: all_ops(a, -1), (a,), lambda: tuple(expected(n, a, -1) for n in OPS)),
            "fused": (lambda a, b: tuple(r * 1 + 0 for r in all_ops(a - 0, b * 1)), (a, b),
                      lambda: tuple(expected(n, a, b) for n in OPS)),
            "reduced": (lambda a, b: (a // b).to(torch.int64).sum() + (a % b).to(torch.int64).sum(), (a, b),
                        lambda: (OPS["floordiv"](a, b).to(torch.int64).sum() + OPS["mod"](a, b).to(torch.int64).sum(),)),
        }
        for case, (fn, args, want) in cases.items():
            kiln.reset()
            got = kiln.compile(fn)(*args)
            got = got if isinstance(got, tuple) else (got,)
            for k, (g, e) in enumerate(zip(got, want())):
                if not torch.equal(g, e):
                    failures.append(f"{dtype} {case} output {k}: {g.tolist()} != {e.tolist()}")
print("\n".join(failures) or "all equal")
'''

FOLD = r'''
import torch
import kiln


def f(x):
    n = torch.div(torch.tensor(-2 ** 63), -1, rounding_mode="trunc")  # known while tracing
    m = torch.tensor(-2 ** 31, dtype=torch.int32) // -1
    return (x + n).tolist(), m.tolist()


print(kiln.compile(f)(torch.tensor([1])))
'''


def _run(source: str, *argv: str, triton: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if triton:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *argv], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.cpp
def test_minimum_over_minus_one_in_cpp_kernels() -> None:
    done = _run(SCRIPT, "cpp")
    assert done.returncode == 0, f"the process died (rc {done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.strip() == "all equal", done.stdout


@pytest.mark.triton
def test_minimum_over_minus_one_in_triton_kernels() -> None:
    pytest.importorskip("triton")
    done = _run(SCRIPT, "triton", triton=True)
    assert done.returncode == 0, f"the process died (rc {done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.strip() == "all equal", done.stdout


@pytest.mark.cpp
def test_constant_folder_does_not_trap_while_tracing() -> None:
    done = _run(FOLD)
    assert done.returncode == 0, f"the process died (rc {done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.strip() == str(([-2 ** 63 + 1], -2 ** 31)), done.stdout
