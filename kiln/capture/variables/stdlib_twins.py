"""Python twins of the standard library's C helpers, inlined where a compiled frame calls the C one.

`heapq`'s heap functions and `bisect`'s searches are C functions (`_heapq`, `_bisect`) that read
and reorder a list: called on a list the trace tracks, they would be a graph break (capture cannot
run C code on a traced list). Each has a twin below, written for Kiln, that does the same reads,
comparisons (`<` only, in CPython's order, so a user `__lt__` sees the same calls) and writes, and
leaves the list laid out exactly as the C function does; the rules at the bottom inline the twin.
`Counter.most_common(n)` reaches these through `heapq.nlargest`, whose own Python is inlined as
usual. The errors a wrong argument raises carry CPython's messages.
Corresponds to the heapq and bisect parts of torch/_dynamo/polyfills.
"""
from __future__ import annotations

import bisect
import heapq
from typing import TYPE_CHECKING, Any, Callable

from kiln.capture.trace_rules import builtin_rule

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable


# ---- heaps (a min-heap: heap[k] <= heap[2k+1] and heap[2k+2]; the *_max helpers mirror it) --------

def _check_list(heap: Any) -> None:
    if not isinstance(heap, list):
        raise TypeError("heap argument must be a list")


def _bubble_up(heap: list, top: int, pos: int, below: Callable[[Any, Any], bool]) -> None:
    """Move heap[pos] towards `top` past every parent it is `below` (smaller, for a min-heap)."""
    item = heap[pos]
    while pos > top:
        up = (pos - 1) >> 1
        parent = heap[up]
        if below(item, parent):
            heap[pos] = parent
            pos = up
            continue
        break
    heap[pos] = item


def _sink(heap: list, pos: int, below: Callable[[Any, Any], bool]) -> None:
    """Fill the hole at `pos` by pulling the better child up to a leaf, then settle the item there
    (the bottom-up order CPython uses: fewer comparisons than stopping early)."""
    end = len(heap)
    start = pos
    item = heap[pos]
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and not below(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    heap[pos] = item
    _bubble_up(heap, start, pos, below)


def _less(a: Any, b: Any) -> bool:
    return a < b


def _greater(a: Any, b: Any) -> bool:
    return b < a


def heappush_twin(heap: Any, item: Any) -> None:
    _check_list(heap)
    heap.append(item)
    _bubble_up(heap, 0, len(heap) - 1, _less)


def _pop(heap: Any, below: Callable[[Any, Any], bool]) -> Any:
    _check_list(heap)
    if not heap:
        raise IndexError("index out of range")
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    heap[0] = last
    _sink(heap, 0, below)
    return top


def heappop_twin(heap: Any) -> Any:
    return _pop(heap, _less)


def heappop_max_twin(heap: Any) -> Any:
    return _pop(heap, _greater)


def _replace(heap: Any, item: Any, below: Callable[[Any, Any], bool]) -> Any:
    _check_list(heap)
    if not heap:
        raise IndexError("index out of range")
    top = heap[0]
    heap[0] = item
    _sink(heap, 0, below)
    return top


def heapreplace_twin(heap: Any, item: Any) -> Any:
    return _replace(heap, item, _less)


def heapreplace_max_twin(heap: Any, item: Any) -> Any:
    return _replace(heap, item, _greater)


def heappushpop_twin(heap: Any, item: Any) -> Any:
    _check_list(heap)
    if heap and heap[0] < item:
        item, heap[0] = heap[0], item
        _sink(heap, 0, _less)
    return item


def _heapify(heap: Any, below: Callable[[Any, Any], bool]) -> None:
    _check_list(heap)
    for pos in reversed(range(len(heap) // 2)):
        _sink(heap, pos, below)


def heapify_twin(heap: Any) -> None:
    _heapify(heap, _less)


def heapify_max_twin(heap: Any) -> None:
    _heapify(heap, _greater)


# ---- bisect -------------------------------------------------------------------------------------

def _bounds(a: Any, lo: Any, hi: Any) -> tuple[int, int]:
    if lo < 0:
        raise ValueError("lo must be non-negative")
    return lo, len(a) if hi is None else hi


def bisect_right_twin(a: Any, x: Any, lo: Any = 0, hi: Any = None, *, key: Any = None) -> int:
    lo, hi = _bounds(a, lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        probe = a[mid] if key is None else key(a[mid])
        if x < probe:
            hi = mid
        else:
            lo = mid + 1
    return lo


def bisect_left_twin(a: Any, x: Any, lo: Any = 0, hi: Any = None, *, key: Any = None) -> int:
    lo, hi = _bounds(a, lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        probe = a[mid] if key is None else key(a[mid])
        if probe < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def insort_right_twin(a: Any, x: Any, lo: Any = 0, hi: Any = None, *, key: Any = None) -> None:
    at = bisect_right_twin(a, x if key is None else key(x), lo, hi, key=key)
    a.insert(at, x)


def insort_left_twin(a: Any, x: Any, lo: Any = 0, hi: Any = None, *, key: Any = None) -> None:
    at = bisect_left_twin(a, x if key is None else key(x), lo, hi, key=key)
    a.insert(at, x)


# ---- the rules: each C function's call inlines its twin ------------------------------------------

def _c_function(module: Any, name: str) -> Any:
    """The module's function when it is the C one (a build without the accelerator runs the Python
    code, which is inlined as any other)."""
    fn = getattr(module, name, None)
    return fn if fn is not None and not hasattr(fn, "__code__") else None


_TWINS: dict[tuple[Any, str], Callable[..., Any]] = {
    (heapq, "heappush"): heappush_twin, (heapq, "heappop"): heappop_twin,
    (heapq, "heapify"): heapify_twin, (heapq, "heapreplace"): heapreplace_twin,
    (heapq, "heappushpop"): heappushpop_twin, (heapq, "_heapify_max"): heapify_max_twin,
    (heapq, "_heappop_max"): heappop_max_twin, (heapq, "_heapreplace_max"): heapreplace_max_twin,
    (bisect, "bisect_right"): bisect_right_twin, (bisect, "bisect_left"): bisect_left_twin,
    (bisect, "insort_right"): insort_right_twin, (bisect, "insort_left"): insort_left_twin,
}


def _inline(twin: Callable[..., Any]) -> Callable[["Tracer", list["Variable"], dict[str, "Variable"]], "Variable"]:
    def twin_rule(tx: "Tracer", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        from kiln.capture.variables.functions import call_python_function
        return call_python_function(tx, twin, None, args, kwargs)
    return twin_rule


for (_module, _name), _twin in _TWINS.items():
    _fn = _c_function(_module, _name)
    if _fn is not None:
        builtin_rule(_fn)(_inline(_twin))
