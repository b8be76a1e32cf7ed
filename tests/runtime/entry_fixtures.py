"""Fixtures of the tests that drop the user's objects and watch the compiled entry let them go
(test_entry_keepalive.py, test_identity_guards_weak.py): a fresh Kiln around each test, the native
fast entry on and off, both backends, and whether a weak reference's object was freed."""
from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

import kiln
from kiln import config


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    """Also freezes what is alive before the test (gc.freeze): a full collection then walks only
    what the test made, not the worker's whole heap (a second or more each, late in the suite). A
    frozen object is never collected until the unfreeze, so whatever a test watches being freed
    must be made inside it, as every test here does."""
    kiln.reset()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        kiln.reset()


@pytest.fixture(params=[True, False], ids=["fast", "python"])
def fast_entry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(config, "fast_entry", request.param)
    return bool(request.param)


BACKENDS = pytest.mark.parametrize("backend", ["inductor", "eager"])


def dead(ref: weakref.ref) -> bool:
    """The object is freed once a collection ran (cycles included). One already freed needs none: a
    full collection of a test worker's heap takes a second or more, and the tests ask for many refs."""
    if ref() is None:
        return True
    gc.collect()
    return ref() is None
