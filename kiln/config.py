"""Kiln's user-facing settings, mirroring torch._dynamo.config's names where they overlap.

Every stage reads these through `kiln.config` at the moment it needs them; nothing caches a value,
so a test can flip a setting with `kiln.config.patch(...)` and see its effect on the next compile.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

# capture
cache_size_limit: int = 8  # compiled entries per code object before the frame runs eagerly
suppress_errors: bool = True  # an internal error falls back to eager with one warning

# dynamic shapes
automatic_dynamic_shapes: bool = True  # a size that changed is captured as a symbol next time
assume_static_by_default: bool = True  # first capture is static unless dynamic=True / mark_dynamic
specialize_int: bool = False  # python int arguments are burnt in as constants forever if True
specialize_float: bool = False  # python float arguments likewise (torch.compile 2.13's default is False too)
capture_scalar_outputs: bool = False  # .item() becomes an unbacked symbol instead of a break

# distributed: split graphs compiled inside DistributedDataParallel at its gradient-bucket boundaries
# (kiln.capture.distributed), so each bucket's all-reduce overlaps the backward of the next piece
optimize_ddp: bool = os.environ.get("KILN_OPTIMIZE_DDP", "1") not in ("", "0")

# runtime


def _default_cache_dir() -> str:
    """KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln for a real home directory.
    An empty or relative HOME (`HOME=""` makes expanduser give "/") falls back to the password
    database's home, and without one to a per-user folder in the temporary directory."""
    if os.environ.get("KILN_CACHE_DIR"):
        return os.environ["KILN_CACHE_DIR"]
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "kiln")
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home) or home == os.sep:
        try:
            import pwd  # POSIX only

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError, AttributeError):
            home = ""
    if os.path.isabs(home) and home != os.sep:
        return os.path.join(home, ".cache", "kiln")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"kiln-cache-{getattr(os, 'getuid', lambda: 'user')()}")


cache_dir: str = _default_cache_dir()
# frames captured before are loaded from cache_dir/frames by later processes (kiln.capture.persist)
persistent_cache: bool = os.environ.get("KILN_PERSISTENT_CACHE", "1") not in ("", "0")
debug_dir: str = os.environ.get("KILN_DEBUG_DIR", os.path.join(os.getcwd(), "kiln_debug"))
debug: bool = os.environ.get("KILN_DEBUG", "0") not in ("", "0")
# diagnostics (kiln.debug.repro): "capture", "aot" or "lower" writes a repro.py when that stage's
# output fails (see README's debugging workflow); off by default
repro_after: str | None = os.environ.get("KILN_REPRO_AFTER") or None
repro_dir: str = os.environ.get("KILN_REPRO_DIR", os.path.join(os.getcwd(), "kiln_repro"))
# KILN_REPORT=dir: write one HTML page of the run there at exit (kiln.debug.report); None: off
report_dir: str | None = os.environ.get("KILN_REPORT") or None
# C++ kernels run on torch.get_num_threads() threads (torch.set_num_threads / OMP_NUM_THREADS). With
# adaptive_threads on (opt-in, like OpenMP's OMP_DYNAMIC), loops under 4M elements drop to one thread
# while other processes keep every CPU busy. Read when a graph is compiled or loaded and whenever
# torch's thread count changes.
adaptive_threads: bool = os.environ.get("KILN_ADAPTIVE_THREADS", "0") not in ("", "0")
# code generator for graphs on CPU tensors: "cpp" (C++ with OpenMP) or "triton" (Triton kernels run by
# Triton's interpreter: slow, for testing the GPU path; the process then runs with TRITON_INTERPRET=1)
cpu_backend: str = os.environ.get("KILN_CPU_BACKEND", "cpp")
# the wrapper of C++ graphs: "python" (generated Python, one ctypes call per kernel), "native" (one
# generated C++ function per graph, kiln.runtime.native) or "auto": native from the start under
# mode="reduce-overhead"; otherwise Python first, and a graph called native_wrapper_after times
# (0: never) gets its native wrapper built on a background thread and runs it once it is ready
cpu_wrapper: str = os.environ.get("KILN_CPU_WRAPPER", "auto")
native_wrapper_after: int = int(os.environ.get("KILN_NATIVE_WRAPPER_AFTER", "100"))
# guards check a tensor's metadata and a dict's keys with one call into the native wrapper's extension
# once it is built (kiln.capture.guards); KILN_NATIVE_GUARDS=0: the generated Python checks only
native_guards: bool = os.environ.get("KILN_NATIVE_GUARDS", "1") not in ("", "0")
if cpu_backend == "triton":  # Triton reads it when first imported, which may happen before Kiln compiles
    os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Temporarily change settings: `with kiln.config.patch(cache_size_limit=2): ...`."""
    module = globals()
    for name in changes:
        if name not in module or name.startswith("_"):
            raise AttributeError(f"kiln.config has no setting {name!r}")
    saved = {name: module[name] for name in changes}
    module.update(changes)
    try:
        yield
    finally:
        module.update(saved)
