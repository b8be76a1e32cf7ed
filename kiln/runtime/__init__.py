"""Runtime support for compiled graphs: the cache directory and its file formats, building C++ into
verified shared objects, the artifact protocol, and what runs a compiled graph at call time.

`store` (the cache directory: trust, atomic and sealed files), `records` (the data-only format of
cache files), `cache` (keys and compiled-graph records), `build.load(source, flags) -> ctypes.CDLL`,
`artifact` (`describe(compiled) -> Recipe | None`, `rebuild(recipe) -> callable`), and the runtime
types that follow it: `kernel_wrapper` (a lowered graph's wrapper), `folded_weights` (the cached
BatchNorm-folded weights a wrapper asks for), `native` (a graph's wrapper as one C++ function),
`boundary` (the C++ extension the native wrapper and the guards share) and `aot` (AotRuntime); `plan`
resolves the mode and kiln.config's wrapper settings into what a compile does. The
runtime imports no other stage (docs/seams.md names the exceptions): lower and autograd import its
types, capture its public surface.
"""
from kiln.runtime import aot, artifact, build, cache, folded_weights, kernel_wrapper, native, records, store

__all__ = ["aot", "artifact", "build", "cache", "folded_weights", "kernel_wrapper", "native", "records", "store"]
