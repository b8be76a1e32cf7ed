"""Fake devices: naming them, and faking "cuda" on a build of torch that has no CUDA.

A FakeTensor reports a device ("cpu", "cuda:0") that its storage is not on. For device types the
build supports, C++ is told the fake device too (design B of notes/recipes.md). For one it lacks,
C++ must never see it: a CUDA DeviceGuard or autograd InputMetadata for it raises or aborts. So
C++ sees meta, Python's `.device` reports the fake device, and the few Python bindings that build a
DeviceGuard from a device *argument* (torch.tensor(device=), .cuda(), .to()) are rerouted by
`MissingDeviceShim`, a TorchFunctionMode that FakeTensorMode pushes only on such builds.
PyTorch counterpart: none (upstream needs a CUDA build for fake CUDA tensors).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

BUILT_DEVICE_TYPES = frozenset(["cpu", "meta"] + (["cuda"] if torch.backends.cuda.is_built() else []))
_NOT_LINKED = "is not linked with support for"


def normalize_device(device: torch.device | str | int | None) -> torch.device:
    """The device a fake tensor reports: an index is always present for accelerators ('cuda:0').

    A CPU-only build has no current CUDA device to ask, so 'cuda' means 'cuda:0', as it does on
    a CUDA build where the user never called set_device.
    """
    if device is None:
        device = torch.get_default_device()
    if isinstance(device, int):
        device = torch.device("cuda", device)
    elif not isinstance(device, torch.device):
        device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "meta"):
        device = torch.device(device.type, 0)
    return device


def is_missing(device: Any) -> bool:
    """Whether `device` names a device type this build of torch was not built with."""
    if device is None:
        return False
    if isinstance(device, int):
        return "cuda" not in BUILT_DEVICE_TYPES
    dev_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    return dev_type not in BUILT_DEVICE_TYPES


def explain_missing(device_type: str) -> str:
    return (f"kiln.fake: this op needs a real {device_type} device guard, which this build of torch "
            f"(without {device_type}) cannot create even for fake tensors; use fake device 'cpu' here")


def to_device(mode: "FakeTensorMode", t: torch.Tensor, device: Any, dtype: torch.dtype | None = None,
              memory_format: torch.memory_format | None = None, copy: bool = False) -> torch.Tensor:
    """`t.to(device, dtype)` for a device C++ must not see: one `_to_copy` op, or `t` itself."""
    t = mode.from_real(t)
    device = normalize_device(device)
    dtype = t.dtype if dtype is None else dtype
    if (not copy and t.device == device and t.dtype == dtype
            and memory_format in (None, torch.preserve_format)):
        return t
    kwargs: dict[str, Any] = {"dtype": dtype, "device": device}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    return torch.ops.aten._to_copy.default(t, **kwargs)


# Each handler: (mode, func, args, kwargs) -> result; called only for the functions below.
_Handler = Callable[["FakeTensorMode", Any, tuple, dict], Any]
_HANDLERS: dict[Any, _Handler] = {}


def _handles(*funcs: Any) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        for f in funcs:
            _HANDLERS[f] = fn
        return fn
    return register


@_handles(torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)
def _tensor_from_data(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    device = kwargs.get("device")
    if not is_missing(device):
        return func(*args, **kwargs)
    requires_grad = kwargs.pop("requires_grad", False)
    cpu = func(*args, **dict(kwargs, device="cpu"))
    with torch.no_grad():
        out = to_device(mode, cpu, device)
    return out.requires_grad_(True) if requires_grad else out


@_handles(torch.Tensor.cuda)
def _tensor_cuda(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    device = args[1] if len(args) > 1 else kwargs.get("device")
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if not is_missing(device):
        return func(*args, **kwargs)
    return to_device(mode, args[0], device, memory_format=kwargs.get("memory_format"))


@_handles(torch.Tensor.to)
def _tensor_to(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    copy = kwargs.pop("copy", False)
    rest = dict(kwargs)
    # A tensor argument means "like this tensor"; _parse_to would ask C++ for its device.
    if len(args) > 1 and isinstance(args[1], torch.Tensor):
        device, dtype, memory_format = args[1].device, args[1].dtype, rest.get("memory_format")
    else:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **rest)
    if not is_missing(device):
        return func(*args, **kwargs, copy=copy) if copy else func(*args, **kwargs)
    return to_device(mode, args[0], device, dtype, memory_format, copy)


class MissingDeviceShim(TorchFunctionMode):
    """Reroutes the Python bindings that would build a DeviceGuard for a device torch lacks."""

    def __init__(self, mode: "FakeTensorMode") -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        try:
            if handler is not None:
                return handler(self.mode, func, args, dict(kwargs))
            return func(*args, **kwargs)
        except RuntimeError as e:
            message = str(e)
            if _NOT_LINKED in message:
                device_type = message.rsplit(" ", 2)[-2] if message.endswith("devices") else "cuda"
                raise RuntimeError(f"{explain_missing(device_type)} (in {_name(func)})") from None
            raise


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
