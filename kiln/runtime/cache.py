"""Cache keys, and the compiled-graph records stored under them.

A key is a hash of what decides an artifact's bytes: the source, the compiler flags, the
compiler's version, the torch version and the CPU's feature flags (kernels build with
-march=native, so two CPUs of one model name but different microcode or virtualization can differ
in what they run), and, for Kiln's own records, a digest of Kiln's sources found by walking the
package folder on disk (no import of the stages it hashes). A compiled graph is stored as a sealed
record file (kiln.runtime.store, kiln.runtime.records) so a later process skips the lowering: its
loop-level program only, never C++ source or compiler flags, which the reader makes again from the
program and its own settings (a record is read as data, and a flag such as `-wrapper` would run a
program of the file's choosing); a damaged or foreign file is deleted and the graph compiled again. Corresponds to
torch/_inductor/codecache.py (the keys and FxGraphCache).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from typing import Any, Callable, Sequence

import torch

from kiln import log
from kiln.runtime import records, store

_KILN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the kiln/ package folder


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@functools.lru_cache(maxsize=None)
def cpu_features() -> str:
    """The CPU's model name and its instruction-set flags (what -march=native builds for)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    model = next((line for line in lines if line.startswith("model name")), "")
    # x86 calls them "flags", arm64 "Features"; sorted so that their order cannot split keys
    flags = next((line for line in lines if line.startswith(("flags", "Features"))), "")
    words = sorted(set(flags.partition(":")[2].split()))
    return f"{platform.machine()}|{model.partition(':')[2].strip()}|{' '.join(words)}"


@functools.lru_cache(maxsize=None)
def source_digest(*packages: str) -> str:
    """A hash of the .py files under kiln/<package> (a folder or one file) for each name (all of
    kiln/ when none), read from disk: a changed compiler must not reuse old artifacts, and hashing must not import it."""
    h = hashlib.sha256()
    for package in packages or ("",):
        top = os.path.join(_KILN_ROOT, package)
        walk = [(_KILN_ROOT, [], [package])] if os.path.isfile(top) else os.walk(top)
        for folder, dirs, files in walk:
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    h.update(os.path.relpath(path, _KILN_ROOT).encode() + b"\0")
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()


def code_version() -> str:
    """The digest of the sources that turn an ATen graph into a compiled one: the lowering, the
    symbolic printers it uses, the runtime, and the settings."""
    return source_digest("lower", "symbolic", "runtime", "config.py")


def cache_key(source: str, flags: Sequence[str], compiler: str) -> str:
    h = hashlib.sha256()
    for part in (source, " ".join(flags), compiler_version(compiler), torch.__version__, cpu_features()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def artifact_path(key: str, suffix: str) -> str | None:
    """Where the artifact of `key` lives (its folder created), or None when the cache is off."""
    folder = store.folder("cpp", key[:2])
    return os.path.join(folder, key + suffix) if folder is not None else None


# ---------------------------------------------------------------------------------------------------
# Compiled-graph records


def load_graph(key: str, packages: Sequence[str] = (), check: Callable[[Any], Any] | None = None) -> Any | None:
    """A value stored by `store_graph` under `key`, or None (missing, damaged: deleted, or holding
    something not admitted as a record of `packages`, or that `check` refuses by raising
    RecordError, ValueError or TypeError). `check(value)` returns what the caller uses."""
    path = artifact_path(key, ".graph")
    body = store.read_sealed(path) if path is not None else None
    if body is None:
        return None
    try:
        value = records.loads(body, packages=packages)
        if check is not None:
            value = check(value)
    except (records.RecordError, ValueError, TypeError) as exc:
        store.discard(path, f"not a graph record: {exc}")  # type: ignore[arg-type]
        return None
    log.artifact("cache", f"graph cache hit {path}")
    return value


def store_graph(key: str, value: Any, packages: Sequence[str] = ()) -> bool:
    """Store `value` (records and plain data, and record types of `packages`, as `load_graph`
    will admit them) under `key`; False when it is not storable."""
    path = artifact_path(key, ".graph")
    if path is None:
        return False
    try:
        body = records.dumps(value)
        records.loads(body, packages=packages)  # what could not be read back is not stored
    except Exception as exc:  # an object no record or reference admits: the graph is simply not cached
        log.debug("runtime", f"graph not cached: {type(exc).__name__}: {exc}")
        return False
    if store.write_sealed(path, body):
        log.artifact("cache", f"cache miss, stored {path}")
        return True
    return False
