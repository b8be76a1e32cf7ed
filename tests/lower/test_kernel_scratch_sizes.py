"""A kernel's per-thread scratch rows (std::malloc'd around its loops) are sized with the whole
element count: under dynamic shapes that count can be a sum (a convolution's output sizes,
(A + 1) * (B + 1) expanded), and `sizeof(float) * 4 * A * B + 4 * A + ...` multiplied only the first
term: the row was too short, the kernel wrote past it and glibc aborted the process later
("corrupted size vs. prev_size"; a GroupNorm over a bfloat16 convolution under autocast, dynamic=True).
Run in a fresh process with glibc's heap checks on and an empty cache, so the kernels are generated."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = r"""
import torch, torch.nn as nn, kiln
torch.manual_seed(0)
for frozen, train in ((True, False), (False, True)):
    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8)).requires_grad_(not frozen)
    kiln.reset()
    f = kiln.compile(model, dynamic=True)
    for shape in ((2, 4, 8, 8), (3, 4, 9, 7), (1, 4, 12, 5)):
        x = torch.randn(shape).requires_grad_(train)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = f(x), model(x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        if train:
            got.float().square().sum().backward()
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()
print("ok")
"""


@pytest.mark.cpp
def test_scratch_rows_hold_a_dynamic_sum_of_elements(tmp_path):
    env = dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165", KILN_CACHE_DIR=str(tmp_path / "cache"),
               KILN_LOGS="output_code", PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stderr[-2000:])
    sizes = re.findall(r"std::malloc\(sizeof\(\w+\) \* (.*)\);", run.stderr)
    assert sizes, "the program no longer needs a scratch row: find another that does"
    for size in sizes:  # one factor after sizeof: a name or a parenthesized expression
        assert re.fullmatch(r"(kiln_nt \* )?(\(.*\)|\w+)( \* \w+)?\)?", size), size
