"""Runtime support for lowered graphs: building C++ into shared objects and the on-disk cache.

`build.load(source, flags) -> ctypes.CDLL` (cached under kiln.config.cache_dir keyed by source,
flags, compiler and torch versions); `cache` holds the keys and paths.
"""
from kiln.runtime import build, cache

__all__ = ["build", "cache"]
