"""What kiln.runtime.store trusts, step by step: every folder on the way to a file and the file itself.

In process and cheap: folders and files made foreign (another uid, group/world-writable, a symbolic
link, a second hard link), the modes Kiln creates under any umask, a root reached through links, and
a folder pre-created by someone else where Kiln's fallback cache would be. Ownership changes need
root (CI runs as root); the rest runs as any user. The attacks themselves, with a second real user
and fresh processes, are in tests/reliability/test_cache_multiuser.py.
"""
from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest

from kiln import config
from kiln.log import KilnWarning
from kiln.runtime import autotune, store

ROOT_ONLY = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
OTHER_UID = 4242 + (os.getuid() if hasattr(os, "getuid") else 0)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    store.forget_verdicts()
    monkeypatch.setattr(store, "_warned_damage", False)
    yield
    store.forget_verdicts()


def _kiln_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]


def _sealed(folder: Path, name: str, body: bytes = b"payload") -> Path:
    path = folder / name
    assert store.write_sealed(str(path), body)
    return path


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o077])
def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with config.patch(cache_dir=str(tmp_path / "made" / "cache")):
            folder = store.folder("frames", "ab", "abcdef")
            assert folder is not None
            path = _sealed(Path(folder), "x.entry")
            with store.staging(str(path)) as staged:
                store.write_private(os.path.join(staged, "kernel.cpp"), "int x;")
                made = os.path.join(staged, "k.so")
                store.write_private(made, "not really a library")
                store.publish(made, os.path.join(folder, "k.so"))
    finally:
        os.umask(old)
    for p in [tmp_path / "made", *(tmp_path / "made").rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        expected = 0o700 if p.is_dir() or p.suffix == ".so" else 0o600
        assert mode == expected, (p, oct(mode))


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_group_or_world_writable_folder_inside_the_cache_is_not_used(tmp_path: Path, mode: int) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        cpp = Path(store.folder("cpp"))
        inner = Path(store.folder("cpp", "ab"))
        planted = _sealed(inner, "k.so.sum")
        cpp.chmod(mode)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert store.folder("cpp", "ab") is None and store.absolute("cpp/ab/k.so.sum") is None
            assert store.folder("cpp", "cd") is None  # nothing is made under it either
            assert store.folder("frames") is not None  # the rest of the cache is used
        (message,) = _kiln_warnings(caught)
        assert "cpp is not used" in message and "writable by" in message
        assert planted.exists() and not (cpp / "cd").exists()


def test_a_symbolic_link_inside_the_cache_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "ab").mkdir(parents=True, mode=0o700)
    elsewhere.chmod(0o700)
    with config.patch(cache_dir=str(tmp_path / "cache")):
        root = Path(store.root())
        (root / "cpp").symlink_to(elsewhere)  # a link even to a private folder of ours: not followed
        with pytest.warns(KilnWarning, match="symbolic link"):
            assert store.folder("cpp", "ab") is None
        assert store.absolute("cpp/ab/k.so") is None
        frames = Path(store.folder("frames"))
        real = _sealed(tmp_path, "real.entry")
        (frames / "linked.entry").symlink_to(real)
        with pytest.warns(KilnWarning, match="symbolic link"):
            assert store.read_sealed(str(frames / "linked.entry")) is None
        assert real.exists() and not (frames / "linked.entry").exists()  # the link removed, not its target
        assert store.file_digest(str(real)) is not None


def test_a_file_with_a_second_name_is_not_read(tmp_path: Path) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        folder = Path(store.folder("frames"))
        path = _sealed(folder, "x.entry")
        assert store.read_sealed(str(path)) == b"payload"
        os.link(path, tmp_path / "second-name")
        with pytest.warns(KilnWarning, match="hard link"):
            assert store.read_sealed(str(path)) is None
        assert not path.exists()


def test_a_group_or_world_writable_file_is_not_read(tmp_path: Path) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        folder = Path(store.folder("cpp", "ab"))
        path = _sealed(folder, "k.so.sum")
        path.chmod(0o666)
        assert store.file_digest(str(path)) is None
        with pytest.warns(KilnWarning, match="writable by"):
            assert store.read_sealed(str(path)) is None
        assert not path.exists()


def test_a_fifo_does_not_block_a_read(tmp_path: Path) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        folder = Path(store.folder("frames"))
        os.mkfifo(folder / "x.entry", 0o600)
        with pytest.warns(KilnWarning, match="not a regular file"):
            assert store.read_sealed(str(folder / "x.entry")) is None


@ROOT_ONLY
def test_a_file_of_another_user_is_not_read(tmp_path: Path) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        folder = Path(store.folder("cpp", "ab"))
        path = _sealed(folder, "k.so.sum")
        os.chown(path, OTHER_UID, -1)
        assert store.file_digest(str(path)) is None
        with pytest.warns(KilnWarning, match=f"owned by uid {OTHER_UID}"):
            assert store.read_sealed(str(path)) is None
        assert not path.exists()


@ROOT_ONLY
@pytest.mark.parametrize("kind", ["triton", "autotune", "frames"])
def test_a_folder_of_another_user_inside_the_cache_is_not_used(tmp_path: Path, kind: str) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        inner = Path(store.folder(kind, "ab"))
        os.chown(inner, OTHER_UID, -1)
        if kind == "autotune":
            choice = autotune.LaunchConfig(4, None, 2, 1)
            key = "ab" + "0" * 30
            inner.chmod(0o777)  # as the other user would have it, to plant a choice
            _sealed(inner, f"{key}.json", b'{"choice": {"xblock": 4, "rblock": null, "warps": 2, "stages": 1}}')
            with pytest.warns(KilnWarning, match=f"owned by uid {OTHER_UID}"):
                assert autotune.stored_choice(key) is None
            autotune.store_choice(key, choice, {})  # not written there either
            assert autotune.stored_choice(key) is None
        else:
            with pytest.warns(KilnWarning, match=f"owned by uid {OTHER_UID}"):
                assert store.folder(kind, "ab") is None


@ROOT_ONLY
def test_an_ancestor_another_user_can_replace_refuses_the_cache(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, -1)  # they may rename our cache away and put their own in its place
    with config.patch(cache_dir=str(theirs / "ours")), pytest.warns(KilnWarning, match=f"owned by uid {OTHER_UID}"):
        assert store.root() is None
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others write there but cannot remove what is ours
    with config.patch(cache_dir=str(sticky / "ours")), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        assert store.root() == str(sticky / "ours")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # world-writable without the sticky bit: anyone may swap what is inside
    store.forget_verdicts()
    with config.patch(cache_dir=str(open_dir / "ours")), pytest.warns(KilnWarning, match="writable by others"):
        assert store.root() is None


@ROOT_ONLY
@pytest.mark.parametrize("planted", ["folder", "link"])
def test_a_fallback_cache_dir_made_by_another_user_is_refused(tmp_path: Path, planted: str) -> None:
    """`<tmp>/kiln-cache-<uid>` (no usable home) made first by someone else: as a folder of theirs,
    or as their link to a folder of ours, which would send our artifacts where they chose."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    path = sticky / f"kiln-cache-{os.getuid()}"
    if planted == "folder":
        path.mkdir(mode=0o777)
        os.chown(path, OTHER_UID, -1)
    else:
        path.symlink_to(ours)
        os.lchown(path, OTHER_UID, -1)
    with config.patch(cache_dir=str(path)), pytest.warns(KilnWarning, match=f"uid {OTHER_UID}"):
        assert store.root() is None and store.folder("cpp") is None
    assert list(ours.iterdir()) == []


def test_a_root_reached_through_our_own_link_is_used_as_its_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(real)
    with config.patch(cache_dir=str(tmp_path / "link" / "cache")):
        assert store.root() == str(real / "cache")
        assert stat.S_IMODE(real.stat().st_mode) == 0o700  # made by the walk, 0700 as any folder


def test_a_read_only_cache_is_read_and_nothing_is_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with config.patch(cache_dir=str(tmp_path / "cache")):
        path = _sealed(Path(store.folder("frames", "ab")), "x.entry")
    store.forget_verdicts()
    monkeypatch.setattr(store.os, "access", lambda p, mode: False)  # as this process finds a 0500 cache
    with config.patch(cache_dir=str(tmp_path / "cache")), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        assert store.root() is not None and not store.writable()
        assert store.read_sealed(str(path)) == b"payload"
        assert store.folder("frames", "ab") is not None
        assert store.folder("cpp") is None and not (tmp_path / "cache" / "cpp").exists()


@ROOT_ONLY
def test_a_cache_of_root_is_read_by_another_user_and_nothing_is_added() -> None:
    """The rule for read-only caches: one that no one but its owner can write, and whose owner is
    this user or root, is read. Here a system-wide cache of root's, read by `nobody` (this process
    with its effective uid switched for the checks, as a process of that user would run them)."""
    import pwd
    import shutil
    import tempfile

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("needs a `nobody` account")
    base = Path(tempfile.mkdtemp(prefix="kiln-system-cache-", dir="/tmp"))
    try:
        base.chmod(0o755)
        cache = base / "cache"
        with config.patch(cache_dir=str(cache)):
            frames = Path(store.folder("frames", "ab"))
            path = _sealed(frames, "x.entry")
        for p in [cache, *cache.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        store.forget_verdicts()
        os.seteuid(nobody.pw_uid)
        try:
            with config.patch(cache_dir=str(cache)), warnings.catch_warnings():
                warnings.simplefilter("error", KilnWarning)
                assert store.root() == str(cache) and not store.writable()
                assert store.read_sealed(str(path)) == b"payload"
                assert store.folder("cpp") is None and not store.write_sealed(str(frames / "y.entry"), b"x")
        finally:
            os.seteuid(0)
        assert sorted(p.name for p in cache.rglob("*")) == ["ab", "frames", "x.entry"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
