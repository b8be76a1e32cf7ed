"""Exceptions raised and caught inside a compiled frame stay in the graph.

Each function raises inside a `try` (a dict KeyError, a user `raise`, a builtin that raises on
constants, a raise in an inlined helper, a `with` whose `__exit__` swallows it) and catches it in
the same frame. Kiln must give eager's outputs and side effects, one graph and no break (as
torch._dynamo.explain counts); an exception that escapes the frame must be eager's exception.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch._dynamo

import kiln


def keyerror_from_dict(x):
    d = {"a": 1}
    try:
        y = x + d["b"]
    except KeyError:
        y = x - 1
    return y * 2


def raise_and_catch_with_finally(x):
    try:
        raise ValueError("no")
    except ValueError:
        y = x + 1
    finally:
        y = y * 2
    return y


def except_as_reads_args(x):
    try:
        raise KeyError("missing", 3)
    except KeyError as e:
        n = e.args[1]
    return x * n


def except_tuple_and_order(x):
    try:
        [1, 2][5]
    except (KeyError, IndexError):
        x = x + 10
    try:
        {}["k"]
    except IndexError:
        x = x * 100  # not taken: KeyError is no IndexError
    except LookupError:
        x = x - 3
    return x


def _helper_raises(x):
    if x.shape[0] > 2:
        raise RuntimeError("too big")
    return x


def raise_in_callee_caught_by_caller(x):
    try:
        y = _helper_raises(x)
    except RuntimeError:
        y = x.sin()
    return y + 1


def nested_reraise(x):
    try:
        try:
            raise TypeError("inner")
        except TypeError:
            x = x + 1
            raise
    except TypeError:
        x = x * 3
    return x


def zero_division_on_constants(x, n):
    try:
        scale = 1 / n
    except ZeroDivisionError:
        scale = 0.5
    return x * scale


class _Suppress:
    def __init__(self):
        self.seen = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.seen = kind
        return kind is ValueError


def with_exit_swallows(x):
    cm = _Suppress()
    with cm:
        x = x + 1
        raise ValueError("swallowed")
    return x * 2, cm.seen is ValueError


def no_exception_path(x):
    try:
        y = x.cos()
    except Exception:
        y = x
    else:
        y = y + 1
    finally:
        y = y * 2
    return y


def hasattr_pattern(x):
    try:
        fn = torch.no_such_function
    except AttributeError:
        fn = torch.relu
    return fn(x)


def suppress_and_nullcontext(x):
    import contextlib
    with contextlib.suppress(KeyError):
        x = x + 1
        {}["a"]
    with contextlib.nullcontext():
        x = x * 2
    return x


def try_in_a_loop(x):
    out = []
    for k in ["a", "b", "c"]:
        try:
            out.append(x * {"a": 1, "c": 3}[k])
        except KeyError:
            out.append(-x)
    return torch.stack(out)


def message_of_caught_exception(x):
    try:
        with _Suppress():  # its __exit__ lets a RuntimeError through
            x = x + 1
            raise RuntimeError("boom")
    except RuntimeError as e:
        x = x * len(str(e))
    return x


def return_inside_finally_block(x):
    try:
        return x.sum()
    finally:
        x.add_(1)


CASES = [
    (keyerror_from_dict, lambda: (torch.randn(3, 4),)),
    (raise_and_catch_with_finally, lambda: (torch.randn(5),)),
    (except_as_reads_args, lambda: (torch.randn(2, 2),)),
    (except_tuple_and_order, lambda: (torch.randn(4),)),
    (raise_in_callee_caught_by_caller, lambda: (torch.randn(4),)),
    (nested_reraise, lambda: (torch.randn(3),)),
    (zero_division_on_constants, lambda: (torch.randn(3), 0)),
    (with_exit_swallows, lambda: (torch.randn(3),)),
    (no_exception_path, lambda: (torch.randn(3),)),
    (hasattr_pattern, lambda: (torch.randn(6),)),
    (suppress_and_nullcontext, lambda: (torch.randn(3),)),
    (try_in_a_loop, lambda: (torch.randn(3),)),
    (message_of_caught_exception, lambda: (torch.randn(3),)),
    (return_inside_finally_block, lambda: (torch.randn(3),)),
]


def _close(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want


def _copies(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_caught_exception_matches_eager_in_one_graph(fn, make, backend):
    kiln.reset()
    args = make()
    want = fn(*_copies(args))
    got = kiln.compile(fn, backend=backend)(*_copies(args))
    _close(got, want)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0
    assert stats["graph_breaks"] == 0


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_graph_counts_match_dynamo(fn, make):
    kiln.reset()
    args = make()
    ours = kiln.explain(fn)(*args)
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(*args)
    assert ours.graph_break_count == 0, ours.break_reasons
    assert ours.graph_break_count <= theirs.graph_break_count
    assert ours.graph_count <= max(theirs.graph_count, 1)
    assert ours.graph_count == 1


def uncaught_keyerror(x):
    d = {"a": x}
    y = x + 1
    return y + d["b"]


def unmatched_except(x):
    try:
        raise ValueError("escapes")
    except KeyError:
        return x
    return x + 1


@pytest.mark.parametrize("fn", [uncaught_keyerror, unmatched_except])
def test_exception_escaping_the_frame_is_eagers(fn):
    kiln.reset()
    x = torch.randn(3)
    with pytest.raises(Exception) as want:
        fn(x)
    with pytest.raises(type(want.value)) as got:
        kiln.compile(fn, backend="eager")(x)
    assert got.value.args == want.value.args


def test_exception_escaping_under_fullgraph_is_a_clear_error():
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="ValueError"):
        kiln.compile(unmatched_except, backend="eager", fullgraph=True)(torch.randn(3))


def test_caught_exception_under_fullgraph_is_one_graph():
    kiln.reset()
    x = torch.randn(3, 4)
    got = kiln.compile(keyerror_from_dict, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got, keyerror_from_dict(x))


SEEN: list = []


def raise_after_ops(x):
    y = x.sin() + 1
    SEEN.append(y)  # observable: the graph before the raise must run
    if y.shape[0] > 2:
        raise ValueError(f"too long: {y.shape[0]}")
    return y


def test_uncaught_raise_keeps_the_graph_before_it():
    kiln.reset()
    SEEN.clear()
    x = torch.randn(4)
    with pytest.raises(ValueError, match="too long: 4"):
        kiln.compile(raise_after_ops, backend="eager")(x)
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0
    torch.testing.assert_close(SEEN[0], x.sin() + 1)
    torch.testing.assert_close(kiln.compile(raise_after_ops, backend="eager")(x[:2]), raise_after_ops(x[:2]))


def _reads_the_exception_being_handled(x):
    kind, value, _ = sys.exc_info()
    return x + (value.args[0] if value is not None else -1), kind


def test_exc_info_outside_the_frames_handlers_reads_the_callers_exception():
    """No except block of the traced frames runs: sys.exc_info() is the caller's. None at trace
    time is guarded (a call from inside the caller's except block must not reuse the graph);
    an exception there is a break."""
    x = torch.ones(2)
    for inside_first in (False, True):
        kiln.reset()
        compiled = kiln.compile(_reads_the_exception_being_handled)
        for inside in (inside_first, not inside_first, inside_first):
            if inside:
                try:
                    raise ValueError(5)
                except ValueError:
                    got = compiled(x)
                torch.testing.assert_close(got[0], x + 5)
                assert got[1] is ValueError
            else:
                got = compiled(x)
                torch.testing.assert_close(got[0], x - 1)
                assert got[1] is None


def _returns_through_stop_iteration():
    got = yield 1
    return got * 2


def stop_iteration_value_and_notes(x):
    g = _returns_through_stop_iteration()
    next(g)
    try:
        g.send(5)
    except StopIteration as stop:
        x = x + stop.value
    try:
        raise KeyError("k")
    except KeyError as e:
        e.add_note("first")
        e.add_note("second")
        notes = e.__notes__
    return x, notes


def test_stop_iteration_value_and_add_note_stay_in_the_graph():
    kiln.reset()
    x = torch.ones(2)
    expected = stop_iteration_value_and_notes(x)
    got = kiln.compile(stop_iteration_value_and_notes, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1] == ["first", "second"]


class _Swallow:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.log.append(str(value) if value else "clean")  # an exception is true
        return True


def exit_tests_the_truth_of_the_exception(x):
    log = []
    with _Swallow(log):
        x = x + 1
        raise KeyError("gone")
    with _Swallow(log):
        x = x * 2
    return x, log


def test_the_truth_of_an_exception_is_true_in_the_trace():
    kiln.reset()
    x = torch.ones(2)
    expected = exit_tests_the_truth_of_the_exception(x)
    got = kiln.compile(exit_tests_the_truth_of_the_exception, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1] == ["'gone'", "clean"]
