"""The on-disk cache of compiled artifacts, under kiln.config.cache_dir (KILN_CACHE_DIR).

An entry is keyed by a hash of the source, the compiler flags, the compiler's version, the torch
version and the CPU, so a second process with the same graph loads a built shared object in
milliseconds instead of compiling. Entries are written to a temporary name and renamed into place,
so concurrent processes never see half a file. Corresponds to torch/_inductor/codecache.py.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
import platform
import subprocess
import tempfile
from typing import Callable, Sequence

import torch

from kiln import config
from kiln import log


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@functools.lru_cache(maxsize=None)
def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("model name", "flags"))), platform.machine())
    except OSError:
        return platform.machine()


def cache_key(source: str, flags: Sequence[str], compiler: str) -> str:
    h = hashlib.sha256()
    for part in (source, " ".join(flags), compiler_version(compiler), torch.__version__, _cpu()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def artifact_path(key: str, suffix: str) -> str:
    return os.path.join(config.cache_dir, "cpp", key[:2], key + suffix)


def get_or_create(key: str, suffix: str, create: Callable[[str], None]) -> tuple[str, bool]:
    """The cached file for `key`, made by `create(tmp_path)` if missing; returns (path, was_cached)."""
    path = artifact_path(key, suffix)
    if os.path.exists(path):
        log.artifact("cache", f"cache hit {path}")
        return path, True
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=suffix, dir=os.path.dirname(path))
    os.close(fd)
    try:
        create(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.artifact("cache", f"cache miss, built {path}")
    return path, False


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """A hash of Kiln's lowering and runtime sources: a changed compiler must not reuse old graphs."""
    import kiln.lower
    h = hashlib.sha256()
    for pkg in (os.path.dirname(kiln.lower.__file__), os.path.dirname(__file__)):
        for root, _, files in sorted(os.walk(pkg)):
            for name in sorted(files):
                if name.endswith(".py"):
                    with open(os.path.join(root, name), "rb") as f:
                        h.update(f.read())
    return h.hexdigest()


class _Pickler(pickle.Pickler):
    """Pickles ATen overloads (extern calls) by name; they are pybind objects pickle cannot copy."""

    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj._schema.name, obj._overloadname)
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: object) -> object:
        _, name, overload = pid  # type: ignore[misc]
        namespace, op = name.split("::")
        return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


def load_graph(key: str) -> object | None:
    """A compiled graph stored by `store_graph` (its KernelProgram, source and signatures), if any."""
    path = artifact_path(key, ".graph")
    try:
        with open(path, "rb") as f:
            value = _Unpickler(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None
    log.artifact("cache", f"graph cache hit {path}")
    return value


def store_graph(key: str, value: object) -> None:
    buffer = io.BytesIO()
    try:
        _Pickler(buffer).dump(value)
        data = buffer.getvalue()
    except Exception as e:  # an unpicklable constant or op: this graph is simply not cached
        log.debug("runtime", f"graph not cached: {e}")
        return

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    get_or_create(key, ".graph", write)
