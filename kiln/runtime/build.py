"""Build C++ source with the system compiler into a shared object and load it, verified, with ctypes.

Flags: -O3 -march=native -fopenmp for parallel vectorized loops (512 bits wide where x86 has
AVX-512: WIDE_VECTORS),
-fno-math-errno so math calls can vectorize (through glibc's libmvec, -lmvec) without -ffast-math's
changes to NaN and infinity, and -fwrapv so integer overflow wraps as ATen's does; sin/cos builtins
are off so g++ cannot merge them into a scalar sincos call (see codegen/cpp.py).

A library lives in the cache (kiln.runtime.store) as `cpp/<k>/<key>.so` beside a sealed
`<key>.so.sum` holding its size and SHA-256. Nothing is handed to the dynamic loader before its
bytes match that record (read from the open file, which kiln.runtime.store judges: no link, owned by
this user, writable by no one else, in folders as trusted): a torn .so would kill the process with
SIGBUS, a garbage one would fail forever, a swapped one would run someone's code; any mismatch
deletes both files and builds again. A library that matches its record but lacks a symbol its caller
needs (a stale or forged pair) is deleted and built again too, and this process loads the new build
from a private copy, since the dynamic loader keeps handing back the library it already opened
under that path.
The compiler runs in a private folder with fixed file names, so one source gives the same bytes in
any process. With the cache off, libraries go to a folder private to this process.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from kiln import log
from kiln.runtime import cache, store

COMPILER = os.environ.get("CXX", "g++")
# GCC vectorizes loops 256 bits wide on x86 even where -march=native has AVX-512, while the kernels'
# math functions run libmvec's widest variant everywhere (one rounding per function, codegen/cpp.py):
# a 256-bit loop pays for 16 lanes to use 8 (pointwise_chain 2.2x -> 3.8x eager, softmax 0.64x ->
# 0.88x at 1 thread). On a machine without AVX-512 the flag changes nothing; other targets lack it.
WIDE_VECTORS: tuple[str, ...] = ("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ()


def _no_native_half() -> tuple[str, ...]:
    """`-mno-avx512fp16` where -march=native would turn AVX512-FP16 on: GCC 12 vectorizing 512 bits
    wide under `omp simd` then drops a kernel's float -> _Float16 -> float rounding of its half
    intermediates (`y * y.sum(0)` in float16 differed from eager in 67 of 272 elements, the sum
    not rounded to half where eager stores it). Without it the conversions go through F16C and
    round; the kernels compute in float, nothing else used the extension. The compiler is asked
    once whether it knows the flag (only on such a CPU)."""
    if platform.machine() not in ("x86_64", "AMD64") or "avx512_fp16" not in cache.cpu_features().split("|")[-1].split():
        return ()
    try:
        probe = subprocess.run([COMPILER, "-mno-avx512fp16", "-x", "c++", "-fsyntax-only", "-"], input="",
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ()
    return ("-mno-avx512fp16",) if probe.returncode == 0 else ()


DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", *WIDE_VECTORS, *_no_native_half(), "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
                                  "-fwrapv", "-fno-builtin-sinf", "-fno-builtin-cosf", "-fno-builtin-sin",
                                  "-fno-builtin-cos", "-shared", "-fPIC", "-std=c++17")
LIBS: tuple[str, ...] = ("-lmvec", "-lm")


class BuildError(RuntimeError):
    """The compiler rejected generated source; the message holds its diagnostics."""


class LibraryError(OSError):
    """A stored library is missing, does not match its recorded size and hash, or lacks a symbol."""


@dataclass(frozen=True)
class LibraryIdentity:
    """Where a loaded library lives (relative to the cache root; None outside the cache) and what
    its bytes are: what a recipe stores to load the same library in another process."""

    path: str
    relative: str | None
    size: int
    sha256: str


_loaded: dict[str, ctypes.CDLL] = {}
_identities: dict[int, LibraryIdentity] = {}  # id(CDLL) -> identity
_private: list[str] = []


_running: set[subprocess.Popen] = set()  # compilers started by any thread, not finished yet
_running_lock = threading.Lock()
_exiting: list[bool] = []  # set once the interpreter's exit stopped the compilers: no new one starts


def run_compiler(cmd: Sequence[str], cwd: str) -> subprocess.CompletedProcess:
    """Run the compiler as subprocess.run would, except that one still running when the interpreter
    exits (a tier-up build on a daemon thread) is stopped: its result could not be published any
    more, and it would take the CPU from whatever the machine runs next."""
    with _running_lock:
        if _exiting:
            # a daemon thread still building after the exit stopped the others: a compiler started
            # now would outlive the process and write into the cache's temporary folder for nobody
            raise BuildError("not started: the interpreter is exiting")
        # a group of its own: stopping it stops the compiler driver's cc1plus/as/ld too
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                start_new_session=True)
        _running.add(proc)
    try:
        out, err = proc.communicate()
    except BaseException:  # Ctrl-C while waiting: the compiler's own group did not receive it
        _stop(proc)
        raise
    finally:
        with _running_lock:
            _running.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


@atexit.register
def _stop_compilers() -> None:
    with _running_lock:
        _exiting.append(True)
        for proc in list(_running):
            _stop(proc)


def compile_shared(source: str, out_path: str, flags: Sequence[str] = DEFAULT_FLAGS) -> None:
    """Compile `source` into the shared object `out_path` (its folder must be private)."""
    folder = os.path.dirname(out_path)
    store.write_private(os.path.join(folder, "kernel.cpp"), source)
    # relative names from inside the folder: the object records the source's name, not the folder
    cmd = [COMPILER, *flags, "kernel.cpp", "-o", os.path.basename(out_path), *LIBS]
    start = time.perf_counter()
    proc = run_compiler(cmd, folder)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    log.debug("runtime", f"built {out_path} in {time.perf_counter() - start:.2f}s")


def _private_folder() -> str:
    if not _private:
        _private.append(tempfile.mkdtemp(prefix="kiln-libs-"))
        atexit.register(shutil.rmtree, _private[0], True)
    return _private[0]


def library_path(source: str, flags: Sequence[str] = DEFAULT_FLAGS) -> str:
    key = cache.cache_key(source, flags, COMPILER)
    path = cache.artifact_path(key, ".so")
    return path if path is not None else os.path.join(_private_folder(), key + ".so")


def _recorded(path: str) -> tuple[int, str] | None:
    body = store.read_sealed(path + ".sum")
    if body is None:
        return None
    try:
        record = json.loads(body)
        return int(record["size"]), str(record["sha256"])
    except (ValueError, KeyError, TypeError):
        return None


def _verified(path: str, expected: tuple[int, str] | None) -> bool:
    """Whether the file at `path` has exactly the expected size and hash."""
    return expected is not None and store.file_digest(path, expected[0]) == expected


def _open(path: str, digest: tuple[int, str], symbols: Sequence[str] = (), at: str | None = None) -> ctypes.CDLL:
    """The library at `path` (loaded from `at`, a verified copy, when given), LibraryError when it
    lacks one of `symbols`."""
    lib = _loaded.get(path)
    if lib is None:
        lib = ctypes.CDLL(at or path)
        # a copy stands for the cache's file only while that file holds the same bytes
        rel = store.relative(path) if at is None or _verified(path, digest) else None
        _identities[id(lib)] = LibraryIdentity(path, rel, digest[0], digest[1])
        _loaded[path] = lib
    missing = [name for name in symbols if not hasattr(lib, name)]
    if missing:
        raise LibraryError(f"{path} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return lib


def load(source: str, flags: Sequence[str] = DEFAULT_FLAGS, symbols: Sequence[str] = ()) -> ctypes.CDLL:
    """The shared object built from `source` (from the disk cache when it was built before), with
    each of `symbols` in it."""
    path = library_path(source, flags)
    try:
        return _load(source, flags, symbols, path)
    except LibraryError as exc:
        if path not in _loaded:
            raise
        # The library under `path` verified but lacks a symbol: deleted and built again, for later
        # processes, and this one opens the new build through a copy of its own.
        del _loaded[path]
        store.discard(path, str(exc), path + ".sum")
        copy = os.path.join(_private_folder(), f"rebuilt-{len(_identities)}-{os.path.basename(path)}")
        try:
            built = _build(source, flags, path)
            shutil.copyfile(path, copy)
        except OSError:  # a read-only cache: this process builds its own
            built = _build(source, flags, copy)
        if store.file_digest(copy, built[0]) != built:
            raise LibraryError(f"{path} changed while it was being loaded") from exc
        return _open(path, built, symbols, at=copy)


def load_soon(source: str, flags: Sequence[str] = DEFAULT_FLAGS, symbols: Sequence[str] = ()) -> concurrent.futures.Future:
    """`load` started now and finished on a thread of its own: a future of the library. A library
    already loaded or verified in the cache is loaded at once; one to build is compiled while the
    caller goes on (the thread waits for the compiler with the GIL released), so that the kernels of
    a forward graph compile while its backward is lowered, and both compile side by side. The same
    checks as `load`; its exceptions come out of the future's result()."""
    done: concurrent.futures.Future = concurrent.futures.Future()
    if library_path(source, flags) in _loaded or is_cached(source, flags):
        try:
            done.set_result(load(source, flags, symbols))
        except Exception as exc:
            done.set_exception(exc)
        return done

    def run() -> None:
        try:
            done.set_result(load(source, flags, symbols))
        except BaseException as exc:  # handed to whoever waits for the library
            done.set_exception(exc)

    threading.Thread(target=run, name="kiln-kernel-build", daemon=True).start()
    return done


def _load(source: str, flags: Sequence[str], symbols: Sequence[str], path: str) -> ctypes.CDLL:
    if path in _loaded:
        return _open(path, (0, ""), symbols)
    for attempt in range(3):  # more than one build only when another process replaced the file meanwhile
        recorded = _recorded(path)
        if _verified(path, recorded):
            if attempt == 0:
                log.artifact("cache", f"cache hit {path}")
            return _open(path, recorded, symbols)  # type: ignore[arg-type]
        if attempt == 2:
            break
        if recorded is not None or os.path.lexists(path):
            store.discard(path, "the library does not match its recorded size and hash", path + ".sum")
        try:
            built = _build(source, flags, path)
        except OSError as exc:  # the cache's disk is full or read-only: build where this process can
            log.artifact("cache", f"cannot build into the cache ({exc}); building privately")
            path = os.path.join(_private_folder(), os.path.basename(path))
            built = _build(source, flags, path)
        if _verified(path, built):  # usable now even when its record could not be written
            return _open(path, built, symbols)
    raise LibraryError(f"{path} changed while it was being loaded")


def load_if_built(source: str, flags: Sequence[str] = DEFAULT_FLAGS, symbols: Sequence[str] = ()) -> ctypes.CDLL | None:
    """The shared object built from `source` when it is loaded or in the cache (verified, with each
    of `symbols`); None otherwise, and nothing is compiled."""
    path = library_path(source, flags)
    if path in _loaded:
        return _usable(path, (0, ""), symbols)
    recorded = _recorded(path)
    return _usable(path, recorded, symbols) if recorded is not None and _verified(path, recorded) else None


def _usable(path: str, digest: tuple[int, str], symbols: Sequence[str]) -> ctypes.CDLL | None:
    try:
        return _open(path, digest, symbols)
    except LibraryError as exc:
        log.artifact("cache", f"not used: {exc}")
        return None


def _build(source: str, flags: Sequence[str], path: str) -> tuple[int, str]:
    """Compile `source` to `path` and record its size and hash beside it; returns them."""
    with store.staging(path) as folder:
        made = os.path.join(folder, os.path.basename(path))
        compile_shared(source, made, flags)
        digest = store.file_digest(made)
        if digest is None:
            raise BuildError(f"the compiler wrote no readable {made}")
        store.publish(made, path)
    record = json.dumps({"size": digest[0], "sha256": digest[1]}).encode()
    if store.write_sealed(path + ".sum", record):
        log.artifact("cache", f"cache miss, built {path}")
    return digest


def is_cached(source: str, flags: Sequence[str] = DEFAULT_FLAGS) -> bool:
    path = library_path(source, flags)
    return _verified(path, _recorded(path))


def identity(lib: ctypes.CDLL | None) -> LibraryIdentity | None:
    """The identity of a library this module loaded (None for anything else)."""
    return _identities.get(id(lib)) if lib is not None else None


def stored_identity(lib: ctypes.CDLL | None) -> tuple[str, int, str] | None:
    """(path relative to the cache root, size, SHA-256) of a library this module loaded from the
    cache, what a recipe records to load it again with `load_stored`; None for any other."""
    found = identity(lib)
    if found is None or found.relative is None:
        return None
    return found.relative, found.size, found.sha256


def load_stored(relative: str, size: int, sha256: str, symbols: Sequence[str] = ()) -> ctypes.CDLL:
    """A library named by a recipe (path relative to the cache root), loaded only when its bytes
    are the recorded ones and it has each of `symbols`; LibraryError otherwise (the caller compiles
    again)."""
    path = store.absolute(relative)
    if path is None:
        raise LibraryError(f"{relative}: the cache is off or the path leaves it")
    lib = _loaded.get(path)
    known = _identities.get(id(lib)) if lib is not None else None
    if known is not None and (known.size, known.sha256) == (size, sha256):
        return _open(path, (size, sha256), symbols)
    if lib is not None or not _verified(path, (size, sha256)):
        raise LibraryError(f"{path} is missing or is not the library the entry was stored with")
    return _open(path, (size, sha256), symbols)


def load_cached(relative: str, symbols: Sequence[str] = ()) -> ctypes.CDLL | None:
    """The library at `relative` (under the cache root) when an earlier build left it there with a
    sealed record of its size and hash that its bytes match, and it has each of `symbols`; None
    otherwise (nothing is built)."""
    path = store.absolute(relative)
    if path is None:
        return None
    if path in _loaded:
        return _usable(path, (0, ""), symbols)
    recorded = _recorded(path)
    if not _verified(path, recorded):
        return None
    return _usable(path, recorded, symbols)  # type: ignore[arg-type]
