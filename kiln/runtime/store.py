"""The cache directory: where Kiln keeps compiled artifacts, what it trusts there, how it writes.

Every file under kiln.config.cache_dir goes through this module, because a cache that someone else
can write is a way to run code in this process (generated Python and kernel libraries are loaded
from it, stored records are compiled). Trust is checked at every step of every path, not only at the
root: each folder from `/` down to the root must be one that no other user can replace (owned by this
user or root, and not group/world-writable unless sticky, as /tmp is); the root and each folder and
file inside it must be owned by this user (or root: a system-wide cache) and writable by no one
else, and no symbolic link is followed inside the cache. A root that fails is refused with one
warning (the cache is off for the process); a folder inside that fails is not used, with one warning
(what it would hold is compiled into a folder private to the process); a file that fails is deleted
and rebuilt, like a damaged one. Files are opened without following links and judged by fstat of the
open file, so a file swapped between the check and the read is never read. A cache that this
process cannot write but no one else can either (a populated cache made read-only, or one of root's)
is read. Folders are created 0700 and files 0600 (libraries 0700) whatever the umask. Writes are
atomic (a temporary file in the same folder, then os.replace; a failed write, ENOSPC say, removes its
temporary). Files are *sealed*: a header holds the SHA-256 of the body, checked on every read; a
torn, truncated or bit-flipped file is deleted and reported as missing, so its owner rebuilds it.
Paths handed out for storage are relative to the root, so a moved cache keeps working. Corresponds
to torch/_inductor/codecache.py (cache_dir, write_atomic).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

from kiln import config, log

_SEAL = b"KILN-SEALED-1 "  # + 64 hex digits of the body's SHA-256 + "\n"
_HEADER_LEN = len(_SEAL) + 64 + 1
_TEMP_PREFIX = ".tmp-"
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_MAX_LINKS = 40  # symbolic links followed on the way to the root, as the kernel's own limit
_warned_damage = False


@dataclass(frozen=True)
class _Verdict:
    """What the judge found for one configured cache path: the real root (no links left in it) when
    it may be used, why not otherwise, and whether this process may write there."""

    root: str | None
    refused: str | None
    writable: bool


_verdicts: dict[str, _Verdict] = {}  # absolute configured cache dir -> its verdict
_warned_folders: set[str] = set()  # folders inside a root found untrusted (warned once each)


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _trusted_owner(uid: int) -> bool:
    """This user, or root (who can already do anything this user can, so trusting root adds no one)."""
    return uid == _uid() or uid == 0


def untrusted(info: os.stat_result, inside: bool = True) -> str | None:
    """Why a folder or file with this (l)stat could be changed by another user, or None. `inside`:
    part of the cache (no link, no sticky exemption); else an ancestor of the root."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if not _trusted_owner(info.st_uid):
        return f"owned by uid {info.st_uid}, not by this user"
    if mode & _OTHERS_WRITE and (inside or not mode & stat.S_ISVTX):
        who = "others" if mode & stat.S_IWOTH else "group"
        return f"writable by {who} (mode {stat.S_IMODE(mode):o})"
    return None


# ---------------------------------------------------------------------------------------------------
# The root and whether to trust it


def root() -> str | None:
    """The cache directory if it may be used (created 0700 when missing), else None (cache off)."""
    return _verdict().root


def writable() -> bool:
    """Whether this process may add to the cache (a read-only one is read, and nothing is stored)."""
    return _verdict().writable


def _verdict() -> _Verdict:
    path = os.path.abspath(config.cache_dir)
    found = _verdicts.get(path)
    if found is None:
        found = _verdicts[path] = _judge(path)
        if found.refused is not None:
            log.warn(f"kiln: the cache directory {path} is not used ({found.refused}); compiled artifacts are "
                     f"kept for this process only")
        elif not found.writable:
            log.artifact("cache", f"the cache directory {path} is read-only here: it is read, nothing is added")
    return found


def _judge(path: str) -> _Verdict:
    """Walk `path` from `/`, each folder on the way one that no other user can replace (links resolved
    only when this user or root owns them), creating what is missing 0700; then judge the root."""
    current, pending, links = os.sep, [p for p in reversed(path.split(os.sep)) if p], 0
    try:
        info = os.lstat(current)
        while True:
            why = untrusted(info, inside=not pending)
            if why is not None:
                return _Verdict(None, f"{current} is {why}", False)
            if not pending:
                break
            name = pending.pop()
            if name in (".", ".."):
                current = os.path.dirname(current) if name == ".." else current
                info = os.lstat(current)
                continue
            step = os.path.join(current, name)
            try:
                info = os.lstat(step)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                    os.mkdir(step, 0o700)
                info = os.lstat(step)
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if not _trusted_owner(info.st_uid):
                    return _Verdict(None, f"{step} is a symbolic link of uid {info.st_uid}", False)
                if links > _MAX_LINKS:
                    return _Verdict(None, "too many symbolic links", False)
                target = os.readlink(step)
                current = os.sep if os.path.isabs(target) else current
                pending.extend(p for p in reversed(target.split(os.sep)) if p)
                info = os.lstat(current)
                continue
            if not stat.S_ISDIR(info.st_mode):
                return _Verdict(None, f"{step} is not a directory", False)
            current = step
    except OSError as exc:
        return _Verdict(None, f"cannot create or read it: {exc.strerror or exc}", False)
    writable = info.st_uid == _uid() and os.access(current, os.W_OK | os.X_OK)
    return _Verdict(current, None, writable)


def forget_verdicts() -> None:
    """Judge each cache directory again (kiln.reset, and tests that change permissions)."""
    _verdicts.clear()
    _warned_folders.clear()


def folder(*parts: str, create: bool = True) -> str | None:
    """A folder under the root, each step checked (and created 0700 when missing, `create` and the
    cache writable); None when the cache is off, or it is missing or not trusted (warned once).
    Checked on every call, not remembered: an lstat per step costs microseconds, and a folder
    removed since is made again."""
    base = root()
    if base is None:
        return None
    path = base
    for part in parts:
        if not part or part in (".", "..") or os.sep in part:
            return None
        path = os.path.join(path, part)
        why = _check_folder(path, create and writable())
        if why == "missing":
            return None
        if why is not None:
            if path not in _warned_folders:
                _warned_folders.add(path)
                log.warn(f"kiln: the cache folder {path} is not used ({why}); what Kiln keeps there is compiled "
                         f"again in each process. Remove it (after checking its content) to let Kiln make it anew")
            return None
    return path


def _check_folder(path: str, create: bool) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return "missing"
        try:
            os.mkdir(path, 0o700)  # the umask can only narrow this mode
        except FileExistsError:
            pass  # another process made it meanwhile: judged below like any other
        except OSError as exc:
            log.artifact("cache", f"cannot create {path}: {exc}")
            return "missing"
        return _check_folder(path, False)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):
        return "not a directory"
    return untrusted(info)


def absolute(relative: str) -> str | None:
    """A path stored relative to the root, made absolute (None when the cache is off, the path would
    leave the root, or a folder on its way is missing or not trusted)."""
    parts = relative.split("/")
    if os.path.isabs(relative) or not all(parts):
        return None
    inside = folder(*parts[:-1], create=False)
    if inside is None or parts[-1] in (".", ".."):
        return None
    return os.path.join(inside, parts[-1])


def relative(path: str) -> str | None:
    """`path` relative to the root, with '/' separators (None when it is not inside it)."""
    base = root()
    if base is None:
        return None
    rel = os.path.relpath(os.path.abspath(path), base)
    if rel.startswith(".."):
        return None
    return rel.replace(os.sep, "/")


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
            if now - st.st_mtime < STALE_TEMP_SECONDS or st.st_uid != _uid():
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


def write_private(path: str, text: str) -> None:
    """Write `text` to a new file at `path` (in a private folder: staging, a process's own), 0600
    whatever the umask."""
    with open(path, "x", encoding="utf-8", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(text)


def seal(body: bytes) -> bytes:
    """`body` with a header holding its hash, as `read_sealed` expects."""
    return _SEAL + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def write_sealed(path: str, body: bytes) -> bool:
    return write_atomic(path, seal(body))


# ---------------------------------------------------------------------------------------------------
# Reading


class UntrustedFile(OSError):
    """A cache file that another user could have written, or that is not a plain file of its own."""


@contextlib.contextmanager
def open_trusted(path: str) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, fstat) of the regular file at `path`, opened without following a link and judged on the
    open file itself (so one swapped after the check is never read): owned by this user or root,
    writable by no one else, and with no second name (a hard link planted elsewhere). Raises
    FileNotFoundError when it is missing, UntrustedFile when it fails."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (the folders above were checked to hold none)
            raise UntrustedFile(f"{path} is a symbolic link") from exc
        raise
    try:
        info = os.fstat(fd)
        why = ("not a regular file" if not stat.S_ISREG(info.st_mode) else untrusted(info)
               or (f"{info.st_nlink} names (a hard link)" if info.st_nlink != 1 else None))
        if why is not None:
            raise UntrustedFile(f"{path} is {why}")
        yield fd, info
    finally:
        os.close(fd)


def read_file(path: str) -> bytes | None:
    """The bytes of a trusted cache file; None when it is missing or unreadable, and deleted (one
    warning) when it is not trusted."""
    try:
        with open_trusted(path) as (fd, info):
            chunks: list[bytes] = []
            while True:
                chunk = os.read(fd, max(info.st_size, 1 << 16))
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
    except FileNotFoundError:
        return None
    except UntrustedFile as exc:
        discard(path, str(exc))
        return None
    except OSError as exc:
        log.artifact("cache", f"unreadable: {path}: {exc}")
        return None


def read_sealed(path: str) -> bytes | None:
    """The body of a sealed file; None when it is missing, or damaged or not trusted (then it is
    deleted)."""
    data = read_file(path)
    if data is None:
        return None
    header, body = data[:_HEADER_LEN], data[_HEADER_LEN:]
    if (len(header) == _HEADER_LEN and header.startswith(_SEAL) and header.endswith(b"\n")
            and hashlib.sha256(body).hexdigest().encode() == header[len(_SEAL):-1]):
        return body
    discard(path, "its content does not match its checksum (torn or corrupted)")
    return None


def file_digest(path: str, size: int | None = None) -> tuple[int, str] | None:
    """(size, SHA-256) of a trusted file; None when it is missing, unreadable, not trusted, or not of
    `size` bytes when that is given (a torn file is short: nothing is hashed)."""
    h = hashlib.sha256()
    try:
        with open_trusted(path) as (fd, info):
            if size is not None and info.st_size != size:
                return None
            total = 0
            while True:
                block = os.read(fd, 1 << 20)
                if not block:
                    break
                total += len(block)
                h.update(block)
    except UntrustedFile as exc:
        log.artifact("cache", f"not used: {exc}")
        return None
    except OSError:
        return None
    return total, h.hexdigest()


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
