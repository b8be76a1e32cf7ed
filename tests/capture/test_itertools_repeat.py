"""itertools.repeat with its count given as the keyword `times`: the real torch.compile never ends
tracing `list(itertools.repeat(x, times=2))` (it loops on the repeat as if it had no count), so this
case is checked against eager only; the corpus case itertools_repeat_without_times_beside_finite_columns
has the positional forms with torch.compile as its oracle."""
from __future__ import annotations

import itertools

import torch

import kiln


def _repeat_by_keyword(x: torch.Tensor) -> tuple:
    return list(itertools.repeat(x, times=2)), list(itertools.repeat(x * 2, times=0)), \
        list(zip(itertools.repeat(1, times=3), [x, x + 1]))


def test_repeat_with_times_as_a_keyword_is_one_graph_with_eagers_items() -> None:
    kiln.reset()
    x = torch.randn(3)
    compiled = kiln.compile(_repeat_by_keyword, backend="eager", fullgraph=True)
    got, expected = compiled(x), _repeat_by_keyword(x)
    assert [len(part) for part in got] == [len(part) for part in expected] == [2, 0, 2]
    for a, b in zip(got[0], expected[0]):
        torch.testing.assert_close(a, b)
    assert [k for k, _ in got[2]] == [1, 1]
    assert kiln.stats()["graphs"] == 1
