"""Shared by every test: in-process tests capture each frame themselves.

Entries stored on disk by an earlier run (kiln.capture.persist) would otherwise answer their calls
and change what the `compiles`/`frames` counters and the capture logs show. tests/capture/test_persist.py
turns the persistent cache on explicitly in the subprocesses it starts.
"""
import pytest

import kiln


@pytest.fixture(autouse=True)
def _no_persistent_frame_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.config, "persistent_cache", False)
