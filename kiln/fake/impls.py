"""The fake-impl table: how ops without a usable meta kernel run on fake tensors.

One entry per ATen overload, filled by `@register_fake_impl(aten.op.overload)` beside its rule:
data-dependent ops (nonzero, .item(), boolean masks, unique ...) raise DataDependentOutputError
or, with a ShapeEnv, return unbacked sizes; custom ops (torch.library) run their registered fake
impl. Each impl is called as `impl(mode, func, args, kwargs)` and returns fakes.
PyTorch counterpart: torch/_subclasses/fake_impls.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch._prims_common import suggest_memory_format

import kiln.config
from kiln.errors import DataDependentOutputError, MissingFakeImplError

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

aten = torch.ops.aten
_META = torch.device("meta")

FakeImpl = Callable[["FakeTensorMode", Any, tuple, dict], Any]
_TABLE: dict[Any, FakeImpl] = {}


def register_fake_impl(*ops: Any) -> Callable[[FakeImpl], FakeImpl]:
    """Decorator: `impl(mode, func, args, kwargs)` runs these ATen overloads on fake tensors."""
    def register(impl: FakeImpl) -> FakeImpl:
        for op in ops:
            if op in _TABLE:
                raise ValueError(f"{op} already has a fake impl: {_TABLE[op].__name__}")
            _TABLE[op] = impl
        return impl
    return register


def lookup(func: Any) -> FakeImpl | None:
    """The table's impl for an overload, or None (then the meta kernel runs)."""
    return _TABLE.get(func)


def _unbacked(mode: "FakeTensorMode", origin: str, *, size: bool) -> torch.SymInt:
    """A fresh unbacked symbol; `size=True` for lengths (known >= 0), False for an .item() value.

    Past the mode's `unbacked_limit` the op is refused instead (see FakeTensorMode.unbacked)."""
    if mode.unbacked_limit is not None and len(mode.unbacked) >= mode.unbacked_limit:
        raise DataDependentOutputError(
            origin, f"{origin} has an output that depends on the data of its inputs, and the code "
                    f"after it branches on that data-dependent size")
    symint = mode.shape_env.create_unbacked_symint(origin, size=size)
    mode.unbacked.append(symint.node.expr)
    return symint


# --------------------------------------------------------------------- data-dependent ops
def run_data_dependent(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """Ops tagged dynamic_output_shape / data_dependent_output with no entry of their own.

    Some of them only depend on data for some arguments (one_hot with num_classes=-1, lstsq
    with some drivers); their meta kernel answers when it can, and its refusal becomes ours.
    """
    try:
        return mode.run_kernel(func, args, kwargs)
    except (RuntimeError, NotImplementedError, MissingFakeImplError) as e:
        raise DataDependentOutputError(str(func)) from e


@register_fake_impl(aten._local_scalar_dense.default, aten.item.default)
def local_scalar_dense(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """`.item()`, `int(t)`, `bool(t)`: an unbacked int when asked to capture scalars, else a break."""
    t = args[0]
    if (mode.shape_env is not None and kiln.config.capture_scalar_outputs
            and not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool):
        return _unbacked(mode, f"{func}()", size=False)
    if mode.shape_env is not None and kiln.config.capture_scalar_outputs and t.dtype.is_floating_point:
        if mode.unbacked_limit is not None and len(mode.unbacked) >= mode.unbacked_limit:
            raise DataDependentOutputError(f"{func}", f"{func}() of a floating tensor, then branched on")
        symfloat = mode.shape_env.create_unbacked_symfloat(f"{func}()")
        mode.unbacked.append(symfloat.node.expr)
        return symfloat
    raise DataDependentOutputError(
        "aten._local_scalar_dense",
        "Tensor.item() (also int(t), float(t), bool(t) and `if t:`) needs the tensor's value, "
        "which a fake tensor does not have (aten._local_scalar_dense)")


@register_fake_impl(aten.size.default, aten.stride.default, aten.dim.default)
def layout_query(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A question about sizes or strides, answered from the fake's own metadata. Asked by C++
    (an in-place op on an unbind output under symbolic sizes), its kernel under the Python
    dispatcher would ask the fake again, without end."""
    t = args[0]
    if func is aten.size.default:
        return list(t.shape)
    if func is aten.stride.default:
        return list(t.stride())
    return t.dim()


@register_fake_impl(aten.nonzero.default)
def nonzero(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """An [u, ndim] index tensor: the count u of nonzeros is an unbacked symbol."""
    t = args[0]
    if mode.shape_env is None:
        raise DataDependentOutputError("aten.nonzero")
    u = _unbacked(mode, "aten.nonzero", size=True)
    # CPU's nonzero returns the [n, ndim] result column-major; keep that layout.
    with mode.kernel_invocation(symbolic=True):
        out = torch.empty_strided((u, t.dim()), (1, u), dtype=torch.long, device=_META)
    return mode.wrap(out, t.fake_device)


@register_fake_impl(aten.masked_select.default)
def masked_select(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A 1-d tensor of unbacked length (the number of True mask entries)."""
    t, mask = args[0], args[1]
    if mode.shape_env is None:
        raise DataDependentOutputError("aten.masked_select")
    u = _unbacked(mode, "aten.masked_select", size=True)
    with mode.kernel_invocation(symbolic=True):
        out = torch.empty((u,), dtype=t.dtype, device=_META)
    return mode.wrap(out, mode.output_device(func, (t, mask), {}))


@register_fake_impl(aten.index.Tensor)
def index_tensor(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """`x[idx]`: integer indices have a meta kernel; a boolean mask's result size is data."""
    indices = args[1]
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            raise DataDependentOutputError(
                "aten.index.Tensor", "indexing with a boolean mask (x[mask]) gives a result whose "
                "size depends on the mask's data, which a fake tensor does not have (aten.index.Tensor)")
    return mode.run_kernel(func, args, kwargs)


@register_fake_impl(aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
def index_put(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """`x[idx] = v`: ATen's meta kernel takes any `values` shape, but eager raises unless values
    broadcast to the indexing result; without this check the generated kernel would read values
    out of bounds. Symbolic sizes compared here become guards, so a later call whose values stop
    broadcasting re-traces and raises eager's error."""
    x = args[0]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    values = args[2] if len(args) > 2 else kwargs["values"]
    if all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in indices):
        result = _index_result_shape(x, list(indices))
        given = list(values.shape)  # (x[i] = v drops v's leading 1s before it gets here)
        fits = len(given) <= len(result) and all(
            _broadcasts(v, r) for v, r in zip(reversed(given), reversed(result)))
        if not fits:
            raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                               f"broadcast to indexing result of shape {list(result)}")
    return mode.run_kernel(func, args, kwargs)


def _broadcasts(v: Any, r: Any) -> bool:
    """Whether a values size `v` broadcasts to the indexing result's size `r`; guarded where the sizes
    are backed symbols. A size known only at run time (nonzero's count, in index's backward) cannot
    be guarded before the graph runs: the condition is recorded as a runtime assert (torch._check)."""
    try:
        return bool(v == 1 or v == r)
    except DataDependentOutputError:
        one, same = v == 1, v == r
        if one is True or same is True:
            return True
        torch._check(same if one is False else (one if same is False else one | same))
        return True


def _index_result_shape(x: Any, indices: list) -> list:
    """The shape of `x[indices]` for integer index tensors (None = a whole dim): the broadcast
    index shape replaces the indexed dims where they are adjacent, else leads."""
    indices = indices + [None] * (x.dim() - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        return list(x.shape)
    shape = list(torch.broadcast_shapes(*[indices[d].shape for d in dims]))
    rest = [x.shape[d] for d in range(x.dim()) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    start = dims[0] if adjacent else 0
    return rest[:start] + shape + rest[start:]


@register_fake_impl(aten._to_sparse.default, aten._to_sparse.sparse_dim, aten._to_sparse_csr.default,
                    aten._to_sparse_csc.default, aten._to_sparse_bsr.default, aten._to_sparse_bsc.default)
def to_sparse(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A sparse tensor stores only the nonzeros of a dense one: how many is data."""
    raise DataDependentOutputError(
        str(func), f"converting to a sparse layout stores the nonzero entries, whose number "
        f"depends on data a fake tensor does not have ({func})")


@register_fake_impl(aten.quantize_per_tensor.default, aten.quantize_per_tensor.tensor_qparams,
                    aten.quantize_per_tensor.tensors, aten.quantize_per_channel.default,
                    aten.quantize_per_tensor_dynamic.default, aten._make_per_tensor_quantized_tensor.default,
                    aten._make_per_channel_quantized_tensor.default)
def quantize(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """PyTorch's meta kernels for these return a float32 tensor, not a quantized one: refused, as a
    quantized tensor is not traced (the program runs it eagerly)."""
    raise MissingFakeImplError(str(func), "Its meta kernel returns a plain float tensor for a quantized result; "
                               "quantized tensors are not traced.")


@register_fake_impl(aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
                    aten._unique.default, aten.unique_dim_consecutive.default)
def unique(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    raise DataDependentOutputError(
        str(func), f"torch.unique's output size is the number of distinct values, which depends "
        f"on data a fake tensor does not have ({func})")


@register_fake_impl(aten.repeat_interleave.Tensor)
def repeat_interleave_tensor(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """With output_size given the meta kernel knows the size; without it the size is data."""
    if kwargs.get("output_size") is None:
        raise DataDependentOutputError(
            "aten.repeat_interleave.Tensor", "repeat_interleave with a tensor of repeats and no "
            "output_size has a data-dependent size; pass output_size= (aten.repeat_interleave.Tensor)")
    return mode.run_kernel(func, args, kwargs)


# --------------------------------------------------------------------------- custom ops
class _FakeImplCtx:
    """What `torch.library.get_ctx()` returns inside a custom op's fake impl run by Kiln."""

    def __init__(self, mode: "FakeTensorMode", op: str) -> None:
        self._mode = mode
        self._op = op

    def new_dynamic_size(self, *, min: int = 0, max: int | None = None) -> torch.SymInt:
        if self._mode.shape_env is None:
            raise DataDependentOutputError(
                self._op, f"the fake impl of {self._op} asks for a data-dependent size "
                "(ctx.new_dynamic_size()), which needs a FakeTensorMode with a shape_env")
        u = _unbacked(self._mode, self._op, size=True)
        if min > 0 or max is not None:
            # The op's author promises these bounds; the ShapeEnv records them as runtime facts.
            torch._check(u >= min)
            if max is not None:
                torch._check(u <= max)
        return u

    # Older spelling kept by torch.library for the same thing.
    create_unbacked_symint = new_dynamic_size


def run_custom_op(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A torch.library op: its registered fake impl, run under the mode, else a clear error."""
    from torch._library import fake_impl, simple_registry

    name = func._schema.name
    holder = simple_registry.singleton.find(name).fake_impl
    kernel = holder.kernel
    if kernel is None:
        missing = MissingFakeImplError(
            name, f"Register one with @torch.library.register_fake({name!r}) so that Kiln can "
                  "compute its output shapes without running it.")
        if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "Meta"):
            raise missing
        # An op registered with a plain Meta kernel (torch.library.impl(..., "Meta")); custom_op
        # also installs one that only raises "no fake impl registered", which means the same.
        try:
            return mode.run_kernel(func, args, kwargs)
        except RuntimeError as e:
            if "fake impl" in str(e) or "abstract impl" in str(e):
                raise missing from e
            raise
    with fake_impl.set_ctx_getter(lambda: _FakeImplCtx(mode, name)), mode:
        try:
            return kernel(*args, **kwargs)
        except RuntimeError as e:
            # torch.library.custom_op installs a placeholder fake impl that raises this.
            if "no fake impl registered" in str(e):
                raise MissingFakeImplError(
                    name, f"Register one with @torch.library.register_fake({name!r}) so that Kiln "
                          "can compute its output shapes without running it.") from e
            raise


# --------------------------------------------------------------------------- in-place casts
# ATen's name for a dtype in "result type Float can't be cast to the desired output type Long".
_SCALAR_TYPE_NAMES = {
    torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def _promotion_operand(x: Any) -> Any:
    """A value as type promotion sees it: symbolic numbers by their kind (the value is irrelevant)."""
    if isinstance(x, torch.SymBool):
        return True
    if isinstance(x, torch.SymInt):
        return 1
    if isinstance(x, torch.SymFloat):
        return 1.0
    return x


@register_fake_impl(aten.mul_.Tensor, aten.mul_.Scalar, aten.add_.Tensor, aten.add_.Scalar,
                    aten.sub_.Tensor, aten.sub_.Scalar, aten.addcmul_.default, aten.addcdiv_.default)
def inplace_result_cast(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """In-place arithmetic whose meta kernel writes any promoted type into `self` (an integer
    tensor's `mul_(1.5)`, a bool's `mul_(2)`, a float's `add_` of a complex): eager's kernel refuses
    a result type that cannot be cast to self's dtype, so the trace raises the same RuntimeError."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    self = args[0]
    operands = [_promotion_operand(a) for a in args[1:3] if isinstance(a, (torch.Tensor, bool, int, float, complex,
                                                                           torch.SymInt, torch.SymFloat, torch.SymBool))]
    value = kwargs.get("value", args[3] if len(args) > 3 else None)
    if value is not None and func in (aten.addcmul_.default, aten.addcdiv_.default):
        operands.append(_promotion_operand(value))
    if isinstance(self, torch.Tensor) and operands:
        _, result = elementwise_dtypes(self, *operands,
                                       type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        if not torch.can_cast(result, self.dtype):
            raise RuntimeError(f"result type {_SCALAR_TYPE_NAMES.get(result, result)} can't be cast to the "
                               f"desired output type {_SCALAR_TYPE_NAMES.get(self.dtype, self.dtype)}")
    return mode.run_kernel(func, args, kwargs)


# --------------------------------------------------------------------------- layouts
@register_fake_impl(aten.convolution.default)
def convolution(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """The meta kernel gets the shape right but always answers contiguous; CPU (mkldnn) and CUDA
    (cudnn) both return channels-last when the input or the weight is channels-last."""
    out = mode.run_kernel(func, args, kwargs)
    x, w = args[0], args[1]
    if out.dim() not in (4, 5):
        return out
    formats = {suggest_memory_format(x), suggest_memory_format(w)}
    fmt = torch.channels_last if out.dim() == 4 else torch.channels_last_3d
    if fmt not in formats:
        return out
    with mode.kernel_invocation(symbolic=out._has_symbolic_sizes_strides):
        meta = torch.empty(out.shape, dtype=out.dtype, device=_META, memory_format=fmt)
    return mode.wrap(meta, out.fake_device)


@register_fake_impl(aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
                   aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_functional.default,
                   aten._native_batch_norm_legit_no_training.default)
def native_batch_norm(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """What CPU's kernel returns, where the meta kernel (and the decomposition of the functional and
    no-training overloads) answers as CUDA does. Dtypes: the saved statistics in the input's dtype,
    or float32 where a parameter or running statistic is float32 and the input half or bfloat16
    (CPU's mixed-type path); the functional overload's running statistics in their own dtype (the
    meta answers float32 for all of them, so a bfloat16 BatchNorm's results would be read as float
    by the kernel after it). Sizes: empty saved statistics in eval mode, (C,) in the meta."""
    out, save_mean, save_invstd, *stats = mode.run_kernel(func, args, kwargs)
    if out.fake_device.type != "cpu":
        return (out, save_mean, save_invstd, *stats)
    names = [a.name for a in func._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    if func is aten._native_batch_norm_legit_no_training.default:
        training = False
    else:
        training = bound["training"]
    x = bound["input"]
    given = [bound.get(name) for name in ("weight", "bias", "running_mean", "running_var")]
    mixed = any(isinstance(t, torch.Tensor) and t.dtype != x.dtype for t in given)
    saved_dtype = torch.float32 if mixed and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    symbolic = save_mean._has_symbolic_sizes_strides

    def retyped(t: Any, dtype: torch.dtype, empty: bool) -> Any:
        if t.dtype == dtype and not empty:
            return t
        with mode.kernel_invocation(symbolic=symbolic and not empty):
            meta = torch.empty((0,) if empty else t.shape, dtype=dtype, device=_META)
        return mode.wrap(meta, out.fake_device)

    saved = [retyped(t, saved_dtype, not training) for t in (save_mean, save_invstd)]
    if func is aten._native_batch_norm_legit_functional.default:
        stats = [retyped(t, bound[name].dtype, False) for t, name in zip(stats, ("running_mean", "running_var"))]
    return (out, *saved, *stats)


@register_fake_impl(aten.native_group_norm.default, aten.native_layer_norm.default)
def native_norm_statistics(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """Group and layer norm's saved mean and rstd as CPU's kernels make them: float32 where the input
    is float16/bfloat16 and a weight or bias is float32 (the mixed-type path autocast takes with a
    model's float32 parameters), the input's dtype otherwise. The meta kernels each get one of the
    two cases wrong: group norm's answers the input's dtype always, layer norm's float32 always (a
    bfloat16 LayerNorm with bfloat16 parameters). native_group_norm_backward and
    native_layer_norm_backward check that dtype, so a wrong one made the compiled backward raise."""
    out, mean, rstd = mode.run_kernel(func, args, kwargs)
    names = [a.name for a in func._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    x = bound["input"]
    if out.fake_device.type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16):
        return out, mean, rstd
    params = [bound.get(name) for name in ("weight", "bias")]
    mixed = any(isinstance(t, torch.Tensor) and t.dtype != x.dtype for t in params)
    wanted = torch.float32 if mixed else x.dtype
    if mean.dtype == wanted and rstd.dtype == wanted:
        return out, mean, rstd
    with mode.kernel_invocation(symbolic=mean._has_symbolic_sizes_strides):
        metas = [torch.empty_strided(t.shape, t.stride(), dtype=wanted, device=_META) for t in (mean, rstd)]
    return (out, *(mode.wrap(m, out.fake_device) for m in metas))


@register_fake_impl(aten.native_group_norm_backward.default)
def native_group_norm_backward(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """The gradients' dtypes as CPU's kernel makes them: the input's gradient in the input's dtype,
    the weight's and bias's in the weight's (the input's if there is none), where the meta kernel
    (PyTorch's decomposition) answers float32 for a half input. Code after it reads the buffer
    in the dtype said here, so a wrong one is a wrong value, not an error."""
    grads = mode.run_kernel(func, args, kwargs)
    names = [a.name for a in func._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    x, weight = bound["input"], bound["weight"]
    if x.fake_device.type != "cpu":
        return grads
    wanted = (x.dtype, *(weight.dtype if isinstance(weight, torch.Tensor) else x.dtype,) * 2)
    fixed = []
    for grad, dtype in zip(grads, wanted):
        if grad is None or grad.dtype == dtype:
            fixed.append(grad)
            continue
        with mode.kernel_invocation(symbolic=grad._has_symbolic_sizes_strides):
            meta = torch.empty_strided(grad.shape, grad.stride(), dtype=dtype, device=_META)
        fixed.append(mode.wrap(meta, grad.fake_device))
    return tuple(fixed)


# --------------------------------------------------------------------------- no meta kernel
@register_fake_impl(aten.geqrf.default)
def geqrf(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """QR in LAPACK's packed form: `a` like the input but column-major per matrix, `tau` [*, min(m, n)]."""
    x = args[0]
    *batch, m, n = x.shape
    with mode.kernel_invocation(symbolic=x._has_symbolic_sizes_strides):
        strides, step = [1, m], m * n
        for size in reversed(batch):
            strides.insert(0, step)
            step = step * size
        a = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=_META)
        tau = torch.empty(*batch, min(m, n), dtype=x.dtype, device=_META)
    return mode.wrap(a, x.fake_device), mode.wrap(tau, x.fake_device)


@register_fake_impl(aten.multi_margin_loss_backward.default, aten.multilabel_margin_loss_backward.default)
def margin_loss_backward(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """The gradient of `self` (args[1]): its size and dtype, contiguous, as the CPU kernels allocate it."""
    x = args[1]
    with mode.kernel_invocation(symbolic=x._has_symbolic_sizes_strides):
        grad = torch.empty(x.shape, dtype=x.dtype, device=_META)
    return mode.wrap(grad, x.fake_device)


# Backward ops with no meta kernel whose gradient has the size and dtype of one input (the index
# into args) and the contiguous strides the CPU kernel allocates: without an impl a training step
# through them ran its whole frame eagerly (torch.compile's fake tensors run the real kernel instead).
_GRAD_LIKE_INPUT = {aten._ctc_loss_backward.default: 1, aten._ctc_loss_backward.Tensor: 1,
                    aten.fractional_max_pool3d_backward.default: 1, aten._masked_softmax_backward.default: 0}


@register_fake_impl(*_GRAD_LIKE_INPUT)
def grad_like_input(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A contiguous tensor of the size and dtype of the input _GRAD_LIKE_INPUT names."""
    x = args[_GRAD_LIKE_INPUT[func]]
    with mode.kernel_invocation(symbolic=x._has_symbolic_sizes_strides):
        grad = torch.empty(x.shape, dtype=x.dtype, device=_META)
    return mode.wrap(grad, x.fake_device)


@register_fake_impl(aten._masked_softmax.default)
def masked_softmax(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """softmax of the input where the mask is False: the input's size, dtype and layout (the CPU
    kernel allocates it empty_like the input)."""
    x = args[0]
    with mode.kernel_invocation(symbolic=x._has_symbolic_sizes_strides):
        out = torch.empty_like(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META))
    return mode.wrap(out, x.fake_device)


@register_fake_impl(aten.histogram.bin_ct, aten.histogram.bins_tensor)
def histogram(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """hist has one entry per bin, bin_edges one more; both in the input's dtype."""
    x = args[0]
    bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
    edges = bins.shape[0] if isinstance(bins, torch.Tensor) else bins + 1
    with mode.kernel_invocation(symbolic=False):
        hist = torch.empty((edges - 1,), dtype=x.dtype, device=_META)
        bin_edges = torch.empty((edges,), dtype=x.dtype, device=_META)
    return mode.wrap(hist, x.fake_device), mode.wrap(bin_edges, x.fake_device)


@register_fake_impl(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """One edges tensor per dimension of the samples' last axis, bins[d] + 1 long."""
    x, bins = args[0], args[1]
    with mode.kernel_invocation(symbolic=False):
        edges = [torch.empty((b + 1,), dtype=x.dtype, device=_META) for b in bins]
    return [mode.wrap(e, x.fake_device) for e in edges]


@register_fake_impl(aten._histogramdd_from_bin_cts.default, aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bins(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    x, bins = args[0], args[1]
    shape = [b.shape[0] - 1 if isinstance(b, torch.Tensor) else b for b in bins]
    with mode.kernel_invocation(symbolic=False):
        hist = torch.empty(shape, dtype=x.dtype, device=_META)
    return mode.wrap(hist, x.fake_device)


@register_fake_impl(aten.max_unpool2d.default)
def max_unpool2d(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """CPU's kernel gives the output the input's suggested memory format; the meta kernel does not."""
    out = mode.run_kernel(func, args, kwargs)
    fmt = suggest_memory_format(args[0])
    if out.fake_device.type != "cpu" or fmt != torch.channels_last or out.dim() != 4:
        return out
    with mode.kernel_invocation(symbolic=out._has_symbolic_sizes_strides):
        meta = torch.empty(out.shape, dtype=out.dtype, device=_META, memory_format=fmt)
    return mode.wrap(meta, out.fake_device)


# --------------------------------------------------------------------------- sparse
@register_fake_impl(aten.sparse_sampled_addmm.default)
def sparse_sampled_addmm(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """The result keeps self's CSR sparsity pattern: the same indices, fresh values."""
    s = args[0]
    with mode.kernel_invocation(symbolic=False):
        out = torch.sparse_compressed_tensor(
            s.crow_indices(), s.col_indices(), torch.empty_like(s.values()), s.shape,
            layout=torch.sparse_csr, check_invariants=False)
    return mode.wrap(out, s.fake_device)


@register_fake_impl(aten._sparse_mm_reduce_impl.default)
def sparse_mm_reduce(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """A dense [M, N] result; the argmax/argmin indices are kept only when a backward needs them."""
    s, other, reduce = args[0], args[1], args[2]
    needs_arg = reduce in ("max", "min", "amax", "amin") and (s.requires_grad or other.requires_grad)
    with mode.kernel_invocation(symbolic=False):
        out = torch.empty((s.shape[0], other.shape[1]), dtype=other.dtype, device=_META)
        arg_out = torch.empty(out.shape if needs_arg else (0,), dtype=torch.long, device=_META)
    return mode.wrap(out, s.fake_device), mode.wrap(arg_out, s.fake_device)


# --------------------------------------------------------------------------- foreach ops
def _foreach_tensor_scalar_overloads() -> list[tuple[Any, Any, int]]:
    """(overload, its `.Scalar` sibling, position of the scalar) for each foreach overload that
    takes its scalar (or one scalar per list element) as a tensor: `_foreach_add_.Tensor`,
    `_foreach_addcdiv_.Tensor`, ... (what torch.optim passes under compilation)."""
    found = []
    # torch.ops.aten loads its packets lazily (dir() lists only those used so far); torch's own
    # namespace holds every foreach function under the op's name
    for name in dir(torch):
        if not name.startswith("_foreach_"):
            continue
        packet = getattr(aten, name)
        if "Tensor" not in packet.overloads() or "Scalar" not in packet.overloads():
            continue
        overload = packet.Tensor
        for index, argument in enumerate(overload._schema.arguments):
            if argument.type.isSubtypeOf(torch._C.TensorType.get()):
                found.append((overload, packet.Scalar, index))
                break
    return found


_FOREACH_TENSOR_SCALAR = {op: (scalar_op, index) for op, scalar_op, index in _foreach_tensor_scalar_overloads()}


@register_fake_impl(*_FOREACH_TENSOR_SCALAR)
def foreach_tensor_scalar(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    """Their meta kernels read the scalar tensor (`.item()`, or insist it lives on the CPU), which a
    fake cannot give; the outputs' metadata is the `.Scalar` overload's with any number there."""
    scalar_op, index = _FOREACH_TENSOR_SCALAR[func]
    rest = list(args[:index]) + [1.0]
    return mode.run_kernel(scalar_op, tuple(rest), {})
