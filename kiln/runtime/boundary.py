"""The boundary extension: the one graph-independent piece of C++ between Python and Kiln's native code.

Its source is `boundary.cpp` beside this module, with `plan_runner.cpp` spliced in (both shipped as
package data): a small CPython extension, built once per torch and Python with the system compiler
and then loaded from the cache (size and SHA-256 checked, kiln.runtime.build), that two stages use:
- the native wrapper (kiln.runtime.native) binds each graph's C++ function to it
  (`make`, `call`, `steal`);
- the guards (kiln.capture.guards) check a tensor's metadata, a dict's keys and a module's hook
  dicts in one call each (`tensor_spec`/`tensor_ok`, `same_keys`, `empty_attrs`).
Capture never builds it: it asks `built()` (None unless this process or an earlier one built it) and
registers `when_loaded(callback)` so that its checks switch once the native wrapper's tier-up thread
has loaded it. The ATen compiler flags live here too: the native wrapper's graph libraries are
built with the same ones.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.resources
import os
import sysconfig
import threading
from typing import Any, Callable

import torch

from kiln.runtime import build

SYMBOLS = ("kiln_native_module",)  # what the extension's library exports


SPLICE = "// kiln: plan_runner.cpp is spliced in here"  # the line of boundary.cpp that plan_runner.cpp replaces


@functools.cache
def aten_helpers() -> str:
    """`aten_helpers.cpp` (package data): the C++ helpers over ATen that the plan runner and every
    compiled per-graph wrapper (kiln.lower.codegen.native_wrapper's prelude, through
    kiln.runtime.native) share: floor division of sizes, the overlap test, re-laying out an input."""
    return importlib.resources.files(__package__).joinpath("aten_helpers.cpp").read_text()


def source() -> str:
    """The C++ source of the extension: `boundary.cpp` with `aten_helpers.cpp` and `plan_runner.cpp`
    spliced in at its marker (package data of kiln.runtime), one text, so one cache key covers all."""
    files = importlib.resources.files(__package__)
    main, runner = files.joinpath("boundary.cpp").read_text(), files.joinpath("plan_runner.cpp").read_text()
    at = main.index(SPLICE)
    return main[:at] + aten_helpers() + "\n" + runner + main[main.index("\n", at) + 1:]


def torch_paths() -> tuple[str, str]:
    """Torch's header and library folders."""
    root = os.path.dirname(torch.__file__)
    return os.path.join(root, "include"), os.path.join(root, "lib")


def aten_compile_flags() -> tuple[str, ...]:
    """The compiler half of the flags of C++ over ATen (a graph's native wrapper, its precompiled
    header, the boundary). -O1: the code only sequences calls; -O3 would add build time and win nothing."""
    include, _ = torch_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ("-O1", "-std=c++17", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}")


def aten_link_flags() -> tuple[str, ...]:
    """The linker half: a shared library linked to torch's own libraries."""
    _, lib = torch_paths()
    # --no-as-needed: the libraries come before the source on the command line (build.compile_shared)
    return ("-shared", "-Wl,--no-as-needed", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu")


def _flags() -> tuple[str, ...]:
    python_include = sysconfig.get_paths()["include"]
    # -O2 after the ATen flags' -O1: the plan runner's loop is run per graph call, and built once
    return (*aten_compile_flags(), "-O2", *aten_link_flags(), f"-I{python_include}", "-ltorch_python")


_loaded: list[Any] = []  # the extension module, once loaded
_lock = threading.Lock()  # the tier-up thread and the caller's may both ask first
_when_loaded: list[Callable[[Any], None]] = []  # called once with the module when it is loaded


def load() -> Any:
    """The extension module (built once per torch and Python, then loaded from the cache)."""
    if _loaded:
        return _loaded[0]
    return _adopt(build.load(source(), _flags(), symbols=SYMBOLS))


def built() -> Any | None:
    """The extension module when this process loaded it or an earlier one left it built in the
    cache (loaded then, verified like any library); None otherwise: nothing is compiled."""
    if _loaded:
        return _loaded[0]
    lib = build.load_if_built(source(), _flags(), symbols=SYMBOLS)
    return None if lib is None else _adopt(lib)


def when_loaded(callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` once the extension is loaded (now, if it is)."""
    with _lock:
        if not _loaded:
            _when_loaded.append(callback)
            return
    callback(_loaded[0])


def _adopt(lib: ctypes.CDLL) -> Any:
    with _lock:
        if _loaded:
            return _loaded[0]
        # a Python-API function: called with the GIL held (ctypes.CDLL's functions release it)
        address = ctypes.cast(lib.kiln_native_module, ctypes.c_void_p).value
        assert address is not None
        make_module = ctypes.PYFUNCTYPE(ctypes.py_object)(address)
        _loaded.append(make_module())
        callbacks = list(_when_loaded)
        _when_loaded.clear()
    for callback in callbacks:
        callback(_loaded[0])
    return _loaded[0]


def build_now() -> str:
    """Build (or find) the extension now and return its library's path: `python -m kiln boundary`,
    which `make venv` runs so that a new user's first process already has it."""
    load()
    return build.library_path(source(), _flags())
