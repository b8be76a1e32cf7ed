"""Fixtures for the diagnostics tests: a planted bug per test, each with its own artifact cache.

The compiled-graph cache is keyed by Kiln's sources, which a planted bug does not change, so every
test gets an empty cache directory (a graph compiled under one plant must not answer another).
"""
from __future__ import annotations

from typing import Callable, Iterator

import pytest
import torch

import kiln
from tests.debug.planted import plant


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "kiln_cache")
    monkeypatch.setattr(kiln.config, "cache_dir", path)
    return path


@pytest.fixture
def planted(fresh_cache: str) -> Iterator[Callable[[str], None]]:
    """`planted("wrong_lowering")` plants that bug until the test ends."""
    undo: list[Callable[[], None]] = []

    def start(name: str) -> None:
        undo.append(plant(name))

    kiln.reset()
    yield start
    for fn in reversed(undo):
        fn()
    kiln.reset()


def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The program every planted bug shows up in: a softmax (reductions fused with pointwise work),
    a multiplication and an addcmul (decomposed by the lowering)."""
    y = torch.softmax(x * w, dim=-1)
    return y.sum(-1) + torch.addcmul(x, x, w, value=0.5).mean(-1)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=gen), torch.randn(16, generator=gen)
