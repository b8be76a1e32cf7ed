"""FakeTensorMode: the dispatch mode under which every op makes FakeTensors and runs no kernel.

Inside `with FakeTensorMode():` factory calls (which have no tensor argument for a subclass to
catch), module construction and every op on fakes reach `dispatch`, which picks the output
device, runs the op's meta kernel (or an entry of kiln/fake/impls.py, or a custom op's fake impl)
on meta storage and wraps the results as FakeTensors. Capture and AOT autograd trace under it.
PyTorch counterpart: torch/_subclasses/fake_tensor.py (FakeTensorMode.dispatch).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import Any, Callable, Iterator, Sequence

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from kiln import log
from kiln.errors import MissingFakeImplError
from kiln.fake import cache, convert, devices, impls
from kiln.fake.composites import eager_decomposition
from kiln.fake.devices import normalize_device
from kiln.fake.tensor import FakeTensor

aten = torch.ops.aten
_META = torch.device("meta")
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
_PRIM_DEVICE = torch.ops.prim.device.default
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
# Only a build missing a fake device type makes meta fakes out of C++ `self.options()`.
_META_LEAKS = devices.MISSING_CUDA
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

# Ops that legitimately take tensors on different devices; the output follows the first argument.
_MIXED_DEVICE_OPS = frozenset({
    aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
    aten._copy_from_and_resize.default, aten.index.Tensor, aten.index_put.default,
    aten.index_put_.default, aten._index_put_impl_.default, aten.lift_fresh_copy.default,
})

_PREIMPORTED = False


_REF_MODULES = ("torch._refs", "torch._prims", "torch._decomp")


def _answer_dynamo_disable(fn: Any, seen: set[int], depth: int = 0) -> None:
    """Pre-answer the `torch._disable_dynamo` wrappers found in `fn` and the functions it closes over.

    torch wraps many refs (and every TorchDispatchMode subclass's __torch_dispatch__) in
    `torch._disable_dynamo`, whose wrapper imports torch._dynamo (slow) on its first call only to
    tell Dynamo not to trace the function, caching the answer as the wrapped function's attribute
    `__dynamo_disable`. Kiln runs them as meta kernels, never under Dynamo, so the plain function
    is the right answer. A wrapper missed here still works: it pays the import. (Kiln's own modes
    opt out of the wrapper with `_should_skip_dynamo`.)
    """
    # Refs are a few wrappers deep and not every wrapper sets __wrapped__: follow closures.
    if type(fn) is not types.FunctionType or id(fn) in seen or depth > 8:
        return
    seen.add(id(fn))
    if fn.__code__ is _DISABLE_WRAPPER.__code__ and fn.__closure__ is not None:
        wrapped = fn.__closure__[_DISABLE_SLOT].cell_contents
        if getattr(wrapped, "__dynamo_disable", None) is None:
            setattr(wrapped, "__dynamo_disable", wrapped)
    for cell in fn.__closure__ or ():
        try:
            _answer_dynamo_disable(cell.cell_contents, seen, depth + 1)
        except ValueError:  # an empty cell
            pass


_DISABLE_WRAPPER = torch._disable_dynamo(lambda: None)
_DISABLE_SLOT = _DISABLE_WRAPPER.__code__.co_freevars.index("fn")


def _skip_lazy_dynamo_import() -> None:
    """Answer the wrappers of torch's refs, decompositions and top-level functions once."""
    seen: set[int] = set()
    for table in torch._decomp.global_decomposition_table.values():
        for fn in table.values():
            _answer_dynamo_disable(fn, seen)
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "torch" or name.startswith(_REF_MODULES)):
            for fn in list(vars(module).values()):
                _answer_dynamo_disable(fn, seen)


def _preimport() -> None:
    """Load torch's Python meta kernels and decompositions once (a slow first touch)."""
    global _PREIMPORTED
    if _PREIMPORTED:
        return
    import torch._decomp  # noqa: F401
    import torch._meta_registrations as meta_registrations
    import torch._refs  # noqa: F401

    # Python meta kernels ask `device_hint(t)` whether a meta tensor stands for a CPU or CUDA
    # tensor (conv memory format, fft, linalg); it only recognises torch's own fake class and
    # otherwise guesses "cuda". Teach it ours, leaving its answer for everything else unchanged.
    original = meta_registrations.device_hint

    def device_hint(tensor: Any) -> str:
        if isinstance(tensor, FakeTensor):
            return tensor.fake_device.type
        return original(tensor)

    meta_registrations.device_hint = device_hint
    _skip_lazy_dynamo_import()
    _PREIMPORTED = True


@contextlib.contextmanager
def caller_saved_tensor_hooks_suspended() -> Iterator[None]:
    """The caller's `saved_tensors_hooks` left out of a trace on fakes (capture's, AOT autograd's):
    they run on the real tensors the compiled graph's autograd node saves, each call. Run on the
    fakes, their pack function ran its side effects at compile time and AOT autograd recorded it
    into the graph for every later call, with the hooks or without them."""
    suspended = []
    while (top := torch._C._autograd._top_saved_tensors_default_hooks(True)) is not None:
        suspended.append(top)
        torch._C._autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(suspended):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


class FakeTensorMode(TorchDispatchMode):
    """Makes every tensor created or computed inside it a FakeTensor of this mode.

    `shape_env` (a kiln.symbolic.ShapeEnv) enables symbolic sizes: dynamic dims of converted
    inputs and unbacked sizes of data-dependent ops (nonzero, .item() with
    config.capture_scalar_outputs, custom ops calling ctx.new_dynamic_size()).
    """

    def __init__(self, shape_env: Any = None) -> None:
        super().__init__()
        # Registering as the FAKE infra mode makes C++ skip torch.cuda's lazy init for
        # `device="cuda"` factories (there is no driver to init on a CPU-only build) and keeps
        # this mode below any tracing mode pushed later, as torch's own fake mode is.
        self._mode_key = _FAKE_KEY
        self.shape_env = shape_env
        self.in_kernel = False
        # The unbacked symbols this mode's data-dependent ops made, in order. Capture sets
        # `unbacked_limit` to n when a branch on the n-th one cannot be decided: that op then
        # raises DataDependentOutputError instead, a graph break at the op (torch.compile's default).
        self.unbacked: list[Any] = []
        self.unbacked_limit: int | None = None
        self._real_to_fake: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._strategy: dict[Any, Callable[..., Any]] = {}
        # How many ops that draw from a generator (their nondeterministic_seeded tag) this mode has
        # run: capture compares it around a call to learn whether the call draws (dropout in train
        # mode does, in eval mode it does not) and keeps such a call even when nothing reads it.
        self.seeded_calls = 0
        # One entry per __enter__: the shim pushed with it and the fake mode it displaced, or
        # None when the mode was already the active one (re-entering is then a no-op).
        self._entered: list[tuple[devices.BindingShim, Any] | None] = []
        _preimport()

    def __enter__(self) -> "FakeTensorMode":
        # The FAKE slot holds one mode: entering the active mode again is a no-op, and entering
        # another one displaces it until exit (capture inside a fake-mode region, nested traces).
        current = torch._C._get_dispatch_mode(_FAKE_KEY)
        if current is self:
            self._entered.append(None)
            return self
        if current is not None:
            torch._C._unset_dispatch_mode(_FAKE_KEY)
        shim = devices.BindingShim(self)
        shim.__enter__()
        self._entered.append((shim, current))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        entry = self._entered.pop()
        if entry is None:
            return
        shim, displaced = entry
        try:
            super().__exit__(*exc)
        finally:
            shim.__exit__(*exc)
            if displaced is not None:
                torch._C._set_dispatch_mode(displaced)

    def __repr__(self) -> str:
        return f"FakeTensorMode(shape_env={self.shape_env!r})"

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable, which
        # imports Dynamo (slow) and costs a frame-hook swap on every op. Kiln is not Dynamo.
        return False

    # ----------------------------------------------------------------------------- conversion
    def from_real(self, t: torch.Tensor, *, source: str | None = None,
                  dynamic_dims: Sequence[int] = ()) -> FakeTensor:
        """A fake with `t`'s sizes, strides, offset, dtype, device and requires_grad (memoized)."""
        return convert.from_real(self, t, source=source, dynamic_dims=dynamic_dims)

    def forget_real_tensors(self) -> None:
        """Drop the memo of real tensors converted (its weak references). A capture calls this when it
        ends: the fakes live on in the graph it kept, and a weak reference left on a user's tensor
        makes torch.utils.swap_tensors refuse it (nn.Module.to with swapping on, or a direct swap)."""
        self._real_to_fake = WeakIdKeyDictionary()

    def wrap(self, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        """Make a meta tensor (a kernel's output) a FakeTensor on `device`."""
        return FakeTensor(self, elem, device)

    # ------------------------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.dispatch(func, types, args, kwargs or {})

    def dispatch(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """Run one ATen op on fake (or real, converted) inputs; returns fakes."""
        if func is _PRIM_DEVICE:
            return _META if self.in_kernel else args[0].fake_device
        for ty in types:
            # Another tensor subclass (a user wrapper) gets to unwrap itself first.
            if ty is not FakeTensor and ty not in _PLAIN_TYPES and not issubclass(ty, FakeTensor):
                return NotImplemented
        args, kwargs = self._fakeify_inputs(args, kwargs)
        strategy = self._strategy.get(func)
        if strategy is None:
            strategy = self._strategy[func] = self._pick_strategy(func)
        return strategy(self, func, args, kwargs)

    def _pick_strategy(self, func: Any) -> Callable[..., Any]:
        """How `func` is run, decided once per overload (the per-op fast path); an op that draws
        from a generator is counted in `seeded_calls` each time it runs."""
        strategy = self._plain_strategy(func)
        if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
            return strategy

        def counted(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
            mode.seeded_calls += 1
            return strategy(mode, func, args, kwargs)
        return counted

    def _plain_strategy(self, func: Any) -> Callable[..., Any]:
        impl = impls.lookup(func)
        if impl is not None:
            return impl
        if func.namespace not in ("aten", "prim", "prims", "_c10d_functional", "debugprims", "quantized"):
            return impls.run_custom_op
        if torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags:
            return impls.run_data_dependent
        return run_meta

    def _fakeify_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Real tensors mixed into an op (module buffers, torch.tensor data) become fakes."""
        if not _has_foreign_tensor(args, self) and not _has_foreign_tensor(kwargs.values(), self):
            return args, kwargs
        return (tuple(_map_one_level(self._own, args)),
                dict(zip(kwargs.keys(), _map_one_level(self._own, kwargs.values()))))

    def _own(self, x: Any) -> Any:
        if isinstance(x, FakeTensor):
            if x.fake_mode is not self:
                raise RuntimeError("a fake tensor of another FakeTensorMode was used under this one; "
                                   "convert real tensors with this mode's from_real instead")
            return x
        if isinstance(x, torch.Tensor):
            return self.from_real(x)
        return x

    # --------------------------------------------------------------------------- kernels
    def run_kernel(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The default path of an op (for impls that adjust its result): its meta kernel, from the
        op cache when possible, or its decomposition where it has no meta kernel."""
        return run_meta(self, func, args, kwargs)

    def kernel_invocation(self, symbolic: bool) -> "_KernelInvocation":
        """Run meta kernels directly: Python key off, Meta forced, `.device` reads meta."""
        return _KernelInvocation(self, symbolic)

    def output_device(self, func: Any, args: tuple, kwargs: dict) -> torch.device:
        """The fake device of the op's outputs: the device argument, else the inputs' common one."""
        if "device" in kwargs and kwargs["device"] is not None:
            return normalize_device(kwargs["device"])
        common: torch.device | None = None
        common_rank = 0
        for t in _flat_tensors(args, kwargs):
            if not isinstance(t, FakeTensor):
                continue
            dev = t.fake_device
            # A 0-dim CPU tensor mixes with any device, as a Python scalar does. A meta fake is
            # what C++ composites make from `self.options()` of a fake on a device this build
            # lacks (C++ sees those as meta): it takes the device of the tensors it meets.
            rank = 1 if (dev.type == "cpu" and t.dim() == 0) else 0 if (dev.type == "meta" and _META_LEAKS) else 2
            if common is None or rank > common_rank:
                common, common_rank = dev, rank
            elif dev != common and rank == 2 and func not in _MIXED_DEVICE_OPS:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"{common} and {dev}! (in {func})")
        if common is None:
            return normalize_device(kwargs.get("device"))
        return common

    def wrap_outputs(self, out: Any, device: torch.device) -> Any:
        """Wrap a kernel's meta outputs; outputs that are inputs (in-place, out=) stay as they are."""
        if isinstance(out, torch.Tensor):
            return out if isinstance(out, FakeTensor) else FakeTensor(self, out, device)
        if isinstance(out, (tuple, list)):
            return type(out)(self.wrap_outputs(o, device) for o in out)
        return out


class _KernelInvocation:
    """The context of FakeTensorMode.kernel_invocation; a class, not a generator, for speed."""

    __slots__ = ("mode", "symbolic", "prev", "no_python", "keys", "dispatcher")

    def __init__(self, mode: FakeTensorMode, symbolic: bool) -> None:
        self.mode = mode
        self.symbolic = symbolic

    def __enter__(self) -> None:
        self.prev = self.mode.in_kernel
        self.mode.in_kernel = True
        self.no_python = torch._C._DisableTorchDispatch()
        self.keys = torch._C._PreserveDispatchKeyGuard()
        self.no_python.__enter__()
        self.keys.__enter__()
        torch._C._set_meta_in_tls_dispatch_include(True)
        if self.symbolic:
            # Meta kernels written in C++ cannot take symbolic sizes; the Python dispatcher
            # routes to the Python meta kernels of torch._refs instead.
            self.dispatcher = enable_python_dispatcher()
            self.dispatcher.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.symbolic:
                self.dispatcher.__exit__(*exc)
            self.keys.__exit__(*exc)
            self.no_python.__exit__(*exc)
        finally:
            self.mode.in_kernel = self.prev


# ------------------------------------------------------------------------------ strategies
def run_meta(mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """The default: the op's meta kernel, or its decomposition where it has no meta kernel."""
    device = mode.output_device(func, args, kwargs)
    if "device" in kwargs:
        kwargs = dict(kwargs, device=_META)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
    positions = _device_positions(func)
    if positions:
        args = tuple(_META if i in positions and a is not None else a for i, a in enumerate(args))
    symbolic = mode.shape_env is not None and _involves_symbols(args, kwargs)
    if symbolic and _composite_only(func):
        # Reached whole only where autograd's keys are off (inference_mode). Its C++ kernel run on
        # meta calls C++ meta kernels that refuse symbolic sizes (cross_entropy, take_along_dim);
        # decomposed here, each sub-op comes back through the mode as it does in grad mode.
        with mode:
            return _run_composite(func, *args, **kwargs)
    key = None
    if not symbolic and cache.is_cacheable_op(func):
        key = cache.key_of(func, args, kwargs)
        if key is not None:
            entry = cache.lookup(key)
            if entry is not None:
                with mode.kernel_invocation(False):
                    out = cache.rebuild(entry)
                return mode.wrap_outputs(out, device)
    try:
        with mode.kernel_invocation(symbolic):
            out = func(*args, **kwargs)
    except NotImplementedError as e:
        if "Meta" not in str(e) and "meta" not in str(e):
            raise
        if "SparseMeta" in str(e) or "SparseCsrMeta" in str(e):
            raise MissingFakeImplError(str(func), "PyTorch has no meta kernel for it on sparse "
                                       "tensors, so it cannot run on fake sparse inputs.") from e
        return run_decomposed(mode, func, args, kwargs, cause=e)
    if key is not None:
        cache.store(key, out)
    return mode.wrap_outputs(out, device)


@functools.lru_cache(maxsize=None)
def _composite_only(func: Any) -> bool:
    """Whether `func` is a CompositeImplicitAutograd op with no Meta kernel of its own."""
    name = func.name()
    return (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
            and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"))


@functools.lru_cache(maxsize=None)
def _device_positions(func: Any) -> frozenset[int]:
    """The positions of `func`'s Device arguments, which the kernel must see as meta as a `device=`
    keyword is. Such a call reaches the mode with the device positional only where autograd's keys
    are off (inference_mode: `t.to(device, dtype)` as aten.to.device, not aten._to_copy(device=)).
    Left as cpu, a symbolic call's Python decomposition copies meta to cpu by calling `to` again,
    and again: a RecursionError that broke every recompile of `torch.tensor(x.size(-1))`."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return frozenset()
    return frozenset(i for i, arg in enumerate(schema.arguments)
                     if not arg.kwarg_only and str(arg.type) in ("Device", "Device?"))


def run_decomposed(mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict,
                   cause: Exception | None = None) -> Any:
    """Run `func` through its Python decomposition, each sub-op going through the mode again."""
    decomp = eager_decomposition(func) or torch._decomp.decomposition_table.get(func)
    if decomp is None and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        decomp = functools.partial(_run_composite, func)
    if decomp is None:
        raise MissingFakeImplError(
            str(func), f"It has no meta kernel and no decomposition; add a fake impl for it with "
            f"@register_fake_impl({func}) in kiln/fake/impls.py.") from cause
    log.debug("fake", lambda: f"{func}: no meta kernel, running its decomposition")
    if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "Meta"):
        # Only an op with no Meta kernel at all always takes this path; one whose kernel
        # refused these particular arguments keeps trying its kernel first.
        mode._strategy[func] = _decomposed_strategy(decomp)
    with mode:
        out = decomp(*args, **kwargs)
    if out is NotImplemented:
        raise MissingFakeImplError(str(func), "Its decomposition does not apply to these arguments.") from cause
    return out


def _run_composite(func: Any, *args: Any, **kwargs: Any) -> Any:
    """`func`'s C++ CompositeImplicitAutograd kernel. A composite op reaches the fake mode only where
    autograd's keys are off (inference_mode: `x.to(torch.bool)` as aten.to.device); its kernel is
    entered as a binding that a torch-function mode sees, and the device shim's mode would call the
    op again from the top, back into this mode: a recursion that ended with the process aborted.
    Torch-function handling is off while the kernel runs; its own sub-ops dispatch in C++ and come
    back through the mode as usual."""
    eager = eager_decomposition(func)
    with torch._C.DisableTorchFunction():
        return eager(*args, **kwargs) if eager is not None else func.decompose(*args, **kwargs)


def _decomposed_strategy(decomp: Callable[..., Any]) -> Callable[..., Any]:
    def run(mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
        with mode:
            return decomp(*args, **kwargs)
    return run


# ------------------------------------------------------------------------------ helpers
def _has_foreign_tensor(values: Any, mode: FakeTensorMode) -> bool:
    """Whether any tensor argument is not a fake of `mode` (a real tensor, another mode's fake)."""
    for a in values:
        if isinstance(a, torch.Tensor):
            if not isinstance(a, FakeTensor) or a.fake_mode is not mode:
                return True
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor) and (not isinstance(b, FakeTensor) or b.fake_mode is not mode):
                    return True
    return False


def _map_one_level(fn: Callable[[Any], Any], values: Any) -> list:
    # ATen schemas nest at most one level (Tensor[], Tensor?[]), so no general pytree is needed.
    out = []
    for a in values:
        if isinstance(a, (list, tuple)):
            out.append(type(a)(fn(b) for b in a))
        else:
            out.append(fn(a))
    return out


def _flat_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, torch.Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found.extend(b for b in a if isinstance(b, torch.Tensor))
    return found


def _involves_symbols(args: tuple, kwargs: dict) -> bool:
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, torch.Tensor):
                if a._has_symbolic_sizes_strides:
                    return True
            elif isinstance(a, _SYM_TYPES):
                return True
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, _SYM_TYPES) or (isinstance(b, torch.Tensor) and b._has_symbolic_sizes_strides):
                        return True
    return False
