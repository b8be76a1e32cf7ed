"""Torn, garbage and bit-flipped cache files never crash a process nor leave a function eager.

A torn kernel library (a crash or a full disk while copying) used to kill every later run with
SIGBUS, and a garbage one left its graph eager forever; both run in a fresh process here, which
must exit 0 with eager's answer and a rebuilt library. Bit flips in every kind of stored record
(frame entries, compiled-graph records, library hash records) are run in this process, a seeded
sample: each flipped file is read (the entries are removed when a graph or library record is
flipped, so that the lowering reads it), and every call ends with eager's answer.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

import kiln
from kiln.log import KilnWarning
from kiln.runtime import build, store
from tests.reliability import cache_harness as harness

pytestmark = pytest.mark.cpp


@pytest.fixture(scope="module")
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("damage")
    code = harness.snapshot(folder)
    cache = folder / "cache"
    report, _ = harness.run(code, cache)
    assert report["err"] < 1e-5
    return code, cache


@pytest.mark.parametrize("damage", ["torn", "garbage", pytest.param("empty", marks=pytest.mark.slow)])
def test_damaged_library_is_rebuilt_in_a_fresh_process(_pristine: tuple[Path, Path], tmp_path: Path,
                                                      damage: str) -> None:
    code, pristine = _pristine
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    libraries = harness.files(cache, ".so")
    genuine = {p: p.read_bytes() for p in libraries}
    for path, data in genuine.items():
        path.write_bytes({"torn": data[: len(data) // 2], "garbage": b"\x7fELF" + b"\xa5" * 300,
                          "empty": b""}[damage])
    for with_entries in (True, False):  # through the frame entry's recipe, then through the lowering
        if not with_entries:
            for path in harness.files(cache, ".so"):
                path.write_bytes(genuine[path][: len(genuine[path]) // 3] if damage == "torn" else b"")
            for path in harness.files(cache, ".entry"):
                path.unlink()
        report, stderr = harness.run(code, cache)
        assert report["err"] < 1e-5, report
        assert "failed verification" in stderr or "does not match" in stderr
        for path in libraries:  # rebuilt, and matching its record again
            size, digest = build._recorded(str(path))  # type: ignore[misc]
            assert store.file_digest(str(path)) == (size, digest)
    report, stderr = harness.run(code, cache)
    assert report["err"] < 1e-5 and report["disk_hits"] == 1  # the next process is warm again


# ---------------------------------------------------------------------------------------------------
# Bit flips, in this process


def _f(x):
    return (x.sin() * 3).relu() + x


def _fill(cache: Path) -> dict[Path, bytes]:
    with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
        kiln.reset()
        kiln.compile(_f, options={"opt_level": "-O1"})(torch.randn(8, 8))
    stored = [p for suffix in (".entry", ".graph", ".sum") for p in harness.files(cache, suffix)]
    assert {p.suffix for p in stored} == {".entry", ".graph", ".sum"}
    return {p: p.read_bytes() for p in stored}


def _restore(cache: Path, originals: dict[Path, bytes]) -> None:
    for path in harness.files(cache, ".entry"):
        if path not in originals:
            path.unlink()  # an entry a recapture stored: the next flip starts from the same state
    for path, data in originals.items():
        path.write_bytes(data)


def _flip_and_call(cache: Path, originals: dict[Path, bytes], rng: random.Random, x: torch.Tensor) -> str:
    path = rng.choice(sorted(originals))
    data = bytearray(originals[path])
    bit = rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    _restore(cache, originals)
    path.write_bytes(bytes(data))
    if path.suffix != ".entry":
        for entry in harness.files(cache, ".entry"):
            entry.unlink()
    build._loaded.clear()  # this process loaded the library already: make it read the record again
    with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
        kiln.reset()
        got = kiln.compile(_f, options={"opt_level": "-O1"})(x)
    torch.testing.assert_close(got, _f(x))
    return path.suffix


def _sweep(tmp_path: Path, flips: int, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_warned_damage", False)  # one warning per process: expect it here
    cache = tmp_path / "cache"
    originals = _fill(cache)
    rng = random.Random(seed)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(seed))
    seen = {_flip_and_call(cache, originals, rng, x) for _ in range(flips)}
    assert seen == {".entry", ".graph", ".sum"}  # every kind of record was hit
    kiln.reset()


def test_bit_flips_in_stored_records_end_in_eagers_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(KilnWarning, match="failed verification"):
        _sweep(tmp_path, 50, 0, monkeypatch)


@pytest.mark.slow
def test_bit_flips_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(KilnWarning, match="failed verification"):
        _sweep(tmp_path, 300, 1, monkeypatch)
