"""The Python bindings that act before the dispatcher, where FakeTensorMode cannot see them.

A few of torch's C++ bindings do work on their arguments before any ATen op is dispatched: they
build a DeviceGuard for a `device=` argument (torch.tensor, Tensor.cuda, Tensor.to), or read a
tensor argument's data directly (tensor_split with a tensor of indices, .tolist()). On fakes the
first aborts on a build without that device and the second fails with a storage error. This
TorchFunctionMode, pushed with every FakeTensorMode, reroutes the first through one `_to_copy` op
and turns the second into DataDependentOutputError naming the function.
PyTorch counterpart: none (torch's FakeTensorMode relies on a CUDA build, and on constants).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from kiln.errors import DataDependentOutputError
from kiln.fake import devices

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

# RuntimeError texts of C++ code that reached for the data of a tensor whose storage is meta.
_DATA_READ_ERRORS = (
    "data is not allocated yet",
    "Cannot access data pointer",
    "cannot be called on meta tensors",
    "Cannot copy out of meta tensor",
)
_NOT_LINKED = "is not linked with support for"

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
    if not devices.is_missing(device):
        return func(*args, **kwargs)
    requires_grad = kwargs.pop("requires_grad", False)
    cpu = func(*args, **dict(kwargs, device="cpu"))
    with torch.no_grad():
        out = devices.to_device(mode, cpu, device)
    return out.requires_grad_(True) if requires_grad else out


@_handles(torch.Tensor.cuda)
def _tensor_cuda(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    device = args[1] if len(args) > 1 else kwargs.get("device")
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if not devices.is_missing(device):
        return func(*args, **kwargs)
    return devices.to_device(mode, args[0], device, memory_format=kwargs.get("memory_format"))


@_handles(torch.Tensor.to)
def _tensor_to(mode: "FakeTensorMode", func: Any, args: tuple, kwargs: dict) -> Any:
    target = kwargs.get("device")
    if target is None and len(args) > 1:
        first = args[1]
        if isinstance(first, torch.Tensor):
            target = first.device
        elif isinstance(first, (str, torch.device)) or (isinstance(first, int) and not isinstance(first, bool)):
            target = first
    if not devices.is_missing(target):
        return func(*args, **kwargs)
    # to(device=None, dtype=None, non_blocking=False, copy=False, *, memory_format): trailing
    # positional bools are non_blocking and copy, which _parse_to does not take.
    positional = [a for a in args[1:] if not isinstance(a, bool)]
    flags = [a for a in args[1:] if isinstance(a, bool)]
    copy = kwargs.pop("copy", flags[1] if len(flags) > 1 else False)
    if positional and isinstance(positional[0], torch.Tensor):
        device, dtype, memory_format = positional[0].device, positional[0].dtype, kwargs.get("memory_format")
    else:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*positional, **kwargs)
    return devices.to_device(mode, args[0], device, dtype, memory_format, copy)


class BindingShim(TorchFunctionMode):
    """Reroutes device-guarding bindings and names the function when a binding reads fake data."""

    def __init__(self, mode: "FakeTensorMode") -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func) if devices.MISSING_CUDA else None
        try:
            if handler is not None:
                return handler(self.mode, func, args, dict(kwargs))
            return func(*args, **kwargs)
        except RuntimeError as e:
            message = str(e)
            if _NOT_LINKED in message:
                raise RuntimeError(f"{devices.explain_missing('cuda')} (in {_name(func)})") from None
            if any(text in message for text in _DATA_READ_ERRORS):
                name = _name(func)
                raise DataDependentOutputError(
                    name, f"{name} reads the data of a fake tensor, which it does not have") from e
            raise


def _name(func: Any) -> str:
    """How the user spelled the function: torch.tensor_split, Tensor.tolist, torch.nn.functional.pad."""
    name = getattr(func, "__name__", None) or str(func)
    qualname = getattr(func, "__qualname__", name)
    if qualname.startswith(("_TensorBase.", "TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None)
    if module is None or qualname.startswith("_VariableFunctions") or module == "torch.functional":
        return f"torch.{name}"
    return f"{module}.{qualname}"
