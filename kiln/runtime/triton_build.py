"""Loading generated Triton source: the one Kiln module that imports triton.

`load(source, interpret=...)` writes a module of @triton.jit kernels (made by
kiln.lower.codegen.triton_kernel) under `config.cache_dir/triton/`, keyed by its text, and imports
it: Triton's JIT reads a kernel's source back from its file, so the kernels must live in one. With
`interpret=True` (CPU tensors, `kiln.config.cpu_backend = "triton"`) TRITON_INTERPRET=1 is set for
the rest of the process (Triton reads it at import and at each call), so Triton's interpreter
runs the kernels on CPU through numpy. The generated
code calls transcendental math as `libdevice.<fn>`: on CUDA that is Triton's libdevice, under the
interpreter (which cannot call libdevice) `math_library()` gives numpy versions of the same
functions. Corresponds to torch/_inductor/runtime/triton_heuristics.py's loading of kernels.
"""
from __future__ import annotations

import hashlib
import importlib.util
import linecache
import os
import sys
import tempfile
import threading
from types import ModuleType
from typing import Any

from kiln.runtime import store

_LOADED: dict[tuple[str, bool], ModuleType] = {}
_LOCK = threading.Lock()


def available() -> bool:
    """Whether triton can be imported (it is a test-only dependency on CPU machines)."""
    return importlib.util.find_spec("triton") is not None


def _set_mode(interpret: bool) -> None:
    """Put the process in the mode its kernels need. Triton reads TRITON_INTERPRET when it is imported
    (its own library functions become interpreted or compiled then) and again at each call, so the
    mode is one per process: interpreted kernels for CPU tensors cannot share it with compiled ones."""
    # FMA contraction would make float results differ from eager's separate multiply and add
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
    wanted = "1" if interpret else "0"
    current = os.environ.get("TRITON_INTERPRET", "0") or "0"
    if "triton" in sys.modules and current != wanted:
        raise RuntimeError(
            f"kiln: Triton is already loaded {'without' if interpret else 'with'} TRITON_INTERPRET=1, so it cannot "
            f"{'interpret kernels for CPU tensors' if interpret else 'compile kernels for CUDA'} in this process; "
            f"set TRITON_INTERPRET={wanted} before anything imports triton")
    os.environ["TRITON_INTERPRET"] = wanted


def load(source: str, *, interpret: bool) -> ModuleType:
    """The imported module of `source`'s kernels (each one a triton JIT or interpreted function)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    with _LOCK:
        if (key, interpret) in _LOADED:
            return _LOADED[(key, interpret)]
        # Triton's JIT reads each kernel's source back from its module's file, so the file must hold
        # exactly `source`: one found in the cache with other content (planted, torn) or not trusted
        # (kiln.runtime.store) is rewritten. The module runs `source` itself, never the file or a
        # bytecode cache beside it, and linecache is given the same text, so what Triton reads is
        # what ran. A refused or full cache directory gives a folder private to this process.
        folder = store.folder("triton", key[:2]) or tempfile.mkdtemp(prefix="kiln-triton-")
        path = os.path.join(folder, f"kiln_{key}.py")
        if store.read_file(path) != source.encode("utf-8") and not store.write_atomic(path, source.encode("utf-8")):
            path = os.path.join(tempfile.mkdtemp(prefix="kiln-triton-"), f"kiln_{key}.py")
            store.write_private(path, source)
        name = f"kiln_triton_{key}_{'interp' if interpret else 'jit'}"
        module = ModuleType(name)
        module.__file__ = path
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # no mtime: never re-read
        _set_mode(interpret)
        sys.modules[name] = module  # triton resolves a kernel's globals through its module
        exec(compile(source, path, "exec"), module.__dict__)
        _LOADED[(key, interpret)] = module
        return module


# ----------------------------------------------------------------------------- math under the interpreter

def _numpy_math() -> dict[str, Any]:
    """libdevice's function names -> numpy functions of the same meaning (float32 stays float32)."""
    import math

    import numpy as np

    def vectorized(fn: Any) -> Any:
        return lambda x: np.vectorize(fn, otypes=[x.dtype])(x) if x.size else x

    return {
        "sqrt": np.sqrt, "rsqrt": lambda x: (1 / np.sqrt(x)).astype(x.dtype), "exp": np.exp, "exp2": np.exp2,
        "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
        "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
        "atanh": np.arctanh, "erf": vectorized(math.erf), "erfc": vectorized(math.erfc),
        "lgamma": vectorized(lambda v: math.lgamma(v) if v == v and v not in (0.0, float("-inf"))
                             and not (v < 0 and v == math.floor(v)) else float("inf") if v == v else v),
        "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "nearbyint": np.rint,
        "pow": np.power, "atan2": np.arctan2, "hypot": np.hypot, "fmod": np.fmod, "copysign": np.copysign,
        "signbit": lambda x: np.signbit(x).astype(np.int32),
    }


class _InterpretedLibdevice:
    """`libdevice.<fn>(tensors...)` for interpreted kernels: applies the numpy function to the
    interpreter's arrays (triton 3.9's interpreter keeps a numpy array in each tensor's handle)."""

    def __init__(self) -> None:
        self._table = _numpy_math()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._table:
            raise AttributeError(f"libdevice.{name} has no interpreter version in Kiln")
        fn = self._table[name]

        def apply(*args: Any) -> Any:
            import numpy as np
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle

            tensors = [a for a in args if isinstance(a, tl.core.tensor)]
            widest = max(tensors, key=lambda a: a.handle.data.size)
            # a Python number (a literal of the generated code) takes the tensor's type, as Triton does
            arrays = [a.handle.data if isinstance(a, tl.core.tensor) else np.asarray(a, widest.handle.data.dtype)
                      for a in args]
            with np.errstate(all="ignore"):  # NaN and inf are values here, as in a GPU kernel
                data = fn(*arrays)
            if name == "signbit":
                ty = tl.block_type(tl.int32, widest.type.shape) if widest.type.is_block() else tl.int32
                return tl.core.tensor(TensorHandle(np.asarray(data), tl.int32), ty)
            data = np.asarray(data).astype(widest.handle.data.dtype)
            return tl.core.tensor(TensorHandle(data, widest.dtype), widest.type)

        return apply


def math_library() -> Any:
    """What the generated `libdevice` name is bound to: Triton's libdevice when kernels compile,
    numpy versions when they are interpreted."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return _InterpretedLibdevice()
    from triton.language.extra import libdevice

    return libdevice
