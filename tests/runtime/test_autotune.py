"""Autotuning without a GPU: the candidates never change what a kernel computes, the choice is
recorded on disk and read back instead of timing again, and kernels that write what they read
are not re-run. (Timing under Triton's interpreter means nothing; tests/gpu times real kernels.)"""
from __future__ import annotations

import pytest

from kiln import config
from kiln.runtime import autotune
from kiln.runtime.autotune import AutotunedKernel, KernelShape, LaunchConfig


def test_persistent_reductions_keep_the_block_that_covers_a_row() -> None:
    options = autotune.candidates(KernelShape("persistent", 8, 256))
    assert options[0] == LaunchConfig(8, 256, 4, 2)
    assert {c.rblock for c in options} == {256} and len(options) > 10
    assert all(c.xblock * c.rblock <= autotune.TILE_LIMIT for c in options)


def test_flat_and_looped_kernels_try_block_sizes_warps_and_stages() -> None:
    flat = autotune.candidates(KernelShape("flat", 1024, None))
    assert {c.xblock for c in flat} >= {128, 1024} and {c.num_warps for c in flat} == {2, 4, 8}
    looped = autotune.candidates(KernelShape("looped", 8, 256))
    assert {c.rblock for c in looped} >= {64, 1024} and len(set(looped)) == len(looped)


class _FakeKernel:
    """Stands for a triton kernel: records each launch (grid, configuration)."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kw: self.launches.append((grid, kw))


def test_choice_is_timed_once_stored_and_read_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    timed: list[LaunchConfig] = []
    fast = LaunchConfig(256, None, 2, 1)

    def timer(run) -> float:
        kernel.launches.clear()
        run()
        grid, kw = kernel.launches[-1]
        c = LaunchConfig(kw["XBLOCK"], None, kw["num_warps"], kw["num_stages"])
        timed.append(c)
        assert grid == (-(-5000 // c.xblock),)  # the grid follows the block size
        return 1.0 if c == fast else 2.0

    kernel = _FakeKernel()
    tuned = AutotunedKernel(kernel, "kernel0", "source", KernelShape("flat", 1024, None), rerunnable=True,
                            timer=timer)
    tuned.launch(5000, "a", "b")
    assert len(timed) == len(autotune.candidates(KernelShape("flat", 1024, None)))
    assert tuned.chosen[5000] == fast and kernel.launches[-1][1]["XBLOCK"] == 256
    again = AutotunedKernel(_FakeKernel(), "kernel0", "source", KernelShape("flat", 1024, None), rerunnable=True,
                            timer=lambda run: pytest.fail("timed again"))
    again.launch(5000, "a", "b")  # a later process: the stored record answers
    assert again.chosen[5000] == fast


def test_kernels_that_write_what_they_read_are_not_rerun(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    kernel = _FakeKernel()
    tuned = AutotunedKernel(kernel, "kernel1", "src", KernelShape("atomic", 1024, None), rerunnable=False,
                            timer=lambda run: pytest.fail("an atomic scatter was re-run"))
    tuned.launch(100, "x")
    assert len(kernel.launches) == 1 and kernel.launches[0][1]["XBLOCK"] == 1024
