"""Shared by the cache reliability tests: a frozen copy of Kiln, and scripts run in fresh processes.

Every persistent-cache key holds a digest of Kiln's sources, and other people edit them while the
tests run; the subprocesses therefore import a copy of kiln/ taken once per session (PYTHONPATH
puts it before the editable install), so that two runs of one test meet the same keys.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

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
    """A copy of kiln/ under `folder` (made once), to put first on PYTHONPATH."""
    target = folder / "kiln_snapshot"
    if not (target / "kiln").exists():
        shutil.copytree(REPO / "kiln", target / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
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
