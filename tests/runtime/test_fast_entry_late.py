"""Frames whose cache filled before the boundary extension loaded take the native fast entry once it
loads (kiln.capture.fast_entry.retry_when_loaded): in a fresh cache the extension is built by the
tier-up thread after every frame's first calls, resume frames of graph breaks included, and those
frames kept the Python loop over their entries for good. The extension's late load is played here
by hiding it from native_entry, then handing the waiting frames the loaded module."""
from __future__ import annotations

import contextlib
import io
import weakref
from typing import Any, Callable, Iterator

import pytest
import torch

import kiln
from kiln.capture import fast_entry
from kiln.capture.entry import frames_of

pytestmark = pytest.mark.cpp


@pytest.fixture
def module() -> Iterator[Any]:
    from kiln.runtime import boundary

    module = boundary.built()
    if module is None or not hasattr(module, "frame_entry"):
        pytest.skip("the boundary extension is not built")
    kiln.reset()
    yield module
    kiln.reset()


@contextlib.contextmanager
def _not_loaded_yet(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[Any], None]]]:
    """native_entry sees no extension inside; what waits for it is collected instead of registered
    (and the list of waiting frames stays this test's own until the monkeypatch is undone)."""
    waiting: list[Callable[[Any], None]] = []
    native_checks = fast_entry.native_checks
    monkeypatch.setattr(fast_entry, "native_checks", lambda: None)
    monkeypatch.setattr(fast_entry, "when_native_loads", waiting.append, raising=False)
    monkeypatch.setattr(fast_entry, "_AWAITING", weakref.WeakKeyDictionary(), raising=False)
    monkeypatch.setattr(fast_entry, "_waiting", [False], raising=False)
    yield waiting
    monkeypatch.setattr(fast_entry, "native_checks", native_checks)


def _is_fast(compiled: Any) -> bool:
    return type(compiled.__globals__.get("_kiln_fast")).__name__ == "Entry" and compiled.__code__.co_name == "fast"


def _resumes(compiled: Any) -> list[Any]:
    """The compiled resume functions one level below `compiled`'s entries' glue."""
    found = []
    for entry in frames_of(compiled).entries:
        for name, value in entry.glue.__globals__.items():
            if name.startswith("__resume") and hasattr(value, "compiled"):
                found.append(value.compiled)
    return found


def _all_frames(compiled: Any) -> list[Any]:
    frames, todo = [], [compiled]
    while todo:
        f = todo.pop()
        frames.append(f)
        todo += _resumes(f)
    return frames


def _item(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w)
    scale = h.abs().max().item() + 1.0
    return torch.tanh(h / scale) * w.sum(0)


def _print(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.sigmoid(x @ w)
    print("h", h.shape)
    return (h * 2).sum(1)


def _branch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    if h.sum() > 0:
        return torch.relu(h) * 3
    return torch.tanh(h) - 1


def _tolist(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    first = h[:, 0].tolist()
    return h * len(first) + h.exp().mean()


def _no_grad_inside(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        h = x @ w
    scale = h.abs().max().item()
    return (x * w.sum(0)).tanh() / (scale + 1)


PROGRAMS = [_item, _print, _branch, _tolist, _no_grad_inside]
MODES = ["plain", "train", "no_grad", "inference_mode"]


def _call(fn: Callable[..., torch.Tensor], mode: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with ctx(), contextlib.redirect_stdout(io.StringIO()):
        return fn(x, w)


def _inputs(mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, w = torch.randn(16, 32), torch.randn(32, 32) / 6
    return x, w.requires_grad_(mode == "train" or mode == "no_grad")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_frames_compiled_before_the_extension_loaded_take_the_fast_entry(module, monkeypatch, fn, mode) -> None:
    x, w = _inputs(mode)
    want = _call(fn, mode, x, w)
    # the frames that take the fast entry when the extension is there from the start
    control = kiln.compile(fn)
    for _ in range(3):
        _call(control, mode, x, w)
    expected = [_is_fast(f) for f in _all_frames(control)]
    assert any(expected), "no frame of this program qualifies for the fast entry"
    kiln.reset()

    compiled = kiln.compile(fn)
    with _not_loaded_yet(monkeypatch) as waiting:
        for _ in range(3):
            torch.testing.assert_close(_call(compiled, mode, x, w), want)
    frames = _all_frames(compiled)
    assert len(frames) == len(expected) and not any(_is_fast(f) for f in frames)
    assert len(waiting) == 1  # one registration however many frames wait
    waiting[0](module)  # the extension loads (on the tier-up thread, in a real run)
    compiles = kiln.stats()["compiles"]
    for _ in range(3):
        got = _call(compiled, mode, x, w)
        torch.testing.assert_close(got, want)
        if mode == "train":
            got.sum().backward()
            assert w.grad is not None
    assert [_is_fast(f) for f in _all_frames(compiled)] == expected
    assert kiln.stats()["compiles"] == compiles  # no recapture: the same entries, a different entry path


def test_an_extension_without_frame_entries_leaves_the_loop(module, monkeypatch) -> None:
    compiled = kiln.compile(_item)
    x, w = _inputs("plain")
    with _not_loaded_yet(monkeypatch) as waiting:
        compiled(x, w)
    waiting[0](object())  # an extension built before it had frame_entry: nothing to switch to
    for _ in range(2):
        torch.testing.assert_close(compiled(x, w), _item(x, w))
    assert not any(_is_fast(f) for f in _all_frames(compiled))
