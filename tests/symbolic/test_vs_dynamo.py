"""Kiln's shape guards accept and reject the same inputs as the real torch.compile(dynamic=True).

Oracle: torch.compile with a counting "eager" backend; a probe that makes it compile again failed its
guards. Kiln's side: the function run on kiln.fake tensors with every dim dynamic (what dynamic=True
asks capture to do), then the ShapeEnv's guards evaluated on the probe. First-call sizes are >= 2 and
distinct unless the op forces them equal, so Dynamo's duck sizing (equal sizes share one symbol)
makes no difference.
"""
from __future__ import annotations

import pytest
import torch

import kiln.fake as fake
from kiln.symbolic import ShapeEnv


def kiln_guards(fn, args: dict[str, torch.Tensor]) -> ShapeEnv:
    env = ShapeEnv()
    mode = fake.FakeTensorMode(shape_env=env)
    fakes = [mode.from_real(t, source=f"L['{name}']", dynamic_dims=tuple(range(t.dim())))
             for name, t in args.items()]
    with mode:
        fn(*fakes)
    return env


def dynamo_accepts(fn, first: dict, probes: list[dict]) -> list[bool]:
    """Whether the guards of Dynamo's first capture (at `first`) pass for each probe."""
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    torch.compile(fn, backend="eager", dynamic=True)(*first.values())
    (entry,) = _debug_get_cache_entry_list(fn.__code__)
    return [bool(entry.guard_manager.check(dict(probe))) for probe in probes]


def t(*shape: int) -> torch.Tensor:
    return torch.randn(shape)


CASES = {
    "broadcast_add": (lambda x, b: x + b, dict(x=t(5, 8), b=t(8)),
                      [dict(x=t(7, 3), b=t(3)), dict(x=t(1, 8), b=t(8)), dict(x=t(7, 8), b=t(1))]),
    "matmul": (lambda x, w: (x @ w).relu(), dict(x=t(5, 8), w=t(8, 7)),
               [dict(x=t(3, 4), w=t(4, 9)), dict(x=t(2, 1), w=t(1, 9))]),
    "cat_view": (lambda x, y: torch.cat([x, y]).view(-1), dict(x=t(5, 4), y=t(3, 4)),
                 [dict(x=t(2, 6), y=t(9, 6)), dict(x=t(1, 4), y=t(3, 4))]),
    "halves": (lambda x: x[:, : x.shape[1] // 2].sum(1), dict(x=t(3, 10)),
               [dict(x=t(4, 7)), dict(x=t(2, 2)), dict(x=t(4, 1))]),
    "view_by_four": (lambda x: x.view(-1, 4).sum(0), dict(x=t(6, 10)),
                     [dict(x=t(2, 10)), dict(x=t(3, 4)), dict(x=t(12, 10)), dict(x=t(6, 2))]),
    "split_specializes": (lambda x: [p.sum() for p in x.split(4)], dict(x=t(10)),
                          [dict(x=t(11)), dict(x=t(12)), dict(x=t(13))]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_verdicts_as_dynamo(name):
    fn, first, probes = CASES[name]
    env = kiln_guards(fn, first)
    ours = [env.failing_guard(probe) is None for probe in probes]
    theirs = dynamo_accepts(fn, first, probes)
    assert ours == theirs, [g.python for g in env.guards]
    assert False in theirs  # each case has a probe that must recompile
