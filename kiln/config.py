"""Kiln's settings, each declared once below: its `kiln.config` name, the environment variable that
sets it, its default and one line of meaning. The README's settings table is generated from these
declarations (`python -m kiln knobs --markdown`); tests/test_knobs.py fails when the two drift.
Names mirror torch._dynamo.config's where they overlap.

A setting's environment variable is read once, when this module is imported (KILN_LOGS, which only
the environment sets, is read by kiln.log each time it configures itself). A switch is off for "0"
or "" and on for any other value; for every other setting an empty value is the same as unset.
Importing this module reads the environment and never writes it. Every stage reads a setting
through `kiln.config` at the moment it needs it; nothing caches a value, so a test can flip one
with `kiln.config.patch(...)` (or monkeypatch) and see its effect on the next compile.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, NamedTuple, TypeVar

_T = TypeVar("_T")


class Knob(NamedTuple):  # not a dataclass: tests load this file alone, outside sys.modules
    """One setting: `name` is its kiln.config attribute (None when only the environment sets it),
    `env` the variable that sets it (None when only code does), `shown` its default as the README
    prints it (a default computed at import, like a path under the working directory, is described)."""

    name: str | None
    env: str | None
    default: Any
    shown: str
    meaning: str

    @property
    def type_name(self) -> str:
        return "str or None" if self.default is None else type(self.default).__name__

    def from_env(self) -> Any:
        """The value the environment gives now: the default while the variable is unset."""
        raw = os.environ.get(self.env) if self.env else None
        if raw is None:
            return self.default
        if isinstance(self.default, bool):
            return raw not in ("", "0")
        if raw == "":
            return self.default
        if isinstance(self.default, int):
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{self.env}={raw!r}: expected an integer") from None
        return raw


KNOBS: list[Knob] = []  # in declaration order, which is the README table's order


def _declare(name: str | None, default: _T, meaning: str, *, env: str | None = None, shown: str | None = None) -> _T:
    """Record a setting and return its value at import (from `env` when that is set)."""
    literal = f'"{default}"' if isinstance(default, str) else repr(default)
    knob = Knob(name, env, default, f"`{literal}`" if shown is None else shown, meaning)
    KNOBS.append(knob)
    value: _T = knob.from_env()
    return value


def knob(key: str) -> Knob:
    """The declaration of a setting, by its kiln.config name or its environment variable."""
    for k in KNOBS:
        if key in (k.name, k.env):
            return k
    raise KeyError(f"kiln.config declares no setting {key!r}")


def setting_names() -> frozenset[str]:
    """The kiln.config attributes that are settings (not the registry, its helpers or imports)."""
    return frozenset(k.name for k in KNOBS if k.name is not None)


def _default_cache_dir() -> str:
    """$XDG_CACHE_HOME/kiln, else ~/.cache/kiln for a real home directory. An empty or relative HOME
    (`HOME=""` makes expanduser give "/") falls back to the password database's home, and without
    one to a per-user folder in the temporary directory."""
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


# capture
cache_size_limit: int = _declare(
    "cache_size_limit", 8, "compiled entries per code object before the frame runs eagerly")
suppress_errors: bool = _declare("suppress_errors", True, "an internal error falls back to eager with one warning")

# dynamic shapes
automatic_dynamic_shapes: bool = _declare(
    "automatic_dynamic_shapes", True, "a size that changed is captured as a symbol next time")
assume_static_by_default: bool = _declare(
    "assume_static_by_default", True, "first capture is static unless dynamic=True / mark_dynamic")
specialize_int: bool = _declare(
    "specialize_int", False, "python int arguments are burnt in as constants forever if True")
specialize_float: bool = _declare(  # torch.compile 2.13's default is False too
    "specialize_float", False, "python float arguments are burnt in as constants forever if True")
capture_scalar_outputs: bool = _declare(
    "capture_scalar_outputs", False, "`.item()` becomes an unbacked symbol instead of a graph break")

# distributed (kiln.capture.distributed): each bucket's all-reduce then overlaps the backward of the next piece
optimize_ddp: bool = _declare(
    "optimize_ddp", True, "split graphs compiled inside DistributedDataParallel at its gradient-bucket boundaries",
    env="KILN_OPTIMIZE_DDP")

# runtime
cache_dir: str = _declare(
    "cache_dir", _default_cache_dir(), "where compiled kernels, wrappers and frames are kept",
    env="KILN_CACHE_DIR", shown="`$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`, else `<tmp>/kiln-cache-<uid>`")
persistent_cache: bool = _declare(
    "persistent_cache", True, "frames captured before are loaded from `cache_dir/frames` by later processes",
    env="KILN_PERSISTENT_CACHE")
debug_dir: str = _declare(
    "debug_dir", os.path.join(os.getcwd(), "kiln_debug"), "where the KILN_DEBUG dump is written",
    env="KILN_DEBUG_DIR", shown="`./kiln_debug` (working directory at import)")
debug: bool = _declare(
    "debug", False, "dump every stage's output (graphs, guards, glue, kernels, wrapper) to `debug_dir`",
    env="KILN_DEBUG")
# diagnostics (kiln.debug.repro): see README's debugging workflow
repro_after: str | None = _declare(
    "repro_after", None, '"capture", "aot" or "lower": write a repro.py when that stage\'s output fails',
    env="KILN_REPRO_AFTER")
repro_dir: str = _declare(
    "repro_dir", os.path.join(os.getcwd(), "kiln_repro"), "where KILN_REPRO_AFTER writes its repro.py",
    env="KILN_REPRO_DIR", shown="`./kiln_repro` (working directory at import)")
report_dir: str | None = _declare(
    "report_dir", None, "write one HTML page of the run into this folder at exit (kiln.debug.report)",
    env="KILN_REPORT")
# C++ kernels run on torch.get_num_threads() threads (torch.set_num_threads / OMP_NUM_THREADS). Opt-in,
# like OpenMP's OMP_DYNAMIC; read when a graph is compiled or loaded and whenever torch's thread count
# changes.
adaptive_threads: bool = _declare(
    "adaptive_threads", False, "loops under 4M elements drop to one thread while other processes keep every CPU busy",
    env="KILN_ADAPTIVE_THREADS")
# Random ops lowered into kernels draw from Kiln's counter-based generator (seeded from torch's), so
# a compiled program's random numbers differ from eager's under the same seed. Like torch.compile's
# fallback_random, this runs them as ATen calls on torch's generator instead, in eager's order (slower).
fallback_random: bool = _declare(
    "fallback_random", False, "random ops (rand, randn, bernoulli/dropout, randint ...) run as ATen calls on torch's "
    "generator: a compiled program draws eager's numbers under the same seed (for testing)",
    env="KILN_FALLBACK_RANDOM")
# Triton kernels on CPU run under Triton's interpreter: slow, for testing the GPU path. The process then
# runs with TRITON_INTERPRET=1, set by kiln.runtime.triton_build when it first loads such kernels.
cpu_backend: str = _declare(
    "cpu_backend", "cpp", 'code generator for graphs on CPU tensors: "cpp" (C++ with OpenMP) or "triton"',
    env="KILN_CPU_BACKEND")
# "auto": native from the start under mode="reduce-overhead"; otherwise Python first, and a graph called
# native_wrapper_after times gets its native wrapper built on a background thread and runs it once ready
cpu_wrapper: str = _declare(
    "cpu_wrapper", "auto", 'wrapper of C++ graphs: "python" (one ctypes call per kernel), "native" (one C++ '
    'function per graph, kiln.runtime.native) or "auto"', env="KILN_CPU_WRAPPER")
native_wrapper_after: int = _declare(
    "native_wrapper_after", 100, 'calls after which a graph tiers up to its native wrapper under "auto" (0: never)',
    env="KILN_NATIVE_WRAPPER_AFTER")
native_plan: bool = _declare(
    "native_plan", True, "native wrappers run as plans interpreted by the boundary extension (no C++ compiled per "
    "graph; from a graph's first call once the extension is built): off, each graph's own C++ wrapper is compiled",
    env="KILN_NATIVE_PLAN")
native_guards: bool = _declare(
    "native_guards", True, "guards check tensors and dict keys with one call into the native extension once built "
    "(off: the generated Python checks only)", env="KILN_NATIVE_GUARDS")
fast_entry: bool = _declare(
    "fast_entry", True, "a compiled function or module whose cache entries each run one graph and guard only what "
    "the extension checks (tensors, identities, types, constants, module tables, grad mode, shapes) is called as one "
    "native call (guards of each entry, glue and graph) once the extension is built",
    env="KILN_FAST_ENTRY")

# diagnostics set only by the environment
_declare(None, "", "artifacts and stage debug logs to print, e.g. `graph_breaks,recompiles,+lower` (kiln.log)",
         env="KILN_LOGS")


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Temporarily change settings: `with kiln.config.patch(cache_size_limit=2): ...`."""
    module = globals()
    for name in changes:
        if name not in setting_names():
            raise AttributeError(f"kiln.config has no setting {name!r}")
    saved = {name: module[name] for name in changes}
    module.update(changes)
    try:
        yield
    finally:
        module.update(saved)
