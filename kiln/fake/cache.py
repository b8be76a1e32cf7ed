"""The fake-op cache: output metadata of an op, keyed by its inputs' metadata.

A meta kernel's answer (sizes, strides, dtype of each output) depends only on the op, the
inputs' metadata and the non-tensor arguments, and many of torch's meta kernels are Python
(torch._refs) and slow per call. Models repeat ops on the same shapes (every layer of a
transformer, the AOT re-trace of a captured graph), so `run_meta` asks here first and a hit only
allocates the outputs' meta tensors. Only ops whose outputs are fresh tensors (no view, no
in-place, no out=) on concrete sizes are cached. PyTorch counterpart: FakeTensorMode's dispatch
cache (torch/_subclasses/fake_tensor.py, _cached_dispatch_impl).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

import torch

from kiln.fake.tensor import FakeTensor

_META = torch.device("meta")
_MAX_ENTRIES = 50_000

# Argument types whose value (not identity) decides the output; anything else bypasses the cache.
_VALUE_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                torch.memory_format)


@dataclass(frozen=True)
class OutputMeta:
    """What is needed to rebuild one output tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0


_ENTRIES: dict[Hashable, tuple[OutputMeta, ...] | OutputMeta] = {}
_CACHEABLE: dict[Any, bool] = {}
stats = CacheStats()


def clear() -> None:
    """Forget every entry (kiln.reset(); tests)."""
    _ENTRIES.clear()
    stats.hits = stats.misses = stats.bypasses = 0


def is_cacheable_op(func: Any) -> bool:
    """Whether the op always returns fresh tensors: no alias annotation on any return or argument."""
    known = _CACHEABLE.get(func)
    if known is None:
        schema = func._schema
        known = (
            all(r.alias_info is None for r in schema.returns)
            and all(a.alias_info is None for a in schema.arguments)
            and len(schema.returns) > 0
            and all(isinstance(r.type, torch.TensorType) for r in schema.returns)
            and torch.Tag.dynamic_output_shape not in func.tags
            and torch.Tag.inplace_view not in func.tags
        )
        _CACHEABLE[func] = known
    return known


def key_of(func: Any, args: tuple, kwargs: dict) -> Hashable | None:
    """The cache key, or None when an argument cannot be keyed (a SymInt, a symbolic tensor)."""
    parts: list[Any] = [func, torch.get_default_dtype()]
    for group in (args, kwargs.items()):
        for a in group:
            if not _append_key(parts, a):
                return None
    return tuple(parts)


def _append_key(parts: list[Any], a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if a._has_symbolic_sizes_strides or a.layout != torch.strided:
            return False
        dtype = a.dtype
        device = a.fake_device if type(a) is FakeTensor else a.device
        if dtype.is_complex:
            parts.append((dtype, a.shape, a.stride(), a.storage_offset(), device, a.is_conj(), a.is_neg()))
        else:
            parts.append((dtype, a.shape, a.stride(), a.storage_offset(), device))
        return True
    if isinstance(a, _VALUE_TYPES):
        # 1, 1.0 and True are equal as dict keys but promote differently (int vs float tensors).
        parts.append((type(a), a))
        return True
    if isinstance(a, (list, tuple)):
        parts.append(len(a))
        return all(_append_key(parts, b) for b in a)
    return False


def lookup(key: Hashable) -> tuple[OutputMeta, ...] | OutputMeta | None:
    entry = _ENTRIES.get(key)
    if entry is None:
        stats.misses += 1
    else:
        stats.hits += 1
    return entry


def store(key: Hashable, out: Any) -> None:
    """Remember a kernel's output if every output is a fresh, offset-0, unshared meta tensor."""
    if isinstance(out, torch.Tensor):
        entry = _describe(out)
    elif isinstance(out, tuple) and all(isinstance(o, torch.Tensor) for o in out):
        storages = {o.untyped_storage()._cdata for o in out}
        if len(storages) != len(out):
            entry = None  # outputs viewing one buffer cannot be rebuilt one by one
        else:
            descs = tuple(_describe(o) for o in out)
            entry = None if any(d is None for d in descs) else descs  # type: ignore[assignment]
    else:
        entry = None
    if entry is None:
        stats.bypasses += 1
        return
    if len(_ENTRIES) >= _MAX_ENTRIES:
        _ENTRIES.clear()
    _ENTRIES[key] = entry


def _describe(t: torch.Tensor) -> OutputMeta | None:
    if t.storage_offset() != 0 or t.is_conj() or t.is_neg():
        return None
    shape, stride = tuple(t.shape), t.stride()
    if t.untyped_storage().nbytes() != _span(shape, stride) * t.element_size():
        return None
    return OutputMeta(shape, stride, t.dtype)


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def rebuild(entry: tuple[OutputMeta, ...] | OutputMeta) -> Any:
    """Fresh meta tensors matching a cached entry (call inside the mode's kernel invocation)."""
    if isinstance(entry, OutputMeta):
        return torch.empty_strided(entry.shape, entry.stride, dtype=entry.dtype, device=_META)
    return tuple(torch.empty_strided(e.shape, e.stride, dtype=e.dtype, device=_META) for e in entry)
