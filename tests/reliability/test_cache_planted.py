"""Files planted in the cache by someone who can write there must not run code in a later process.

A first process fills a cache; then a frame entry, a compiled-graph record or a kernel library is
replaced by one that would create a marker file when loaded (a pickle gadget calling os.system, an
entry whose glue calls it, a shared object with a constructor), each with a valid seal and name
hash, as an attacker who knows the format would write them. The second process must answer
correctly and the marker must not exist. (An attacker who can also rewrite the library's recorded
hash is the case the directory permission check exists for: see test_cache_trust.py.)
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.capture import persist
from kiln.lower.schedule import Kernel, ScatterKernel
from kiln.runtime import records, store
from tests.reliability import cache_harness as harness

pytestmark = pytest.mark.cpp


class _Gadget:
    """Pickles to `os.system(command)`: what an unrestricted pickle.load would run."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture(scope="module")
def _pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One Kiln copy and one cache filled by a first process, shared by this file's tests."""
    folder = tmp_path_factory.mktemp("planted")
    code = harness.snapshot(folder)
    cache = folder / "cache"
    report, _ = harness.run(code, cache)
    assert report["err"] < 1e-5 and report["frames"] == 1
    return code, cache


@pytest.fixture
def filled(_pristine: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """(Kiln copy, a private copy of the filled cache) for one test to plant files in."""
    code, pristine = _pristine
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    return code, cache


def _replace_entry(cache: Path, body: bytes) -> Path:
    """Put `body`, sealed and named by its hash as genuine entries are, in place of the entry."""
    (entry,) = harness.files(cache, ".entry")
    entry.unlink()
    planted = entry.parent / (persist._content_name(body))
    planted.write_bytes(store.seal(body))
    return planted


def _check_second_run(code: Path, cache: Path, marker: Path) -> str:
    report, stderr = harness.run(code, cache)
    assert report["err"] < 1e-5, report
    assert not marker.exists(), "planted code ran"
    return stderr


def test_entry_with_a_pickle_gadget_does_not_run(filled: tuple[Path, Path], tmp_path: Path) -> None:
    code, cache = filled
    marker = tmp_path / "pwned_entry"
    body = pickle.dumps(_Gadget(f"touch {marker}"), protocol=pickle.HIGHEST_PROTOCOL)
    assert b"system" in body
    planted = _replace_entry(cache, body)
    stderr = _check_second_run(code, cache, marker)
    assert not planted.exists() and "not an admitted record type" in stderr


def test_entry_whose_glue_calls_os_system_does_not_run(filled: tuple[Path, Path], tmp_path: Path) -> None:
    code, cache = filled
    marker = tmp_path / "pwned_glue"
    (entry,) = harness.files(cache, ".entry")
    frame = persist.loads(store.read_sealed(str(entry)))
    evil = frame.glue_source.replace("def " + frame.glue_name + "(L, G, F):\n",
                                     "def " + frame.glue_name + "(L, G, F):\n"
                                     f"    __v = __import__('os').system('touch {marker}')\n", 1)
    assert evil != frame.glue_source
    forged = persist.StoredFrame(frame.format, frame.guards, frame.glue_name, evil, frame.graphs)
    planted = _replace_entry(cache, persist.dumps(forged))
    stderr = _check_second_run(code, cache, marker)
    assert not planted.exists() and "stored code calls" in stderr


def test_graph_record_with_a_pickle_gadget_does_not_run(filled: tuple[Path, Path], tmp_path: Path) -> None:
    code, cache = filled
    marker = tmp_path / "pwned_graph"
    for path in harness.files(cache, ".entry"):
        path.unlink()  # so that the second process lowers the graphs and reads the graph records
    graphs = harness.files(cache, ".graph")
    assert graphs
    for path in graphs:
        path.write_bytes(store.seal(pickle.dumps(_Gadget(f"touch {marker}"))))
    _check_second_run(code, cache, marker)
    for path in harness.files(cache, ".graph"):  # rebuilt with real records
        assert b"system" not in path.read_bytes()


def _graph_records(cache: Path) -> list[tuple[Path, object, list[str]]]:
    """(path, program, hints) of each compiled-graph record, after deleting the frame entries so that
    a second process lowers its graphs and reads these records."""
    for path in harness.files(cache, ".entry"):
        path.unlink()
    out = []
    for path in harness.files(cache, ".graph"):
        value = records.loads(store.read_sealed(str(path)), packages=("kiln.lower.",))
        out.append((path, value[0], list(value[-2] if len(value) == 5 else value[1])))  # as written before too
    assert out
    return out


def test_graph_record_with_compiler_flags_runs_no_shell(filled: tuple[Path, Path], tmp_path: Path) -> None:
    """Records used to carry C++ source and compiler flags, both used as read: `-wrapper` makes g++
    run any program. A record of that shape is refused now (flags come from this process's settings,
    C++ from the program), whatever its source and flags hold."""
    from kiln.lower.codegen.cpp_kernel import generate

    code, cache = filled
    marker = tmp_path / "pwned_flags"
    for path, program, hints in _graph_records(cache):
        source, signatures = generate(program)
        evil_source = source + f'\n__attribute__((constructor)) static void planted() {{ __builtin_puts("{marker}"); }}\n'
        flags = ("-O1", "-shared", "-fPIC", "-std=c++17", "-fopenmp", "-wrapper", f"/bin/sh,-c,touch {marker}")
        path.write_bytes(store.seal(records.dumps((program, evil_source, signatures, hints, flags))))
    stderr = _check_second_run(code, cache, marker)
    assert "not a graph record" in stderr
    for path in harness.files(cache, ".graph"):  # stored again, with no flags in them
        assert b"-wrapper" not in path.read_bytes() and b"-fopenmp" not in path.read_bytes()


def test_graph_record_whose_names_are_code_is_refused(filled: tuple[Path, Path], tmp_path: Path) -> None:
    """A record of the current shape, its kernel renamed to C++ that would define a constructor:
    names are printed into the generated source as they are, so a stored program's names must be
    names, or the record is refused."""
    code, cache = filled
    marker = tmp_path / "pwned_name"
    for path, program, hints in _graph_records(cache):
        evil = f'kernel0(){{}} __attribute__((constructor)) static void p(){{__builtin_puts("{marker}");}} void k'
        steps = tuple(dataclasses.replace(st, name=evil) if isinstance(st, (Kernel, ScatterKernel)) else st
                      for st in program.steps)
        path.write_bytes(store.seal(records.dumps((dataclasses.replace(program, steps=steps), tuple(hints)))))
    stderr = _check_second_run(code, cache, marker)
    assert "not a name" in stderr


_CONSTRUCTOR = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def test_swapped_kernel_library_is_not_loaded(filled: tuple[Path, Path], tmp_path: Path) -> None:
    code, cache = filled
    marker = tmp_path / "pwned_library"
    source = tmp_path / "planted.c"
    source.write_text(_CONSTRUCTOR % marker)
    libraries = harness.files(cache, ".so")
    assert libraries
    for library in libraries:  # the recorded size and hash (.so.sum) stay the genuine ones
        subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    _check_second_run(code, cache, marker)
    # and with the frame entries gone, the lowering's own load of each library refuses it too
    for library in libraries:
        subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    for path in harness.files(cache, ".entry"):
        path.unlink()
    _check_second_run(code, cache, marker)


def test_library_without_its_symbols_is_rebuilt_not_left_eager(filled: tuple[Path, Path], tmp_path: Path) -> None:
    """A library that matches its (re-sealed) record but lacks the kernels its wrapper binds used to
    make the graph fall back to eager in every later process: it is deleted and built again."""
    code, cache = filled
    empty = tmp_path / "empty.c"
    empty.write_text("int kiln_nothing_here;\n")
    for library in harness.files(cache, ".so"):
        subprocess.run(["gcc", "-shared", "-fPIC", str(empty), "-o", str(library)], check=True)
        digest = store.file_digest(str(library))
        Path(str(library) + ".sum").write_bytes(store.seal(json.dumps({"size": digest[0], "sha256": digest[1]}).encode()))
    report, stderr = harness.run(code, cache)
    assert report["err"] < 1e-5 and report["fallbacks"] == 0, (report, stderr[-3000:])
    assert " lacks " in stderr
    report, stderr = harness.run(code, cache)  # the next process finds the rebuilt libraries
    assert report["err"] < 1e-5 and report["fallbacks"] == 0 and report["disk_hits"] > 0, report
    assert "built" not in stderr and " lacks " not in stderr


_TRITON_PLANT = """
import hashlib, os, pathlib, sys
from kiln import config
from kiln.runtime import triton_build
source = "VALUE = 1\\n"
key = hashlib.sha256(source.encode()).hexdigest()[:32]
folder = pathlib.Path(config.cache_dir) / "triton" / key[:2]
folder.mkdir(parents=True, exist_ok=True)
(folder / f"kiln_{key}.py").write_text(f"pathlib = __import__('pathlib'); pathlib.Path({sys.argv[1]!r}).write_text('ran')\\nVALUE = 2\\n")
module = triton_build.load(source, interpret=True)
print(module.VALUE)
"""


def test_planted_triton_module_is_not_imported(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    marker = tmp_path / "pwned_triton"
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {**os.environ, "KILN_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", _TRITON_PLANT, str(marker)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "1" and not marker.exists()


def test_autotune_record_round_trips_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    from kiln import config
    from kiln.runtime import autotune

    store.forget_verdicts()
    with config.patch(cache_dir=str(tmp_path / "cache")):
        choice = autotune.LaunchConfig(4, None, 2, 1)
        autotune.store_choice("ab" * 16, choice, {"x": 1.0})
        assert autotune.stored_choice("ab" * 16) == choice
        (path,) = (tmp_path / "cache" / "autotune").rglob("*.json")
        path.write_bytes(path.read_bytes().replace(b'"xblock": 4', b'"xblock": 5'))
        with pytest.warns(UserWarning):
            store._warned_damage = False
            assert autotune.stored_choice("ab" * 16) is None
    store.forget_verdicts()
