"""Runtime support for lowered graphs: building C++ into shared objects, the on-disk cache, and what
runs a compiled graph at call time.

`build.load(source, flags) -> ctypes.CDLL` (cached under kiln.config.cache_dir keyed by source,
flags, compiler and torch versions); `cache` holds the keys and paths; `aot` holds AotRuntime and
the recipes the persistent frame cache stores (imported on use: it is not needed to build).
"""
from kiln.runtime import build, cache

__all__ = ["build", "cache"]
