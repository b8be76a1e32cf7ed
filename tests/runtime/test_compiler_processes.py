"""Compiler subprocesses (kiln.runtime.build.run_compiler): one still running when the interpreter
exits, as a tier-up build on a daemon thread can be, is stopped with everything it started, instead
of computing for nobody and taking the CPU from what runs next."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

_CHILD = textwrap.dedent("""
    import sys, threading, time
    from kiln.runtime import build

    folder = sys.argv[1]
    # the "compiler" starts a grandchild, as g++ starts cc1plus, and waits for it
    cmd = ["sh", "-c", "sleep 60 & echo $! > grandchild; wait"]
    threading.Thread(target=build.run_compiler, args=(cmd, folder), daemon=True).start()
    while True:
        try:
            if open(folder + "/grandchild").read().strip():
                break
        except OSError:
            pass
        time.sleep(0.05)
    print("exiting")
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is gone already, waiting for its reaper
    except OSError:
        return False


def test_running_compiler_stopped_at_exit(tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-2000:]
    pid = int((tmp_path / "grandchild").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the compiler's child outlived the interpreter"


def test_run_compiler_reports_like_subprocess_run(tmp_path: Any) -> None:
    from kiln.runtime import build

    done = build.run_compiler(["sh", "-c", "echo out; echo err >&2; exit 3"], str(tmp_path))
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert not build._running


_LATE_CHILD = textwrap.dedent("""
    import atexit, sys

    folder = sys.argv[1]

    def build_during_exit():
        # a daemon thread's tier-up build reaching the compiler after the exit stopped the others
        # (atexit runs the handlers registered later first: this one after build's own)
        from kiln.runtime import build
        try:
            build.run_compiler(["sh", "-c", "echo started > started"], folder)
        except build.BuildError as exc:
            print("refused:", exc)

    atexit.register(build_during_exit)
    from kiln.runtime import build  # registers the handler that stops the compilers
    print("exiting")
""")


def test_no_compiler_starts_once_the_exit_stopped_them(tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.run([sys.executable, "-c", _LATE_CHILD, str(tmp_path)], capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert proc.returncode == 0 and "refused: not started" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert not (tmp_path / "started").exists()
