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

import math
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


def may_overlap_guarded(sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """`may_overlap` for capture, over symbolic sizes and strides too: each comparison of the walk
    is decided on the example values and kept as a guard (a later call whose layout answers
    otherwise recompiles). An input with a stride of its own (`x.unfold(0, 4, 3)`, a padded row)
    is overlapping or not by its values, which `may_overlap` cannot judge without guards."""
    dims = [(size, stride) for size, stride in zip(sizes, strides) if not (type(size) is int and size <= 1)]
    if any(type(stride) is int and stride == 0 for _, stride in dims):
        return True

    reach: Any = 0
    for size, stride in sorted(dims, key=lambda d: _hint(d[1])):
        if bool(stride <= reach):  # a symbolic comparison is guarded
            return True
        reach = reach + (size - 1) * stride
    return False


def _sibling_slices_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views with the same (symbolic) strides are proven apart, with guards: slices of
    one base along its unit-stride dim (`x[:, :h]` and `x[:, h:]`), or two columns of one matrix
    (`x[:, 0]` and `x[:, 1]`). False where it cannot tell."""
    if a.element_size() != b.element_size() or a.dim() != b.dim() or a.dim() == 0:
        return False
    strides = a.stride()
    if any(not _same_size(x, y) for x, y in zip(strides, b.stride())):
        return False
    d = b.storage_offset() - a.storage_offset()
    if a.dim() == 1:  # every address of a is off_a + i*S, of b off_a + d + j*S: apart when 0 < |d| < S
        return bool(0 < d) and bool(d < strides[0]) or bool(d < 0) and bool(-d < strides[0])
    order = sorted(range(a.dim()), key=lambda k: _hint(strides[k]))
    inner = order[0]
    if not (type(strides[inner]) is int and strides[inner] == 1):
        return False
    na, nb = a.shape[inner], b.shape[inner]
    # along the unit-stride dim a holds [0, na) and b [d, d + nb): disjoint, and their union narrower
    # than the next stride, so that each address has one position in the union box
    if bool(d >= na):
        reach = d + nb
    elif bool(d + nb <= 0):
        reach = na - d
    else:
        return False
    for k in order[1:]:
        if not bool(strides[k] >= reach):
            return False
        size = a.shape[k] if bool(a.shape[k] >= b.shape[k]) else b.shape[k]
        reach = reach + (size - 1) * strides[k]
    return True


def _same_size(x: Any, y: Any) -> bool:
    """Whether two sizes or strides are one value: equal ints, or symbols of one expression."""
    if type(x) is int and type(y) is int:
        return x == y
    if isinstance(x, torch.SymInt) and isinstance(y, torch.SymInt):
        return bool(x.node.expr == y.node.expr)
    return False


def _hint(v: Any) -> int:
    return v if type(v) is int else int(getattr(v.node, "hint", None) or 0)


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


def same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are one layout of one storage: the same elements in the same order, up to
    dims of size 1 (`x` and `x.view(1, *x.shape)`, `x` and `x[:]`)."""
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata or a.element_size() != b.element_size():
        return False
    if a.numel() == 0 or b.numel() == 0:
        return a.numel() == b.numel()

    def dims(t: torch.Tensor) -> list:
        return [(size, stride) for size, stride in zip(t.shape, t.stride()) if not (type(size) is int and size == 1)]

    return bool(a.storage_offset() == b.storage_offset()) and len(dims(a)) == len(dims(b)) and all(
        bool(sa == sb) and bool(ta == tb) for (sa, ta), (sb, tb) in zip(dims(a), dims(b)))


_EXACT_ELEMENTS = 1 << 20  # the most elements elements_meet lists to compare addresses one by one


def elements_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of a and some element of b share memory (two strided tensors).

    Exact for concrete layouts of up to _EXACT_ELEMENTS elements (the addresses are listed and
    compared: `x[::2]` and `x[1::2]` are apart though their ranges interleave); otherwise whether
    their byte ranges meet, which may say True for tensors that interleave without meeting. Symbolic
    offsets and sizes are compared with guards (asked only of two tensors of one storage)."""
    if a.layout != torch.strided or b.layout != torch.strided or a.device != b.device:
        return False
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata or a.numel() == 0 or b.numel() == 0:
        return False
    spans = []
    for t in (a, b):
        # negative strides do not occur in torch; the last element is reached by every dim's last index
        last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        spans.append((t.storage_offset() * t.element_size(), (last + 1) * t.element_size()))
    (a_begin, a_end), (b_begin, b_end) = spans
    if not bool(a_begin < b_end and b_begin < a_end):
        return False
    steps = [stride for t in (a, b) for size, stride in zip(t.shape, t.stride()) if not (type(size) is int and size == 1)]
    offsets = [a.storage_offset(), b.storage_offset()]
    if a.element_size() == b.element_size() and all(type(v) is int for v in (*steps, *offsets)):
        # every address of a is its offset plus a multiple of the strides' gcd, and so for b: offsets
        # apart modulo it never meet, whatever the (symbolic) sizes (`x[:, 0]` and `x[:, 1]`)
        step = math.gcd(*steps) if steps else 0
        if step > 1 and (offsets[0] - offsets[1]) % step != 0:
            return False
    concrete = all(type(v) is int for t in (a, b) for v in (*t.shape, *t.stride(), t.storage_offset()))
    if not concrete and _sibling_slices_apart(a, b):
        return False
    if not concrete or a.element_size() != b.element_size() or max(a.numel(), b.numel()) > _EXACT_ELEMENTS:
        return True
    where = [torch.arange(_extent(tuple(t.shape), t.stride())).as_strided(t.shape, t.stride()).reshape(-1)
             .add(t.storage_offset()) for t in (a, b)]
    return bool(torch.isin(where[0], where[1]).any())
