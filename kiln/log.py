"""KILN_LOGS: named artifacts and per-stage debug logs, parsed once from the environment.

`KILN_LOGS="graph_breaks,recompiles,guards,graph_code,aot_graphs,output_code,dynamic,perf_hints,bytecode"`
turns artifacts on (the names follow TORCH_LOGS); `+capture`, `+fake`, `+aot`, `+lower` turn on debug
level logging for a stage. Under KILN_DEBUG=1 it also holds the run folder every stage writes its dump
files into. It sits at the bottom of the package beside config and errors, so every stage can log
without importing kiln.debug (which reads every stage). Counterpart: torch._logging.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Callable

from kiln import config

ARTIFACTS = frozenset(
    {"graph_breaks", "recompiles", "guards", "graph_code", "aot_graphs", "output_code",
     "dynamic", "perf_hints", "bytecode", "graph_sizes", "cache", "compile_time", "cudagraphs", "autotune", "ddp"}
)
STAGES = frozenset({"capture", "fake", "symbolic", "aot", "lower", "runtime"})

_enabled_artifacts: set[str] = set()
_debug_stages: set[str] = set()
_handler: logging.Handler | None = None


def configure(spec: str | None = None) -> None:
    """Parse a KILN_LOGS value (the environment's when `spec` is None); unknown names are an error."""
    global _handler
    spec = config.knob("KILN_LOGS").from_env() if spec is None else spec
    _enabled_artifacts.clear()
    _debug_stages.clear()
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        if name.startswith("+") and name[1:] in STAGES:
            _debug_stages.add(name[1:])
        elif name in ARTIFACTS:
            _enabled_artifacts.add(name)
        elif name in STAGES:
            _debug_stages.add(name)
        else:
            known = ", ".join(sorted(ARTIFACTS | {"+" + s for s in STAGES}))
            raise ValueError(f"KILN_LOGS: unknown name {name!r}; known: {known}")
    root = logging.getLogger("kiln")
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[kiln:%(name)s] %(message)s"))
        root.addHandler(_handler)
        root.propagate = False
    root.setLevel(logging.DEBUG if (_enabled_artifacts or _debug_stages) else logging.WARNING)


def enabled(artifact: str) -> bool:
    """Whether KILN_LOGS asked for this artifact (use before building an expensive message)."""
    assert artifact in ARTIFACTS, artifact
    return artifact in _enabled_artifacts


def artifact(name: str, message: str | Callable[[], str]) -> None:
    """Print one artifact (a graph, the guards, a recompile reason) if KILN_LOGS asked for it."""
    if not enabled(name):
        return
    text = message() if callable(message) else message
    logging.getLogger(f"kiln.{name}").info(text)


def debug(stage: str, message: str | Callable[[], str]) -> None:
    """Debug-level log for a stage, on with KILN_LOGS=+stage."""
    if stage not in _debug_stages:
        return
    text = message() if callable(message) else message
    logging.getLogger(f"kiln.{stage}").debug(text)


class KilnWarning(UserWarning):
    """Category of Kiln's user-facing warnings, so tests and users can filter them."""


def warn(message: str) -> None:
    """A user-facing warning line (fallbacks, cache limit, backend substitutions). Always shown."""
    warnings.warn(message, KilnWarning, stacklevel=3)


# KILN_DEBUG=1: one run folder per process. Each stage adds a subfolder and a row for the index page;
# kiln.debug.dump (which writes the capture folders) registers the function that rewrites that page.
_run_dir: str | None = None
_dump_rows: list[tuple[str, str, str]] = []  # (folder, title, note)
_dump_index_writers: list[Callable[[], None]] = []


def dump_run_dir() -> str:
    """The folder of this process's debug dump under config.debug_dir (created on first use)."""
    global _run_dir
    if _run_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{os.getpid()}"
        _run_dir = os.path.join(config.debug_dir, f"run_{stamp}")
        os.makedirs(_run_dir, exist_ok=True)
    return _run_dir


def dump_rows() -> list[tuple[str, str, str]]:
    """The folders written so far in this run, in order: (folder, title, what happened)."""
    return list(_dump_rows)


def add_dump_row(folder: str, title: str, note: str) -> None:
    """List a folder of the run on the dump's index page (the page is rewritten at once)."""
    _dump_rows.append((folder, title, note))
    for write_index in _dump_index_writers:
        write_index()


def on_dump_row(write_index: Callable[[], None]) -> None:
    """Register the index-page writer (idempotent)."""
    if write_index not in _dump_index_writers:
        _dump_index_writers.append(write_index)


def reset_dump() -> None:
    """The next dump file starts a fresh run folder with an empty index."""
    global _run_dir
    _run_dir = None
    _dump_rows.clear()


configure()
