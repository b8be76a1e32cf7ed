"""Real tensor -> FakeTensor, in one call, memoized per mode.

Capture turns each input, parameter and buffer it meets into a fake through `from_real`; the fake
has the real tensor's sizes, strides, storage offset, dtype, device and requires_grad, and a view
of a real base becomes a view of the base's fake, so aliasing seen by the graph is the real one.
Dims named in `dynamic_dims` get size symbols from the mode's ShapeEnv (kiln.symbolic).
PyTorch counterpart: torch/_subclasses/meta_utils.py (MetaConverter) and FakeTensorConverter.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from kiln.errors import Unsupported
from kiln.fake.devices import normalize_device
from kiln.fake.tensor import FakeTensor

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

_META = torch.device("meta")


def from_real(mode: "FakeTensorMode", t: torch.Tensor, *, source: str | None = None,
              dynamic_dims: Sequence[int] = ()) -> FakeTensor:
    """The fake of `t` in `mode` (the same fake each time `t` is converted)."""
    if isinstance(t, FakeTensor):
        if t.fake_mode is not mode:
            raise ValueError("from_real got a FakeTensor of another FakeTensorMode")
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_real expects a torch.Tensor, got {type(t).__name__}")
    memo = mode._real_to_fake.get(t)
    if memo is not None:
        return memo
    _check_convertible(t)
    try:
        t.is_leaf
    except RuntimeError as exc:
        # a view made under no_grad whose base was then written in place: eager itself refuses to
        # read its autograd history (is_leaf, grad_fn), so no graph can take it as an input
        raise Unsupported(f"a tensor whose autograd history eager refuses to read: {str(exc).splitlines()[0][:90]}",
                          kind="unsupported_call") from exc
    dims = _check_dynamic_dims(mode, t, source, dynamic_dims)
    if t.layout != torch.strided:
        # Sparse tensors keep their structure (indices, values, nnz) as meta tensors; nnz is
        # part of their metadata, so it is known without data.
        fake = FakeTensor(mode, _sparse_meta(t), normalize_device(t.device), t.requires_grad)
    elif t._is_view() and t._base is not None and not dims:
        fake = _view_of_fake_base(mode, t, t._base, source)
    else:
        meta = _meta_like(mode, t, source, dims)
        fake = FakeTensor(mode, meta, normalize_device(t.device), t.requires_grad)
    if isinstance(t, torch.nn.Parameter):
        # nn.Parameter(custom subclass) detaches it and marks the copy `_is_param`, which makes
        # isinstance(fake, nn.Parameter) hold. Mark the fresh fake directly: a detach outside the
        # mode makes C++ import torch.distributed.tensor (slow) to rule out DTensor.
        fake._is_param = True
    if t.is_conj() or t.is_neg():
        # a lazily conjugated (or negated) view: the bits say how its memory reads, and eager's ops
        # resolve them (or refuse, as view_as_real does); the meta made from sizes and strides lost them
        torch._C._set_conj(fake, t.is_conj())
        torch._C._set_neg(fake, t.is_neg())
    if t.is_leaf and t.grad is not None:
        fake.grad = from_real(mode, t.grad, source=None if source is None else f"{source}.grad")
    mode._real_to_fake[t] = fake
    return fake


def _sparse_meta(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), torch._C._DisableTorchDispatch():
        if t.layout == torch.sparse_coo:
            # .to("meta") drops a COO tensor's entries (nnz becomes 0); rebuild from its parts.
            return torch.sparse_coo_tensor(t._indices().to(_META), t._values().to(_META), t.shape,
                                           check_invariants=False, is_coalesced=t.is_coalesced())
        # Compressed layouts lose their entries through .to("meta") too.
        if t.layout in (torch.sparse_csr, torch.sparse_bsr):
            compressed, plain = t.crow_indices(), t.col_indices()
        else:
            compressed, plain = t.ccol_indices(), t.row_indices()
        return torch.sparse_compressed_tensor(
            compressed.to(_META), plain.to(_META), t.values().to(_META), t.shape,
            layout=t.layout, check_invariants=False)


def _check_convertible(t: torch.Tensor) -> None:
    if t.layout not in (torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc,
                        torch.sparse_bsr, torch.sparse_bsc):
        raise NotImplementedError(f"kiln.fake: tensors with layout {t.layout} cannot be made fake yet")
    if t.is_quantized or t.is_nested:
        raise NotImplementedError("kiln.fake: quantized and nested tensors cannot be made fake yet")
    if type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer) and \
            not isinstance(t, torch.nn.Parameter):
        raise NotImplementedError(f"kiln.fake: tensor subclass {type(t).__name__} cannot be made fake")


def _check_dynamic_dims(mode: "FakeTensorMode", t: torch.Tensor, source: str | None,
                        dynamic_dims: Sequence[int]) -> tuple[int, ...]:
    if not dynamic_dims:
        return ()
    if mode.shape_env is None:
        raise ValueError("from_real(dynamic_dims=...) needs a FakeTensorMode with a shape_env")
    if source is None:
        raise ValueError("from_real(dynamic_dims=...) needs a source to name the size symbols")
    dims = tuple(sorted({d % t.dim() if t.dim() else d for d in dynamic_dims}))
    for d in dims:
        if not 0 <= d < t.dim():
            raise IndexError(f"dynamic dim {d} out of range for a tensor of {t.dim()} dims")
    return dims


def _view_of_fake_base(mode: "FakeTensorMode", t: torch.Tensor, real_base: torch.Tensor,
                       source: str | None) -> FakeTensor:
    """Replay `t` as an as_strided view of its base's fake, so both share one fake storage."""
    base = from_real(mode, real_base, source=None if source is None else f"{source}._base")
    # A real view with a grad_fn was made under grad mode: replaying it there gives the fake an
    # AsStridedBackward node too. A view made under no_grad is a leaf (that still requires grad
    # when its base does), which replaying under no_grad reproduces.
    with torch.set_grad_enabled(not t.is_leaf), mode:
        over = _retyped_storage(base, real_base, t.dtype) if real_base.dtype != t.dtype else base
        view = over.as_strided(t.size(), t.stride(), t.storage_offset())
    if view.requires_grad != t.requires_grad and view.is_leaf:
        view.requires_grad_(t.requires_grad)
    return cast(FakeTensor, view)  # an op run under `mode` returns one of its FakeTensors


def _retyped_storage(base: torch.Tensor, real_base: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole storage of `base` (a fake) as one flat tensor of `dtype`, for a view of another dtype
    (view_as_real of a complex tensor, view_as_complex, .view(dtype)): as_strided on the base itself
    would make a view of the base's dtype, and sizes, strides and offset in the view's element size
    would be read in the base's. Complex <-> real goes through view_as_real/view_as_complex, which
    are differentiable; other retypes have no gradient in eager either."""
    elements = real_base.untyped_storage().nbytes() // real_base.element_size()
    flat = base.as_strided((elements,), (1,), 0)
    if flat.is_complex() and not dtype.is_complex and flat.dtype.to_real() == dtype:
        return torch.view_as_real(flat).view(-1)
    if dtype.is_complex and not flat.is_complex() and dtype.to_real() == flat.dtype and elements % 2 == 0:
        return torch.view_as_complex(flat.view(-1, 2))
    return flat.view(dtype)


def _meta_like(mode: "FakeTensorMode", t: torch.Tensor, source: str | None,
               dims: tuple[int, ...]) -> torch.Tensor:
    """A meta tensor with t's metadata; dims in `dims` get size symbols."""
    sizes: list[Any] = list(t.size())
    strides: list[Any] = list(t.stride())
    if dims:
        for d in dims:
            sizes[d] = mode.shape_env.create_symbol(sizes[d], f"{source}.size()[{d}]")
        strides = symbolic_strides(sizes, t.size(), t.stride(),
                                   fresh=lambda d, hint: mode.shape_env.create_symbol(hint, f"{source}.stride()[{d}]"))
    offset = t.storage_offset()
    nbytes = t.untyped_storage().nbytes()
    # Plain meta tensors, even when a FakeTensorMode is active (capture converts inputs inside it).
    with torch.no_grad(), torch._C._DisableTorchDispatch():
        if dims or (offset == 0 and nbytes == _min_nbytes(t)):
            meta = torch.empty_strided(sizes, strides, dtype=t.dtype, device=_META)
            if offset == 0:
                return meta
            # Symbolic sizes and an offset into the storage: the offset stays (as_strided and
            # storage_offset() read it; capture guards it where they do), over a storage that
            # reaches just past the tensor.
            elements = meta.untyped_storage().nbytes() // t.element_size()
            storage = torch.empty((offset + elements,), dtype=t.dtype, device=_META).untyped_storage()
            meta = torch.empty(0, dtype=t.dtype, device=_META)
            meta.set_(storage, offset, sizes, strides)
            return meta
        # A storage larger than the tensor, or an offset into it: keep both, as .set_ does for real.
        storage = torch.UntypedStorage(nbytes, device=_META)
        meta = torch.empty(0, dtype=t.dtype, device=_META)
        meta.set_(storage, offset, sizes, strides)
        return meta


def _min_nbytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.size(), t.stride()))
    return (last + 1) * t.element_size()


def symbolic_strides(sym_sizes: Sequence[Any], sizes: Sequence[int], strides: Sequence[int],
                     fresh: Callable[[int, int], Any] | None = None) -> list[Any]:
    """Strides over symbolic sizes that keep the real layout (contiguous, transposed, channels-last).

    Walking dims from the smallest stride up, while each stride equals the product of the sizes
    of the dims below it the tensor is dense there, and the stride becomes that product of
    *symbolic* sizes. A broadcast dim (stride 0) is stepped over, so an expanded (1, n, m) input
    keeps its row stride m symbolic (as an integer, comparing it with m specialized m). From the
    first stride that breaks the chain (a gap: padded rows, a column slice) on, how a stride
    relates to the sizes is not known: one laid out outside a symbolic size gets a symbol of its
    own from `fresh(dim, stride)` (its size guards check it), since as the captured integer,
    comparing it with a product of sizes (flatten's contiguity test) specialized those sizes; the
    others stay the concrete integers. guards/kinds._static_strides makes the same walk.
    """
    order = sorted(range(len(sizes)), key=lambda d: (strides[d], -d))
    out: list[Any] = list(strides)
    dense_real, dense_sym = 1, 1
    chain, outside_symbolic = True, False
    for d in order:
        if strides[d] == 0:  # a broadcast dim stays 0; the chain goes on past it
            continue
        if chain and strides[d] == dense_real:
            out[d] = dense_sym
            dense_real *= sizes[d]
            dense_sym = dense_sym * sym_sizes[d]
        else:
            chain = False
            if fresh is not None and outside_symbolic and strides[d] >= 2:
                out[d] = fresh(d, strides[d])
        outside_symbolic = outside_symbolic or not isinstance(sym_sizes[d], int)
    return out
