"""Shared by every test: in-process tests capture each frame themselves.

Entries stored on disk by an earlier run (kiln.capture.persist) would otherwise answer their calls
and change what the `compiles`/`frames` counters and the capture logs show. tests/capture/test_persist.py
turns the persistent cache on explicitly in the subprocesses it starts.
"""
import os

import pytest
import torch

# Triton decides at import whether it interprets kernels (TRITON_INTERPRET=1), and torch's test
# helpers may import it early: without a GPU the interpreter is the only Triton there is, so the
# triton-marked tests (kiln.config.cpu_backend = "triton") need it set before anything else runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kiln  # noqa: E402


@pytest.fixture(autouse=True)
def _no_persistent_frame_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.config, "persistent_cache", False)
