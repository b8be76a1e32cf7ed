"""Build C++ source with the system compiler into a shared object and load it with ctypes.

Flags follow notes/recipes.md section 6: -O3 -march=native -fopenmp for parallel vectorized loops,
-fno-math-errno so math calls can vectorize (through glibc's libmvec, -lmvec) without -ffast-math's
changes to NaN and infinity, and -fwrapv so integer overflow wraps as ATen's does; sin/cos builtins are off so g++ cannot merge them
into a scalar sincos call (see codegen/cpp.py). Built objects go
through kiln.runtime.cache, and a loaded library is kept per path for the life of the process.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import time
from typing import Sequence

from kiln import log
from kiln.runtime import cache

COMPILER = os.environ.get("CXX", "g++")
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
                                  "-fwrapv", "-fno-builtin-sinf", "-fno-builtin-cosf", "-fno-builtin-sin",
                                  "-fno-builtin-cos", "-shared", "-fPIC", "-std=c++17")
LIBS: tuple[str, ...] = ("-lmvec", "-lm")

_loaded: dict[str, ctypes.CDLL] = {}


class BuildError(RuntimeError):
    """The compiler rejected generated source; the message holds its diagnostics."""


def compile_shared(source: str, out_path: str, flags: Sequence[str] = DEFAULT_FLAGS) -> None:
    src_path = out_path + ".cpp"
    with open(src_path, "w") as f:
        f.write(source)
    cmd = [COMPILER, *flags, src_path, "-o", out_path, *LIBS]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(src_path)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    log.debug("runtime", f"built {out_path} in {time.perf_counter() - start:.2f}s")


def load(source: str, flags: Sequence[str] = DEFAULT_FLAGS) -> ctypes.CDLL:
    """The shared object built from `source` (from the disk cache when it was built before)."""
    key = cache.cache_key(source, flags, COMPILER)
    path, _ = cache.get_or_create(key, ".so", lambda tmp: compile_shared(source, tmp, flags))
    lib = _loaded.get(path)
    if lib is None:
        lib = _loaded[path] = ctypes.CDLL(path)
    return lib


def is_cached(source: str, flags: Sequence[str] = DEFAULT_FLAGS) -> bool:
    return os.path.exists(cache.artifact_path(cache.cache_key(source, flags, COMPILER), ".so"))
