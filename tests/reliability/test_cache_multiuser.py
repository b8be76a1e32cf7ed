"""Another local user must never get code run through our cache: root is us, `nobody` the other user.

A first process (root) fills a cache. Each test then leaves a weakness another user could meet in
the wild (a folder of the cache left to them, world-writable folders made under umask 0, a link to
their folder), lets `nobody` do what the permissions allow with plain shell tools (swap a kernel
library and re-seal its hash record, plant a compiled-graph record whose compiler flags run a shell),
and runs our process again: it must answer as eager does with no fallback, the planted code (a
library constructor, a `-wrapper` shell) must not run (a marker file), and the refusal is said.
Skipped unless this runs as root and a `nobody` account exists (CI runs as root).
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln.runtime import records, store
from tests.reliability import cache_harness as harness


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to act as a second user"),
    pytest.mark.skipif(_nobody() is None, reason="needs a `nobody` account"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the planted library"),
]

_CONSTRUCTOR = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


@dataclass(frozen=True)
class World:
    base: Path  # root's, 0755: nobody may look in and run what is there, not write
    code: Path
    pristine: Path
    marker: Path
    planted: Path  # a library whose constructor writes the marker
    planted_sum: Path  # its size and SHA-256, sealed as Kiln seals a library's record


@pytest.fixture(scope="module")
def world() -> World:
    # under /tmp, whose sticky bit keeps others from renaming what is ours: a path they cannot replace
    base = Path(tempfile.mkdtemp(prefix="kiln-multiuser-", dir="/tmp"))
    base.chmod(0o755)
    code = harness.snapshot(base)
    pristine = base / "pristine"
    report, _ = harness.run(code, pristine)
    assert report["err"] < 1e-5 and report["frames"] == 1 and report["fallbacks"] == 0
    marker = base / "planted-code-ran"
    source = base / "planted.c"
    source.write_text(_CONSTRUCTOR % marker)
    planted = base / "planted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(planted)], check=True)
    digest = store.file_digest(str(planted))
    assert digest is not None
    planted_sum = base / "planted.so.sum"
    planted_sum.write_bytes(store.seal(json.dumps({"size": digest[0], "sha256": digest[1]}).encode()))
    for p in (planted, planted_sum):
        p.chmod(0o644)
    yield World(base, code, pristine, marker, planted, planted_sum)
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(script: str, cwd: Path) -> subprocess.CompletedProcess:
    user = _nobody()
    assert user is not None
    return subprocess.run(["sh", "-c", script], user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd=str(cwd),
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)


def _fresh_cache(world: World, name: str) -> Path:
    if world.marker.exists():
        world.marker.unlink()
    cache = world.base / name
    shutil.copytree(world.pristine, cache, symlinks=True)
    cache.chmod(0o755)  # ours, and not writable by others: the root alone was all Kiln used to check
    return cache


def _libraries(cache: Path) -> list[str]:
    """The kernel libraries as `cpp/<k>/<key>.so`, relative to the cache."""
    return [str(p.relative_to(cache)) for p in harness.files(cache, ".so")]


def _swap_libraries(libraries: list[str]) -> str:
    """A shell script for nobody: each library's folder moved aside (its owner may be us: a rename
    needs only the right to write the folder above) and made anew holding the planted library and
    its re-sealed record under the genuine names. Steps that the permissions refuse just fail."""
    lines = []
    for rel in libraries:
        folder = os.path.dirname(rel)
        lines.append(f"[ -e {folder}.gone ] || mv {folder} {folder}.gone; mkdir -p {folder}; "
                     f"cp ../planted.so {rel}; cp ../planted.so.sum {rel}.sum")
    return "\n".join(line + " 2>/dev/null" for line in lines) + "\ntrue"


def _second_run(world: World, cache: Path, **kwargs: object) -> str:
    report, stderr = harness.run(world.code, cache, **kwargs)  # type: ignore[arg-type]
    assert not world.marker.exists(), "the other user's code ran in our process"
    assert report["err"] < 1e-5 and report["fallbacks"] == 0, report
    return stderr


def test_a_subfolder_another_user_owns_is_not_used(world: World) -> None:
    """The issue's case: the root ours at 0755, `cpp/` theirs at 0777; they swap a library and
    re-seal its record. Each folder on the way is checked, not only the root."""
    cache = _fresh_cache(world, "theirs-cpp")
    libraries = _libraries(cache)
    os.chown(cache / "cpp", _nobody().pw_uid, -1)  # type: ignore[union-attr]
    (cache / "cpp").chmod(0o777)
    done = _as_nobody(_swap_libraries(libraries), cache)
    assert done.returncode == 0 and all((cache / rel).read_bytes() == world.planted.read_bytes() for rel in libraries)
    stderr = _second_run(world, cache)
    assert "cpp is not used (owned by uid" in stderr


def test_a_link_to_their_world_writable_folder_is_not_followed(world: World) -> None:
    cache = _fresh_cache(world, "linked-cpp")
    libraries = _libraries(cache)
    theirs = world.base / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    os.chown(theirs, _nobody().pw_uid, -1)  # type: ignore[union-attr]
    shutil.rmtree(cache / "cpp")
    (cache / "cpp").symlink_to(theirs)
    done = _as_nobody(_swap_libraries(libraries), cache)
    assert done.returncode == 0 and all((theirs / os.path.relpath(rel, "cpp")).exists() for rel in libraries)
    stderr = _second_run(world, cache)
    assert "cpp is not used (a symbolic link)" in stderr


def test_a_cache_made_under_umask_0_leaves_them_nothing_to_write(world: World) -> None:
    cache = world.base / "umask0"
    if world.marker.exists():
        world.marker.unlink()
    report, _ = harness.run(world.code, cache, umask=0)
    assert report["err"] < 1e-5
    cache.chmod(0o755)  # a root they may look into, as above
    libraries = _libraries(cache)
    _as_nobody(_swap_libraries(libraries), cache)
    _second_run(world, cache)
    assert all((cache / rel).read_bytes() != world.planted.read_bytes() for rel in libraries)  # refused
    for path in cache.rglob("*"):
        if not path.parent.lstat().st_mode & 0o077:
            # inside a build's private temporary folder (0700, a build the first process left unfinished
            # at exit): no other user can reach it, whatever the umask gave the file
            continue
        assert not path.lstat().st_mode & (stat.S_IWGRP | stat.S_IWOTH), path


def test_a_graph_record_planted_with_compiler_flags_runs_no_shell(world: World) -> None:
    """With `cpp/` theirs, a compiled-graph record carrying `-wrapper /bin/sh,-c,...` as compiler
    flags (what records used to hold) and the frame entries gone, so that the lowering reads it."""
    from kiln.lower.codegen.cpp_kernel import generate

    cache = _fresh_cache(world, "graph-flags")
    staged = world.base / "staged-graphs"
    staged.mkdir()
    plants = []
    for path in harness.files(cache, ".graph"):
        value = records.loads(store.read_sealed(str(path)), packages=("kiln.lower.",))
        program, hints = (value[0], value[3]) if len(value) == 5 else value
        source, signatures = generate(program)
        flags = ("-O1", "-shared", "-fPIC", "-wrapper", f"/bin/sh,-c,touch {world.marker}")
        forged = world.base / "staged-graphs" / path.name
        forged.write_bytes(store.seal(records.dumps((program, source, signatures, list(hints), flags))))
        forged.chmod(0o644)
        plants.append(f"cp {forged} {path.relative_to(cache)}")
    assert plants
    for entry in harness.files(cache, ".entry"):
        entry.unlink()
    os.chown(cache / "cpp", _nobody().pw_uid, -1)  # type: ignore[union-attr]
    (cache / "cpp").chmod(0o777)
    folders = sorted({os.path.dirname(p.split()[-1]) for p in plants})
    script = "\n".join(f"mv {f} {f}.gone; mkdir {f}" for f in folders) + "\n" + "\n".join(plants)
    assert _as_nobody(script, cache).returncode == 0
    _second_run(world, cache)


def test_files_of_another_user_in_our_folders_are_not_read(world: World) -> None:
    """Files only root could have put there (or left from when a folder was open): the library and
    its record replaced and given to nobody, inside folders that are ours."""
    cache = _fresh_cache(world, "their-files")
    for rel in _libraries(cache):
        for src, dst in ((world.planted, cache / rel), (world.planted_sum, cache / (rel + ".sum"))):
            shutil.copyfile(src, dst)
            os.chown(dst, _nobody().pw_uid, -1)  # type: ignore[union-attr]
            dst.chmod(0o600)
    stderr = _second_run(world, cache)
    assert "owned by uid" in stderr


def test_a_read_only_populated_cache_is_read(world: World) -> None:
    """Ours, made read-only (folders 0555, files 0444): every entry is served from it and nothing is
    written. Root writes anyway, so our process runs without the capability that lets it."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's permission override")
    cache = _fresh_cache(world, "read-only")
    for path in [cache, *cache.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in cache.rglob("*"))
    unprivileged = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    probe = subprocess.run([*unprivileged, "touch", str(cache / "cpp" / "probe")], capture_output=True)
    assert probe.returncode != 0 and not (cache / "cpp" / "probe").exists()  # truly read-only for it
    report, stderr = harness.run(world.code, cache, prefix=unprivileged)
    assert report["err"] < 1e-5 and report["disk_hits"] > 0 and report["frames"] == 0, (report, stderr[-2000:])
    assert "is not used" not in stderr and "built" not in stderr
    assert sorted((str(p), p.stat().st_mtime_ns) for p in cache.rglob("*")) == before
