"""Python-language classes of bug found by the 18th probe (Dynamo-style programs kept outside the
repository, /work/scratch/probelang5): each test runs eagerly and through
kiln.compile(backend="eager") and compares values and raised exceptions, and where it matters the
number of graphs.

- `size in (3, 4)` (and operator.countOf / indexOf, `in dict.values()`) with a symbolic size
  compared each item by the trace's "a size never equals a constant" rule: always False, with no
  guard, so after automatic dynamic a size in the list took the wrong branch (a wrong answer);
  the ShapeEnv now decides `s0 == 3` and guards it; likewise `x.shape[0] == Size.SMALL` with an
  IntEnum member (a SymInt and an IntEnum compare through NotImplemented both ways, then `is`:
  always False), compared as the plain int; `x.shape in [(4, 2), (7, 2)]` broke the graph
  (tuples of sizes were not compared item by item inside `in`);
- a torch function mode active around a compiled call (a user's TorchFunctionMode, `with
  torch.device("meta")`) was ignored: the trace ran under it (it saw Kiln's own calls: fake
  tensors, guards), the graph made under it answered later calls without it and a graph made
  without it answered calls under it (a mode's changes lost, factories on the wrong device); a call
  under a mode now runs eagerly (the mode sees eager's calls) and every entry's global-state guard
  checks that no mode is active (boundary.cpp state_ok and KOP_STATE too); a DeviceContext alone
  (`with torch.device`, set_default_device) is traced since (tests/capture/test_default_device.py);
- iterating or unpacking a 0-d tensor (a for loop, list(), `a, b = t`) was an internal error
  (IndexError in the trace) and len() of one a graph break: eager's TypeError is raised where the
  program can catch it;
"""
from __future__ import annotations

import enum
import operator
import warnings
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

import kiln
from kiln.log import KilnWarning
from semantics_oracle import same


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc))


def run(fn: Callable[..., Any], calls: Sequence[tuple], graphs: int | None = None,
        fallbacks: bool = False) -> None:
    """Each call eager then compiled; no internal error (a KilnWarning), no graph break, no frame
    run eagerly unless `fallbacks`; `graphs`: how many graphs."""
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for i, args in enumerate(calls):
        want = outcome(fn, *args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = outcome(compiled, *args)
        assert not [w for w in caught if issubclass(w.category, KilnWarning)], [str(w.message) for w in caught]
        assert want[0] == got[0] and (same(got[1], want[1]) if want[0] == "ok" else got[1] is want[1]), \
            f"call {i}: compiled gave {got!r}, eager {want!r}"
    assert (fallbacks or kiln.stats()["fallbacks"] == 0) and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    if graphs is not None:
        assert backend.frame_count == graphs, f"{backend.frame_count} graphs, expected {graphs}"


SIZES = [(torch.zeros(n),) for n in (3, 5, 4, 7, 6, 3)]


# ---- a symbolic size compared with the items of a container --------------------------------------
def test_size_in_list_after_automatic_dynamic() -> None:
    def f(x):
        if x.shape[0] in [3, 4]:
            return x + 1
        return x - 1
    run(f, SIZES)


def test_size_in_tuple_three_items() -> None:
    def f(x):
        if x.shape[0] in (3, 4, 7):
            return x * 2
        return x - 1
    run(f, SIZES)


def test_size_not_in_list() -> None:
    def f(x):
        if x.shape[0] not in [4, 6]:
            return x + 5
        return x - 1
    run(f, SIZES)


def test_size_countof_and_indexof() -> None:
    def f(x):
        n = operator.countOf((4, 4, 3), x.shape[0])
        i = operator.indexOf([5, 4, 3], x.shape[0]) if x.shape[0] in (3, 4, 5) else -1
        return x + n * 10 + i
    run(f, SIZES)


def test_size_in_dict_values() -> None:
    def f(x):
        d = {"a": 3, "b": 4}
        if x.shape[0] in d.values():
            return x + 1
        return x - 1
    run(f, SIZES)


def test_shape_in_list_of_tuples_no_break() -> None:
    def f(x):
        if x.shape in [(4, 2), (7, 2)]:
            return x + 1
        return x - 1
    run(f, [(torch.zeros(n, 2),) for n in (3, 5, 4, 7, 6, 3)])


def test_shape_in_tuple_of_sizes_static() -> None:
    def f(x, y):
        return x + int(y.shape in ((2, 3), torch.Size([3, 2]))) + 10 * int([1, x.shape[0]] in [[1, 3], [2]])
    run(f, [(torch.zeros(3), torch.zeros(3, 2)), (torch.zeros(3), torch.zeros(2, 3))])


class _Size(enum.IntEnum):
    SMALL = 4
    LARGE = 7


def test_size_equals_intenum_member() -> None:
    def f(x):
        return x + int(x.shape[0] == _Size.SMALL) + 10 * int(_Size.LARGE == x.shape[0])
    run(f, SIZES)


def test_size_in_tuple_of_intenum_members() -> None:
    def f(x):
        if x.shape[0] in (_Size.SMALL, _Size.LARGE):
            return x + 1
        return x - 1
    run(f, SIZES)


def test_size_not_equal_intenum_member() -> None:
    def f(x):
        if x.shape[0] != _Size.LARGE:
            return x * 2
        return x - 1
    run(f, SIZES)


# ---- a 0-d tensor iterated ---------------------------------------------------------------------
def test_for_over_0d_tensor_raises_catchable() -> None:
    def f(x):
        try:
            for v in x.sum():
                x = x + v
        except TypeError:
            return x - 1
        return x
    run(f, [(torch.ones(3),)], graphs=1)


def test_list_of_0d_tensor_raises() -> None:
    def f(x):
        try:
            return list(x.sum())
        except TypeError as e:
            return x + len(str(e))
    run(f, [(torch.ones(3),)], graphs=1)


def test_len_of_0d_tensor_raises_catchable() -> None:
    def f(x):
        try:
            return x + len(x.sum())
        except TypeError:
            return x * 3
    run(f, [(torch.ones(3),)], graphs=1)


def test_unpack_0d_tensor_escapes() -> None:
    def f(x):
        a, b = (x * 2).sum()
        return a
    run(f, [(torch.ones(3),)], fallbacks=True)


# ---- a torch function mode active around a compiled call --------------------------------------
class _Log(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", "?"))
        return func(*args, **(kwargs or {}))


class _SinToCos(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return (torch.cos if func is torch.sin else func)(*args, **(kwargs or {}))


def _sin2(x):
    return torch.sin(x) * 2


def test_function_mode_sees_eager_calls_only() -> None:
    def f(x):
        return torch.sin(x) + 1
    x = torch.arange(3.0)
    with _Log() as eager:
        f(x)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    with _Log() as mine:
        got = compiled(x)
    assert mine.calls == eager.calls, mine.calls  # no call of Kiln's own (fake tensors, guards)
    assert torch.equal(got, f(x))


def test_function_mode_changes_ops_each_call() -> None:
    x = torch.linspace(0, 1, 4)
    kiln.reset()
    compiled = kiln.compile(_sin2)  # inductor: the eager backend's graph replays its calls under the mode
    plain = compiled(x)  # compiled without a mode
    with _SinToCos():
        under = compiled(x)  # the entry's guard fails: eager, which the mode sees
    again = compiled(x)
    assert torch.allclose(plain, torch.sin(x) * 2) and torch.allclose(again, plain)
    assert torch.allclose(under, torch.cos(x) * 2)


def test_function_mode_first_call_not_cached_for_later() -> None:
    x = torch.linspace(0, 1, 4)
    kiln.reset()
    compiled = kiln.compile(_sin2)  # inductor: the eager backend's graph replays its calls under the mode
    with _SinToCos():
        under = compiled(x)
    after = compiled(x)  # nothing made under the mode answers a call without it
    assert torch.allclose(under, torch.cos(x) * 2)
    assert torch.allclose(after, torch.sin(x) * 2)


def test_device_context_reaches_factories() -> None:
    def f(x):
        return torch.zeros(2).device, x + 1
    x = torch.ones(2)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    assert compiled(x)[0] == torch.device("cpu")
    with torch.device("meta"):
        assert compiled(x)[0] == f(x)[0] == torch.device("meta")
    assert compiled(x)[0] == torch.device("cpu")
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    with torch.device("meta"):
        assert compiled(x)[0] == torch.device("meta")
    assert compiled(x)[0] == torch.device("cpu")
