"""Shared by the cache reliability tests: a frozen copy of Kiln, and scripts run in fresh processes.

Every persistent-cache key holds a digest of Kiln's sources, and other people edit them while the
tests run; the subprocesses therefore import a copy of kiln/ taken once per session (PYTHONPATH
puts it before the editable install), so that two runs of one test meet the same keys.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

from kiln import config

REPO = Path(__file__).resolve().parents[2]

# One compiled function (default backend, forward and backward) and one report line:
# the largest difference from eager, entries served from disk, and frames captured.
SCRIPT = textwrap.dedent("""
    import json, sys, torch, kiln

    def f(x, w):
        return torch.tanh(x @ w).sin() * 2 + 1

    compiled = kiln.compile(f, options={"opt_level": "-O1"})  # faster builds
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    w = torch.randn(5, 4, generator=g, requires_grad=True)
    out = compiled(x, w)
    out.sum().backward()
    got = w.grad.clone()
    w.grad = None
    f(x, w).sum().backward()
    err = max((out - f(x, w)).abs().max().item(), (got - w.grad).abs().max().item())
    stats = kiln.stats()
    print(json.dumps({"err": err, "disk_hits": stats["disk_hits"], "frames": stats["frames"],
                      "compiles": stats["compiles"], "fallbacks": stats["fallbacks"]}))
""")


def snapshot(folder: Path) -> Path:
    """A copy of kiln/ under `folder` (made once), to put first on PYTHONPATH. Its compiled bytecode
    comes along (copytree keeps the sources' times, which is what a .pyc is checked against), so the
    first process does not compile every module again (about 1 s each test)."""
    target = folder / "kiln_snapshot"
    if not (target / "kiln").exists():
        shutil.copytree(REPO / "kiln", target / "kiln")
    return target


def run(code: Path, cache: Path, script: str = SCRIPT, *, prefix: Sequence[str] = (), umask: int | None = None,
        **env: str) -> tuple[dict[str, Any], str]:
    """Run `script` with the Kiln copy at `code` and the cache at `cache`: (its report, stderr).
    `prefix`: a command the interpreter runs under (setpriv ...); `umask`: the process's umask."""
    environment = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": str(code),
                   "KILN_PERSISTENT_CACHE": "1", "KILN_LOGS": "cache", **env}
    proc = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                          timeout=300, cwd=str(code), preexec_fn=None if umask is None else lambda: os.umask(umask))
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def files(cache: Path, suffix: str) -> list[Path]:
    return sorted(p for p in cache.rglob(f"*{suffix}") if p.is_file())


def temporaries(cache: Path) -> list[Path]:
    return [p for p in cache.rglob(".tmp-*")]


# ---------------------------------------------------------------------------------------------------
# Seeding a fresh cache with the builds that no graph owns

SEED_SOURCE = Path(config.cache_dir)  # read at import, before any test patches it: the user's cache
_seeded: list[Path] = []  # precompiled-header copies this process made, oldest first
_KEEP_SEEDED = 4  # copies of the 270 MB header kept at once; an older one is deleted (rebuilt if used)


@functools.cache
def _seed_files() -> tuple[str, ...]:
    """The builds no graph owns, as paths relative to a cache root: the boundary extension and the
    native wrappers' precompiled header with their sealed records, built into SEED_SOURCE first
    (`make venv` already built the extension there) when missing."""
    from kiln.runtime import boundary, build, native, store

    def present() -> list[str] | None:
        with config.patch(cache_dir=str(SEED_SOURCE)):
            root, header = store.root(), native.precompiled_header_path()
            if root is None or header is None:
                return None
            library = build.library_path(boundary.source(), boundary._flags())
            found = [library, library + ".sum"] if build.is_cached(boundary.source(), boundary._flags()) else []
            found += [header, header + ".gch.sum", header + ".gch"] if native._pch_ok(header) else []
            return [os.path.relpath(path, root) for path in found]

    found = present()
    if found is not None and len(found) < 5:
        subprocess.run([sys.executable, "-c", "from kiln.runtime import boundary, native\n"
                        "boundary.build_now(); native.ensure_precompiled_header()"],
                       env={**os.environ, "KILN_CACHE_DIR": str(SEED_SOURCE)}, cwd=str(REPO), capture_output=True,
                       timeout=1200)
        found = present()
    return tuple(found or ())


def seed(cache: Path) -> Path:
    """`cache`, created if need be, holding copies of the builds no graph owns (_seed_files), as a
    user's cache holds them after `make venv` and a first native graph: a second-process test that
    builds native wrappers but does not test those builds then compiles neither (test_native_wrapper:
    CPU 90.6 s -> 37.5 s). Where the processes only start the extension's build on a tier-up thread
    it gained nothing measurable. Copies, not links: the cache refuses a file with two names."""
    for relative in _seed_files():
        target = cache / relative
        if target.exists():
            continue
        for folder in [cache, *(cache / part for part in reversed(Path(relative).parents[:-1]))]:
            folder.mkdir(exist_ok=True)
            folder.chmod(0o700)
        shutil.copyfile(SEED_SOURCE / relative, target)
        target.chmod(0o700 if target.suffix == ".so" else 0o600)
        if target.suffix == ".gch":
            _seeded.append(target)
            while len(_seeded) > _KEEP_SEEDED:
                _seeded.pop(0).unlink(missing_ok=True)
    return cache


@atexit.register
def _drop_seeded() -> None:
    for path in _seeded:
        path.unlink(missing_ok=True)
