"""kiln.capture: TorchDynamo's job. Symbolically run a frame's CPython bytecode, put every tensor
op into a torch.fx graph (over FakeTensors), and build the glue that runs the compiled graphs,
replays side effects and continues after graph breaks in resume functions.

Public surface: `capture_frame(fn, L, options, wrap_frame, *, policy=None) -> CaptureResult` (the
capture of one frame, used by the entry), `CaptureResult`. Contracts are in docs/seams.md ("Inside capture").
"""
from __future__ import annotations

from typing import Any

__all__ = ["CaptureResult", "capture_frame"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the entry and guards modules are imported by kiln.api at startup, and
    # the tracer pulls in kiln.fake and kiln.symbolic, which need not load until a first capture.
    if name in __all__:
        from kiln.capture import frame_capture

        return getattr(frame_capture, name)
    raise AttributeError(f"module 'kiln.capture' has no attribute {name!r}")
