"""Shape-generic random programs agree with eager when called on other sizes and layouts.

Programs come from tests/fuzz/shape_programs.py (seeded: seed n is always the same program and
plan of calls): each is called three to five times with new values of its sizes (0 and 1 among
them now and then) and new layouts of the same logical shapes (transposed, padded rows, column
slices, storage offsets, broadcast dims, steps, channels-last), compiled under automatic dynamic,
dynamic=True or kiln.mark_dynamic. The CI slice checks seeds 0-59 on "eager" and "aot_eager" and
every tenth of them on "inductor" too (each inductor program builds C++ per recompile); the @slow
run checks 1,000 programs on all three. Expected: 0 wrong answers, 0 fallbacks, 0 errors eager
does not raise (a mark_dynamic refused only where torch.compile refuses it too).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from shape_programs import BACKENDS, LAYOUTS, MODES, check, generate  # noqa: E402

# Seeds that find open bugs, each with its repro in the reason; they run as strict xfails, so a
# fix makes them fail until they are taken off this list.
KNOWN_BUGS: dict[int, str] = {}
# Seed 362 (mark_dynamic on a padded input refused as specialized) has its focused tests in
# tests/capture/test_dynamic_strided_inputs.py.
# what the open bugs look like when other seeds of the @slow run meet them
KNOWN_SIGNATURES = ["raised ConstraintViolation, eager None"]
# The bug this generator found first (mark_dynamic on an expanded (1, n, m) input refused as
# specialized) has its focused tests in tests/capture/test_dynamic_strided_inputs.py.
CI_SEEDS = [seed for seed in range(60) if seed not in KNOWN_BUGS]
SLOW_SEEDS = range(1000)


def _backends(seed: int) -> tuple[str, ...]:
    return BACKENDS if seed % 10 == 0 else ("eager", "aot_eager")


def test_generator_is_deterministic_and_covers_every_family() -> None:
    assert generate(7).repro() == generate(7).repro()
    programs = [generate(seed) for seed in CI_SEEDS]
    assert len({p.source for p in programs}) == len(programs)
    text = "\n".join(p.repro() for p in programs)
    for family in (".softmax(", "layer_norm(", " @ ", ".flatten(", ".transpose(", ".unsqueeze(", "torch.cat([",
                   "torch.arange(", ".shape[0] // 2", ".expand(", ".add_(", "gradients: True", "'n': 1",
                   ".narrow(", ".sum("):
        assert family in text, family
    assert {p.mode for p in programs} == set(MODES)
    assert {layout for p in programs for call in p.calls for layout in call.layouts} == set(LAYOUTS)
    # every program is called on more than one set of sizes
    assert all(len({call.sizes for call in p.calls}) > 1 for p in programs[:20]), "a plan without new sizes"


@pytest.mark.cpp
def test_ci_slice_of_shape_programs() -> None:
    problems = [p for p in (check(generate(seed), _backends(seed)) for seed in CI_SEEDS) if p]
    assert not problems, "\n\n".join(problems)


@pytest.mark.cpp
@pytest.mark.parametrize("seed", [pytest.param(seed, marks=pytest.mark.xfail(strict=True, reason=why))
                                  for seed, why in sorted(KNOWN_BUGS.items())])
def test_seeds_that_find_open_bugs(seed: int) -> None:
    problem = check(generate(seed), _backends(seed))
    assert problem is None, problem


@pytest.mark.cpp
@pytest.mark.slow
def test_a_thousand_shape_programs() -> None:
    found = [p for p in (check(generate(seed)) for seed in SLOW_SEEDS if seed not in KNOWN_BUGS) if p]
    known = [p for p in found if any(sign in p for sign in KNOWN_SIGNATURES)]
    problems = [p for p in found if p not in known]
    print(f"{len(SLOW_SEEDS) - len(found)} of {len(SLOW_SEEDS)} agree with eager; {len(known)} meet open bugs")
    assert not problems, f"{len(problems)} of {len(SLOW_SEEDS)} programs differ:\n\n" + "\n\n".join(problems[:20])
