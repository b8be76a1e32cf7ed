"""Strided layouts whose elements share memory (an `expand`, a sliding window), and writing into them.

A layout with a zero stride on a dim of size > 1, or strides that make two indices meet at one
address, cannot take a plain `copy_`: ATen refuses to write "more than one element of the
written-to tensor refers to a single memory location". Yet Kiln makes such tensors where eager's
program had them: the kernels of a graph were compiled for an input's strides, and a backward's
saved activation may be an expand of a forward input. `may_overlap` says whether a layout can
alias itself (conservatively: True when it cannot prove otherwise, never False for one that does);
`strided_copy(t, strides)` gives a tensor with t's sizes and these strides holding t's values, each
shared address written once, from one of the elements that meet there (they hold equal values
wherever the layout came from a real tensor of that layout). Capture uses `may_overlap` too: a
write into such a tensor runs eagerly (kiln.capture.tracer). The wrappers' `_relayout`, CUDA-graph
static inputs and the autotuner's input copies go through here.
No PyTorch counterpart as one module: torch/_inductor/compile_fx.py's index_expanded_dims_and_copy_
does part of this for CUDA graphs.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def may_overlap(sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Whether two indices of a layout can address the same element.

    Symbolic sizes or strides (torch.SymInt) are not compared, which would add guards: only a zero
    stride is then taken as sharing (a symbolic size is at least 2); the rest is taken as apart."""
    dims = [(size, stride) for size, stride in zip(sizes, strides) if not (type(size) is int and size <= 1)]
    if any(type(stride) is int and stride == 0 for _, stride in dims):
        return True
    if any(type(size) is not int or type(stride) is not int for size, stride in dims):
        return False
    # Walk the dims from the smallest stride out: each must step past everything the dims inside it
    # reach. That proves no overlap; a layout that fails it may still interleave without meeting
    # (sizes (3, 2), strides (2, 3)), which is only taken as overlap: the careful copy, not a wrong one.
    reach = 0
    for size, stride in sorted(dims, key=lambda d: d[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def partially_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether an op that writes `a` while reading `b` meets eager's refusal "some elements of the
    input tensor and the written-to tensor refer to a single memory location".

    Eager refuses when both layouts are dense without self-overlap, lie in one storage, and their
    byte ranges meet without being the same elements in the same order (`x[:4].add_(x[1:])`,
    `m.add_(m.t())`); a tensor read as it is written (`x.mul_(x)`), disjoint ranges, or strided
    layouts it cannot judge pass. Symbolic offsets and sizes are compared, with guards: this is
    asked only of two tensors of one storage."""
    if a is b or a.layout != torch.strided or b.layout != torch.strided or a.device != b.device:
        return False
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return False
    if a.numel() == 0 or b.numel() == 0:
        return False
    if not (_dense(a) and _dense(b)):
        return False
    a_begin = a.storage_offset() * a.element_size()
    b_begin = b.storage_offset() * b.element_size()
    a_end = a_begin + a.numel() * a.element_size()
    b_end = b_begin + b.numel() * b.element_size()
    if a_begin == b_begin and a_end == b_end:
        return tuple(a.stride()) != tuple(b.stride())
    return bool(a_begin < b_end and b_begin < a_end)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill a block of memory once each, in some order of its dims."""
    step = 1
    for size, stride in sorted(((size, stride) for size, stride in zip(t.shape, t.stride()) if size != 1),
                               key=lambda d: d[1]):
        if stride != step:
            return False
        step *= size
    return True


def strided_copy(t: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """A new tensor with t's sizes, dtype and device, these `strides` and t's values."""
    sizes = tuple(t.shape)
    if may_overlap(sizes, strides):
        out = torch.empty(_extent(sizes, strides), dtype=t.dtype, device=t.device).as_strided(sizes, tuple(strides))
        copy_into(out, t)
        return out
    out = torch.empty_strided(sizes, tuple(strides), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def copy_into(dest: torch.Tensor, src: torch.Tensor) -> None:
    """`dest.copy_(src)` for a destination whose elements may share memory (a CUDA graph's static
    input made with an expanded input's strides): each address of dest is written, from one of the
    elements of src that meet there; no address outside dest's layout is touched."""
    if not may_overlap(tuple(dest.shape), dest.stride()):
        dest.copy_(src)
        return
    src = src.expand(dest.shape)
    # A dim of stride 0 holds one value along it: one slice of src gives it, and the layout without
    # such dims usually overlaps no more; else each address gets one of its elements by index.
    for d, (size, stride) in enumerate(zip(tuple(dest.shape), dest.stride())):
        if stride == 0 and size > 1:
            dest = dest.narrow(d, 0, 1)
            src = src.narrow(d, 0, 1)
    if not may_overlap(tuple(dest.shape), dest.stride()):
        dest.copy_(src)
        return
    extent = _extent(tuple(dest.shape), dest.stride())
    where = torch.arange(extent, device=dest.device).as_strided(dest.shape, dest.stride())
    flat = dest.as_strided((extent,), (1,))  # from dest's first address (its storage offset kept)
    flat.scatter_(0, where.reshape(-1), src.reshape(-1).to(dest.dtype))


def _extent(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a layout's first address to its last (0 for an empty layout)."""
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(sizes, strides))
