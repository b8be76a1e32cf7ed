"""Random aliasing programs agree with eager on every backend: values, strides, offsets, sharing.

Programs come from tests/fuzz/view_programs.py (seeded: seed n is always the same program): inputs
with strides, offsets and broadcasts, updated in place (data and metadata), returned as views
beside views of intermediates, under static shapes, automatic dynamic, dynamic=True and
maybe_mark_dynamic, some with gradients. The CI slice checks seeds 0-99 on "eager" and
"aot_eager" and every fifth of them on "inductor" too (each inductor program costs a C++ build);
the @slow run checks 2,000 programs on all three. Expected: 0 wrong answers, 0 fallbacks.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from view_programs import BACKENDS, LAYOUTS, MODES, check, generate  # noqa: E402

CI_SEEDS = range(100)
SLOW_SEEDS = range(2000)


def _backends(seed: int) -> tuple[str, ...]:
    return BACKENDS if seed % 5 == 0 else ("eager", "aot_eager")


def test_generator_is_deterministic_and_covers_every_family() -> None:
    assert generate(7).source == generate(7).source
    programs = [generate(seed) for seed in CI_SEEDS]
    assert len({p.source for p in programs}) == len(programs)
    text = "\n".join(p.repro() for p in programs)
    for family in ("'strided_rows'", "'column_slice'", "'offset'", "'channels_last'", "'expanded'", "'empty'",
                   "torch.bfloat16", "torch.complex64", ".add_(", "[0].fill_(", ".t_()", ".unsqueeze_(",
                   "[::2]", ".diagonal()", ".unfold(", ".expand(", ".as_strided(", ".unbind(", ".split(",
                   ".chunk(", ".view(torch.int32)", ".real", "[..., :1].fill_(3)", "gradients: True",
                   ".storage_offset()"):
        assert family in text, family
    assert {p.mode for p in programs} == set(MODES)
    assert {spec.layout for p in programs for spec in p.inputs} == set(LAYOUTS)


@pytest.mark.cpp
def test_ci_slice_of_view_programs() -> None:
    problems = [p for p in (check(generate(seed), _backends(seed)) for seed in CI_SEEDS) if p]
    assert not problems, "\n\n".join(problems)


@pytest.mark.cpp
@pytest.mark.slow
def test_two_thousand_view_programs() -> None:
    problems = [p for p in (check(generate(seed)) for seed in SLOW_SEEDS) if p]
    print(f"{len(SLOW_SEEDS) - len(problems)} of {len(SLOW_SEEDS)} agree with eager")
    assert not problems, f"{len(problems)} of {len(SLOW_SEEDS)} programs differ:\n\n" + "\n\n".join(problems[:20])
