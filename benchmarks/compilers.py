"""The three ways a workload runs: eager, Kiln's default backend, and the real torch.compile.

Each `Compiler` knows how to wrap a function, how to forget everything it compiled (for a cold
start in the same process), which environment variable names its on-disk cache, and whether it is
available at all. Kiln is judged by its default backend ("inductor"): when Kiln's lowering has not
landed yet, `kiln_status()` says so and the runner reports eager against torch.compile only.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Compiler:
    name: str  # "eager", "kiln", "torch"
    cache_env: str | None  # the environment variable naming its on-disk cache

    def wrap(self, fn: Callable) -> Callable:
        if self.name == "eager":
            return fn
        if self.name == "kiln":
            import kiln

            return kiln.compile(fn)
        return torch.compile(fn)

    def reset(self) -> None:
        """Forget every compiled artifact held in memory (the disk cache is the caller's business)."""
        if self.name == "kiln":
            import kiln

            kiln.reset()
        elif self.name == "torch":
            torch._dynamo.reset()


EAGER = Compiler("eager", None)
KILN = Compiler("kiln", "KILN_CACHE_DIR")
TORCH = Compiler("torch", "TORCHINDUCTOR_CACHE_DIR")


def kiln_capture_status() -> str | None:
    """None when kiln.compile exists (capture with backend="eager" works); otherwise why not."""
    try:
        kiln = importlib.import_module("kiln")
    except Exception as exc:  # a half-written package must not stop the bench
        return f"import kiln failed: {type(exc).__name__}: {exc}"
    if not callable(getattr(kiln, "compile", None)):
        return "kiln.compile does not exist yet (capture)"
    try:
        capture = importlib.import_module("kiln.capture")
        capture_frame = getattr(capture, "capture_frame", None)  # kiln.capture's public surface
    except Exception as exc:
        return f"kiln.capture.capture_frame is not importable (capture): {type(exc).__name__}: {exc}"
    if not callable(capture_frame):
        return "kiln.capture.capture_frame does not exist (capture)"
    return None


def kiln_status() -> str | None:
    """None when Kiln's default (inductor) backend exists; otherwise why it is not available."""
    missing = kiln_capture_status()
    if missing is not None:
        return missing
    for module, attr, issue in (("kiln.autograd", "aot_autograd", "AOT autograd"),
                                ("kiln.lower", "compile_graph", "lowering")):
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except Exception as exc:
            return f"import {module} failed: {type(exc).__name__}: {exc}"
        if not callable(found):
            return f"{module}.{attr} does not exist yet ({issue})"
    return None


def kiln_counters() -> dict:
    """kiln.stats() when it exists (compiles, recompiles, fallbacks, ...), else {}."""
    try:
        import kiln

        return dict(kiln.stats())
    except Exception:
        return {}


def call_recording_warnings(call: Callable[[], object]) -> tuple[object, list[str]]:
    """Run `call()` and return its result with the text of every warning it raised, so a backend that
    quietly falls back to eager ("inductor not available, using eager") is reported, not timed as if
    it had compiled."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message).splitlines()[0] for w in caught]


def settle_kiln(step: Callable[[], object], timeout_s: float = 900.0) -> float:
    """Run a Kiln step until its hot graphs run their native wrappers (Kiln tiers a graph up after
    kiln.config.native_wrapper_after calls, building the native wrapper on a background thread), so
    that what is timed next is the steady state. Returns the background build seconds waited for,
    which the tables report beside the first-call seconds."""
    from kiln import config
    from kiln.runtime import native

    before = native.BACKGROUND.seconds
    for _ in range(max(config.native_wrapper_after, 0)):
        step()
    native.wait_for_tier_up(timeout_s)
    step()  # picks the finished builds up
    return native.BACKGROUND.seconds - before


def seed_boundary(cache_dir: str, shared_dir: str) -> None:
    """Give a fresh Kiln cache the boundary extension (native guards and plans), built once in
    `shared_dir`: like the precompiled header it depends only on the compiler, torch and Python, and
    `make venv` builds it into a user's cache once (`python -m kiln boundary`), so a new user's
    first process has it. Its sealed size and SHA-256 come along; the loader checks them."""
    import os
    import shutil

    import kiln
    from kiln.runtime import boundary, build

    saved = kiln.config.cache_dir
    try:
        kiln.config.cache_dir = shared_dir
        source = build.library_path(boundary.source(), boundary._flags())
        if not os.path.exists(source):  # built there (this process may hold another cache's copy)
            build.load(boundary.source(), boundary._flags(), symbols=boundary.SYMBOLS)
        kiln.config.cache_dir = cache_dir
        target = build.library_path(boundary.source(), boundary._flags())
        if os.path.exists(target):
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        for suffix in ("", ".sum"):
            shutil.copy2(source + suffix, target + suffix)
    finally:
        kiln.config.cache_dir = saved


def seed_precompiled_header(cache_dir: str, shared_dir: str) -> None:
    """Give a fresh Kiln cache the native wrappers' precompiled header, built once in `shared_dir`:
    it depends only on the compiler, its flags and torch, so every workload's cold cache would build
    the same one (tens of seconds in the background) before its first native wrapper. First-call
    times do not use it (native wrappers are built only for hot graphs)."""
    import os
    import shutil

    import kiln
    from kiln.runtime import native

    saved = kiln.config.cache_dir
    try:
        kiln.config.cache_dir = shared_dir
        if not native.ensure_precompiled_header():
            return
        source = native.precompiled_header_path()
        kiln.config.cache_dir = cache_dir
        target = native.precompiled_header_path()
        if source is None or target is None or os.path.exists(target + ".gch"):
            return
        for suffix in ("", ".gch", ".gch.sum"):
            shutil.copy2(source + suffix, target + suffix)
    finally:
        kiln.config.cache_dir = saved
