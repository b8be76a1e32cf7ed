"""Fake devices, and the Python bindings that act before the dispatcher can see them.

On a device type the build lacks (cuda on a CPU-only build) C++ must never see the fake device: a
DeviceGuard or autograd InputMetadata for it aborts. C++ then sees meta and Python's `.device` the
fake device. `BindingShim`, a TorchFunctionMode pushed with every FakeTensorMode, reroutes the
bindings that guard a `device=` argument (torch.tensor, .cuda(), .to()) through one `_to_copy`, and
names the function when a binding reads a fake's data (DataDependentOutputError).
PyTorch counterpart: none (torch's FakeTensorMode relies on a CUDA build, and on constants)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from kiln.errors import DataDependentOutputError

if TYPE_CHECKING:
    from kiln.fake.mode import FakeTensorMode

BUILT_DEVICE_TYPES = frozenset(["cpu", "meta"] + (["cuda"] if torch.backends.cuda.is_built() else []))
MISSING_CUDA = "cuda" not in BUILT_DEVICE_TYPES


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


# RuntimeError texts of C++ code that reached for the data of a tensor whose storage is meta.
_DATA_READ_ERRORS = (
    "data is not allocated yet",
    "Cannot access data pointer",
    "cannot be called on meta tensors",
    "Cannot copy out of meta tensor",
)
# RuntimeError texts of C++ code that needed the CUDA runtime this build does not have.
_NO_CUDA_RUNTIME = ("is not linked with support for", "without ATen_cuda library")

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
    target = kwargs.get("device")
    if target is None and len(args) > 1:
        first = args[1]
        if isinstance(first, torch.Tensor):
            target = first.device
        elif isinstance(first, (str, torch.device)) or (isinstance(first, int) and not isinstance(first, bool)):
            target = first
    if not is_missing(target):
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
    return to_device(mode, args[0], device, dtype, memory_format, copy)


class BindingShim(TorchFunctionMode):
    """Reroutes device-guarding bindings and names the function when a binding reads fake data."""

    def __init__(self, mode: "FakeTensorMode") -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func) if MISSING_CUDA else None
        try:
            if handler is not None:
                return handler(self.mode, func, args, dict(kwargs))
            return func(*args, **kwargs)
        except RuntimeError as e:
            message = str(e)
            if any(text in message for text in _NO_CUDA_RUNTIME):
                raise RuntimeError(f"{explain_missing('cuda')} (in {_name(func)})") from None
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
