"""Fake devices: naming them, and faking "cuda" on a build of torch that has no CUDA.

A FakeTensor reports a device ("cpu", "cuda:0") that its storage is not on. For device types the
build supports, C++ is told the fake device too (design B of notes/recipes.md). For one it lacks,
C++ must never see it: a CUDA DeviceGuard or autograd InputMetadata for it raises or aborts. So
C++ sees meta, Python's `.device` reports the fake device, and the few Python bindings that build a
DeviceGuard from a device *argument* are rerouted by kiln/fake/bindings.py through `to_device`.
PyTorch counterpart: none (upstream needs a CUDA build for fake CUDA tensors).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

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
