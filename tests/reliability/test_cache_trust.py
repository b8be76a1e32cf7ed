"""Which cache directory Kiln trusts, what a full disk leaves behind, and a cache moved elsewhere.

A directory that group or others may write, or that another user owns, is refused with one
warning and the cache is off (compiling still works, into a folder private to the process). A
write that fails with ENOSPC leaves no temporary file. A cache moved to another path loads its
entries and libraries from the new place (stored paths are relative to the cache root).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest
import torch

import kiln
from kiln.log import KilnWarning
from kiln.runtime import build, store
from tests.reliability import cache_harness as harness

pytestmark = pytest.mark.cpp


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    store.forget_verdicts()
    kiln.reset()
    yield
    store.forget_verdicts()
    kiln.reset()


def _f(x):
    return torch.cos(x) * 2 - x


def _compile_and_check(cache: Path) -> list[warnings.WarningMessage]:
    x = torch.randn(5, 3)
    with warnings.catch_warnings(record=True) as caught, \
            kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(kiln.compile(_f, options={"opt_level": "-O1"})(x), _f(x))
    return [w for w in caught if issubclass(w.category, KilnWarning)]


def test_new_cache_dir_is_private(tmp_path: Path) -> None:
    cache = tmp_path / "made" / "cache"
    assert _compile_and_check(cache) == []
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert harness.files(cache, ".entry") and harness.files(cache, ".so")


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_group_or_world_writable_cache_dir_is_refused_with_one_warning(tmp_path: Path, mode: int) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(mode)
    caught = _compile_and_check(cache)
    assert len(caught) == 1 and "is not used" in str(caught[0].message) and "writable" in str(caught[0].message)
    assert list(cache.iterdir()) == []  # nothing read, nothing written


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_cache_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o700)
    os.chown(cache, os.getuid() + 4242, -1)
    caught = _compile_and_check(cache)
    assert len(caught) == 1 and "owned by uid" in str(caught[0].message)
    assert list(cache.iterdir()) == []


class _FullDisk:
    """A file whose writes fail as on a full disk."""

    def __init__(self, real):
        self.real = real

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()


def test_enospc_leaves_no_temporary_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    real_fdopen = os.fdopen
    monkeypatch.setattr(store.os, "fdopen", lambda fd, *a, **k: _FullDisk(real_fdopen(fd, *a, **k)))

    def full_compile(source, out_path, flags=build.DEFAULT_FLAGS):
        with open(out_path, "wb") as f:
            f.write(b"\x7fELF half a library")  # what the compiler wrote before the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "compile_shared", full_compile)
    x = torch.randn(4)
    with kiln.config.patch(cache_dir=str(cache), persistent_cache=True), \
            pytest.warns(KilnWarning):  # the frame falls back to eager, with one warning
        torch.testing.assert_close(kiln.compile(_f, options={"opt_level": "-O1"})(x), _f(x))
    assert harness.temporaries(cache) == []
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # no half library, no sealed records

    # The compiler works again but no record can be written: the library is still used (from a
    # folder of this process), nothing is left in the cache, and no warning is needed.
    monkeypatch.setattr(build, "compile_shared", _real_compile)
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
            compiled = kiln.compile(_f, options={"opt_level": "-O1"})
            torch.testing.assert_close(compiled(x), _f(x))
    assert kiln.stats()["fallbacks"] == 0
    assert harness.temporaries(cache) == []
    assert harness.files(cache, ".entry") == [] and harness.files(cache, ".sum") == []


_real_compile = build.compile_shared


def test_moved_cache_loads_from_its_new_place(tmp_path: Path) -> None:
    code = harness.snapshot(tmp_path)
    first = tmp_path / "first"
    report, _ = harness.run(code, first)
    assert report["frames"] == 1
    moved = tmp_path / "elsewhere" / "cache"
    moved.parent.mkdir()
    shutil.move(str(first), str(moved))
    report, stderr = harness.run(code, moved)
    assert report["disk_hits"] > 0 and report["frames"] == 0 and report["err"] < 1e-5
    assert "built" not in stderr and str(first) not in stderr  # nothing compiled, nothing read from the old place


def test_reset_judges_a_fixed_cache_dir_again(tmp_path: Path) -> None:
    """A refused directory is remembered for the process; after the user fixes it, kiln.reset()
    (which already forgets compiled entries) makes Kiln look at it again."""
    cache = tmp_path / "fixed"
    cache.mkdir()
    cache.chmod(0o777)
    assert len(_compile_and_check(cache)) == 1
    cache.chmod(0o700)
    _compile_and_check(cache)
    assert list(cache.iterdir()) == []  # still the verdict of the first look
    kiln.reset()
    assert _compile_and_check(cache) == []
    assert harness.files(cache, ".entry")
