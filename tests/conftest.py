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


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`@pytest.mark.ci_slice({"shape,dim": ((5, 7), -1), "dtype": torch.float32})` on a sweep: a
    case whose parameters differ from these base values on more than one axis (a key: one argument,
    or several parametrized together) is marked slow. `make test` runs the fixed star around the
    base case (every dtype at the base shape, every shape at the base dtype, ...); `-m slow` the
    rest of the product. Arguments not named are not thinned: every value runs at each point."""
    for item in items:
        marker = item.get_closest_marker("ci_slice")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None:
            continue
        differ = 0
        for key, base in marker.args[0].items():
            names = [name.strip() for name in key.split(",")]
            got = tuple(callspec.params[name] for name in names)
            differ += got != (base if len(names) > 1 else (base,))
        if differ > 1:
            item.add_marker(pytest.mark.slow)
