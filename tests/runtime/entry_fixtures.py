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
    kiln.reset()
    yield
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
