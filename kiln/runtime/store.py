"""The cache directory: where Kiln keeps compiled artifacts, what it trusts there, how it writes.

Every file under kiln.config.cache_dir goes through this module. `root()` is the directory, or
None when the cache is off: it is created 0700, and one that another user owns or that group or
others may write is refused with one warning (as pip and ccache treat their caches), because a
cache that someone else can write is a way to run code in this process: generated Python and
kernel libraries are loaded from it. Writes are atomic (a temporary file in the same folder, then
os.replace; a failed write, ENOSPC say, removes its temporary). Files are *sealed*: a header holds
the SHA-256 of the body, checked on every read; a torn, truncated or bit-flipped file is deleted
and reported as missing, so its owner rebuilds it. Paths handed out for storage are relative to
the root, so a moved cache keeps working. Corresponds to torch/_inductor/codecache.py (cache_dir,
write_atomic).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import time
from typing import Callable, Iterator

from kiln import config, log

_SEAL = b"KILN-SEALED-1 "  # + 64 hex digits of the body's SHA-256 + "\n"
_HEADER_LEN = len(_SEAL) + 64 + 1
_TEMP_PREFIX = ".tmp-"
_verdicts: dict[str, str | None] = {}  # absolute cache dir -> None (usable) or why it is refused
_warned_damage = False


# ---------------------------------------------------------------------------------------------------
# The root and whether to trust it


def root() -> str | None:
    """The cache directory if it may be used (created 0700 when missing), else None (cache off)."""
    path = os.path.abspath(config.cache_dir)
    if path not in _verdicts:
        _verdicts[path] = _judge(path)
        if _verdicts[path] is not None:
            log.warn(f"kiln: the cache directory {path} is not used ({_verdicts[path]}); compiled "
                     f"artifacts are kept for this process only")
    return path if _verdicts[path] is None else None


def _judge(path: str) -> str | None:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not by this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"writable by {'group' if info.st_mode & stat.S_IWGRP else 'others'} "
                f"(mode {stat.S_IMODE(info.st_mode):o}); `chmod go-w {path}` after checking its content")
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


def forget_verdicts() -> None:
    """Judge each cache directory again (kiln.reset, and tests that change permissions)."""
    _verdicts.clear()


def absolute(relative: str) -> str | None:
    """A path stored relative to the root, made absolute (None when the cache is off or the
    path would leave the root)."""
    base = root()
    if base is None or os.path.isabs(relative) or ".." in relative.split("/"):
        return None
    return os.path.join(base, *relative.split("/"))


def relative(path: str) -> str | None:
    """`path` relative to the root, with '/' separators (None when it is not inside it)."""
    base = root()
    if base is None:
        return None
    rel = os.path.relpath(os.path.abspath(path), base)
    if rel.startswith(".."):
        return None
    return rel.replace(os.sep, "/")


def folder(*parts: str) -> str | None:
    """A folder under the root, created 0700 (None when the cache is off or it cannot be made)."""
    base = root()
    if base is None:
        return None
    path = os.path.join(base, *parts)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        log.artifact("cache", f"cannot create {path}: {exc}")
        return None
    return path


# ---------------------------------------------------------------------------------------------------
# Writing


# A temporary older than this is left over from a process that died while writing (a native wrapper
# built on a daemon thread is cut off when the interpreter exits): no build or write takes so long.
STALE_TEMP_SECONDS = 3600.0


def sweep_stale(folder: str, now: float | None = None) -> int:
    """Remove this cache's temporaries in `folder` older than STALE_TEMP_SECONDS; returns how many."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(_TEMP_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if now - st.st_mtime < STALE_TEMP_SECONDS or st.st_uid != os.getuid():
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:
            continue  # another process swept it first, or it is not ours to remove
    return removed


@contextlib.contextmanager
def staging(path: str) -> Iterator[str]:
    """A private temporary folder beside `path` for making it; removed on exit, whatever happens
    (and temporaries that dead processes left beside it are swept first)."""
    sweep_stale(os.path.dirname(path))
    tmp = tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=os.path.dirname(path))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(made: str, path: str) -> None:
    """Move a finished file into place in one step: readers see the old file or the whole new one."""
    os.chmod(made, 0o600 if not made.endswith(".so") else 0o700)
    os.replace(made, path)


def write_atomic(path: str, data: bytes) -> bool:
    """Write `data` to `path` atomically; False (logged, no temporary left) when the disk refuses."""
    fd, tmp = -1, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as exc:
        log.artifact("cache", f"not written: {path}: {exc}")
        return False
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def seal(body: bytes) -> bytes:
    """`body` with a header holding its hash, as `read_sealed` expects."""
    return _SEAL + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def write_sealed(path: str, body: bytes) -> bool:
    return write_atomic(path, seal(body))


# ---------------------------------------------------------------------------------------------------
# Reading


def read_sealed(path: str) -> bytes | None:
    """The body of a sealed file; None when it is missing, or damaged (then it is deleted)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.artifact("cache", f"unreadable: {path}: {exc}")
        return None
    header, body = data[:_HEADER_LEN], data[_HEADER_LEN:]
    if (len(header) == _HEADER_LEN and header.startswith(_SEAL) and header.endswith(b"\n")
            and hashlib.sha256(body).hexdigest().encode() == header[len(_SEAL):-1]):
        return body
    discard(path, "its content does not match its checksum (torn or corrupted)")
    return None


def file_digest(path: str) -> tuple[int, str] | None:
    """(size, SHA-256) of a file, None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            size = f.tell()
    except OSError:
        return None
    return size, h.hexdigest()


def discard(path: str, why: str, *also: str) -> None:
    """Delete a file that failed verification (and files that belong with it); the first time in
    a process, one warning (each time, a KILN_LOGS=cache line)."""
    global _warned_damage
    for p in (path, *also):
        with contextlib.suppress(OSError):
            os.unlink(p)
    log.artifact("cache", f"removed {path}: {why}")
    if not _warned_damage:
        _warned_damage = True
        log.warn(f"kiln: removed a cache file that failed verification ({why}): {path}; what it held "
                 f"is compiled again")


def make_file(path: str, make: Callable[[str], None]) -> None:
    """Run `make(tmp_path)` in a private folder beside `path` and publish the result at `path`."""
    with staging(path) as tmp:
        made = os.path.join(tmp, os.path.basename(path))
        make(made)
        publish(made, path)
