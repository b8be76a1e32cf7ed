"""kiln.config.fallback_random: random ops run as ATen calls on torch's generator, so a compiled
program draws eager's numbers under the same seed (as torch.compile's fallback_random): values,
gradients through dropout, and the generator's state after the call. Off (the default), random ops
are lowered into kernels drawing from Kiln's own counter-based generator."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = pytest.mark.cpp

PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "dropout_after_mm": lambda x: F.dropout(x @ x.t(), 0.4) + 1,
    "dropout_transposed": lambda x: F.dropout(x.t() * 2, 0.5),
    "rand_randn_like": lambda x: (x + torch.rand(x.shape)) * torch.randn_like(x),
    "bernoulli_tensor": lambda x: torch.bernoulli(x.sigmoid()) * x,
    "randint_multinomial": lambda x: (torch.randint(0, 9, (5,)), torch.multinomial(x.softmax(-1), 2)),
    "rand_then_dropout": lambda x: F.dropout(x + torch.rand(4, 3), 0.3).sum(0),
    # channel dropouts draw a (N, C, 1, 1) noise: its size-1 dims must not count as a permuted layout
    "dropout2d": lambda x: F.dropout2d(x.view(1, 4, 3, 1), 0.5) * 2,
    "feature_alpha_dropout": lambda x: F.feature_alpha_dropout(x.view(2, 2, 3), 0.5, True),
    "alpha_dropout_transposed": lambda x: F.alpha_dropout(x.t(), 0.2, True),
}


def _run(fn: Callable[[torch.Tensor], Any], x0: torch.Tensor) -> list[Any]:
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(11)
    out = fn(x)
    outs = list(out) if isinstance(out, tuple) else [out]
    after = torch.rand(3)  # the generator's state after the call
    floats = [o for o in outs if o.is_floating_point()]
    if floats and floats[0].requires_grad:
        sum(o.sum() for o in floats).backward()
    return [*(o.detach() for o in outs), after, x.grad]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_fallback_random_draws_eagers_numbers(name: str, dynamic: bool) -> None:
    fn = PROGRAMS[name]
    x0 = torch.randn(4, 3)
    expected = _run(fn, x0)
    kiln.reset()
    with config.patch(fallback_random=True):
        compiled = kiln.compile(fn, dynamic=dynamic)
        for _ in range(2):
            got = _run(compiled, x0)
            for g, e in zip(got, expected):
                if e is None:
                    assert g is None
                else:
                    torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert kiln.stats()["fallbacks"] == 0


def test_the_setting_is_part_of_the_graph_key(tmp_path: Any) -> None:
    # a graph compiled with lowered random ops (and stored) is not reused once fallback_random is on
    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x * 3, 0.5)

    x = torch.randn(64)
    torch.manual_seed(5)
    expected = fn(x)
    with config.patch(cache_dir=str(tmp_path)):
        kiln.reset()
        torch.manual_seed(5)
        lowered = kiln.compile(fn)(x)
        kiln.reset()
        with config.patch(fallback_random=True):
            torch.manual_seed(5)
            drawn = kiln.compile(fn)(x)
    assert not torch.equal(lowered, expected)  # Kiln's own generator: other masks (64 draws)
    torch.testing.assert_close(drawn, expected)
