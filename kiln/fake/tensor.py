"""FakeTensor: a torch.Tensor with sizes, strides, dtype and a device, but no data.

Every tensor that capture and AOT autograd trace is one of these. A FakeTensor shares its
TensorImpl with a meta tensor (so sizes, strides, storage offset and aliasing are real C++
metadata and in-place metadata changes such as `t_()` stay in sync) and reports a fake device
("cpu", "cuda:0") on top of it. Every op on it is routed to its FakeTensorMode (kiln/fake/mode.py).
PyTorch counterpart: torch/_subclasses/fake_tensor.py (the FakeTensor class).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, NoReturn

import torch
from torch._library import simple_registry

from kiln.errors import DataDependentOutputError
from kiln.fake.devices import BUILT_DEVICE_TYPES

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

_META = torch.device("meta")
_PRIM_DEVICE = torch.ops.prim.device.default


class FakeTensor(torch.Tensor):
    """A tensor without storage: `.device` is the fake device, the TensorImpl is a meta tensor's."""

    fake_device: torch.device
    fake_mode: "FakeTensorMode"

    # Torch-function overrides would run once per op on top of __torch_dispatch__; the subclass
    # only needs the dispatch level, so it opts out like torch's own wrapper subclasses.
    # torch's stubs type the C function as a plain function, not the classmethod protocol
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, mode: "FakeTensorMode", elem: torch.Tensor, device: torch.device,
                requires_grad: bool = False) -> "FakeTensor":
        # dispatch_device=True makes C++ ask Python (prim.device) for the device, which the mode
        # answers with the fake device; device_for_backend_keys makes the dispatch keys those of
        # that device (CPU, CUDA) so autocast and backend-specific composites behave as for real.
        if device.type in BUILT_DEVICE_TYPES:
            self = torch.Tensor._make_subclass(
                cls, elem, requires_grad, dispatch_device=True, device_for_backend_keys=device
            )
        else:
            # A device this build of torch lacks (cuda on a CPU-only build): C++ must never see
            # it, since any DeviceGuard or autograd InputMetadata for it aborts the process. C++
            # keeps seeing meta; only Python's `.device` reports the fake device.
            self = torch.Tensor._make_subclass(cls, elem, requires_grad)
        self.fake_device = device
        self.fake_mode = mode
        return self

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        # Python meta kernels (torch._refs, _meta_registrations) read `.device` while the kernel
        # runs; they must see meta there, and the fake device everywhere else.
        if self.fake_mode.in_kernel:
            return _META
        return self.fake_device

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return self.fake_device.type == "cuda"

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return self.fake_device.type == "cpu"

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        return self.fake_device.type == "meta"

    def get_device(self) -> int:  # type: ignore[override]
        return -1 if self.fake_device.type == "cpu" else (self.fake_device.index or 0)

    # torch.Tensor declares __torch_dispatch__ as its disabled C stub, whose type lacks `func`
    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),  # type: ignore[override]
                           kwargs: dict | None = None) -> Any:
        # Only reached when the tensor's mode is not the active one (a fake used outside its
        # `with` block); with the mode active, the mode's __torch_dispatch__ runs first.
        if func is _PRIM_DEVICE:  # C++ asks for the device of a fake many times per op
            t = args[0]
            return _META if t.fake_mode.in_kernel else t.fake_device
        mode = mode_of(_iter_tensors(args, kwargs))
        if mode is None:
            return NotImplemented
        return mode.dispatch(func, types, args, kwargs or {})

    # The C++ bindings of these read the data pointer directly, without a dispatcher op that the
    # mode could intercept, so they are refused here with the same error as `.item()`.
    def tolist(self) -> NoReturn:  # type: ignore[override]
        raise DataDependentOutputError("aten.tolist", "Tensor.tolist() needs the tensor's data, "
                                       "which a fake tensor does not have")

    def numpy(self, *args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[override]
        raise DataDependentOutputError("Tensor.numpy", "Tensor.numpy() needs the tensor's data, "
                                       "which a fake tensor does not have")

    def __array__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise DataDependentOutputError("Tensor.__array__", "converting a fake tensor to a numpy "
                                       "array needs its data, which it does not have")

    # the signature is torch.Tensor's; mypy misreads the untyped keyword-only parameter there
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        shape = tuple(self.shape)
        extra = "" if not self.requires_grad else ", requires_grad=True"
        return f"FakeTensor(size={shape}, dtype={self.dtype}, device='{self.fake_device}'{extra})"

    # Tensors are pickled/deep-copied with their data; a fake has none, so copying makes another
    # fake with the same metadata in the same mode.
    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        if id(self) in memo:
            return memo[id(self)]
        with self.fake_mode:
            out = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.fake_device)
        if getattr(self, "_is_param", False):
            out = torch.nn.Parameter(out, requires_grad=self.requires_grad)
        else:
            out.requires_grad_(self.requires_grad)
        memo[id(self)] = out
        return out


def _device_rule(cls: type, func: Any, types: Any, args: tuple, kwargs: dict | None = None) -> torch.device:
    """FakeTensor's answer to `prim.device`, as a torch_dispatch rule (the same answer as its
    __torch_dispatch__ gives)."""
    t = args[0]
    return _META if t.fake_mode.in_kernel else t.fake_device


# C++ asks a fake for its device (dispatch_device=True) through the tensor's own __torch_dispatch__
# whenever no mode is active, which is the case inside every meta kernel (`x.to(dtype)` in a Python
# decomposition). Before calling a subclass's __torch_dispatch__, torch's C++ checks whether the
# tensor is a DTensor, and that check imports torch.distributed.tensor (about 0.4 s, a third of a
# static first call's imports). A rule registered for (op, class) is looked up first and, when it
# answers, ends the dispatch before that check. The registry is keyed by the exact class.
# torch.library refuses registrations in the reserved `prim` namespace, hence the registry itself
# (kiln.fake.impls reads fake impls from it too).
simple_registry.singleton.find(_PRIM_DEVICE.__qualname__).torch_dispatch_rules.register(FakeTensor, _device_rule)


def is_fake(x: object) -> bool:
    """Whether `x` is a FakeTensor (an nn.Parameter made from a fake counts too)."""
    return isinstance(x, FakeTensor)


def mode_of(tensors: Iterable[object]) -> "FakeTensorMode | None":
    """The FakeTensorMode of the fake tensors among `tensors`, or None if there is none.

    Fakes of two different modes in one op are a bug of the caller (each capture has its own mode).
    """
    found = None
    for t in tensors:
        if isinstance(t, FakeTensor):
            if found is None:
                found = t.fake_mode
            elif t.fake_mode is not found:
                raise RuntimeError("fake tensors from two different FakeTensorModes were mixed in one op")
    return found


def _iter_tensors(args: tuple, kwargs: dict | None) -> Iterable[object]:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, (list, tuple)):
                yield from a
            else:
                yield a
