"""The fast entry of a compiled function: guards, glue and graph call as one C call of the boundary extension.

Where it sits: kiln.capture.entry's exact entry (`def entry(x, y, *extra)`) calls `_kiln_fast(x, y)`
once its frame's cache holds one entry that qualifies (`native_entry`), and runs its loop over the
entries in Python otherwise. Input: that cache entry (its guards, its glue source). Output: the
extension's `Entry` object (kiln/runtime/boundary.cpp), or None. The Python counterpart in
torch.compile is Dynamo's C++ guard manager in front of a frame's cache (torch/csrc/dynamo).

An entry qualifies when every guard is one the extension checks itself: a tensor argument's metadata
(`check_tensor` over `L['name']`, a plain or Parameter tensor), a global's identity (`check_id`
over `G['name']`, not a function), grad mode, the default dtype with
autocast off, and distinct tensor arguments (`check_aliasing` with no group of two); and its glue is
one graph call over arguments returning one result or the whole tuple. Anything else (globals,
modules, constants, shape guards, a break) keeps the Python loop. docs/seams.md has the invariants.
"""
from __future__ import annotations

import re
import types
from typing import Any, Callable

from kiln.capture.guards.native import native_checks, native_spec

# the glue of one graph call on the frame's arguments (kiln.capture.glue.GlueBuilder.finish)
_ONE_CALL = re.compile(r"def __glue_\w+\(L, G, F\):\n"
                       r"    __out = (__\w+)\(((?:L\['\w+'\](?:, )?)*)\)\n"
                       r"    return (?:__out\[(\d+)\]|__out)\n\Z")
_LOCAL = re.compile(r"L\['(\w+)'\]")
_GLOBAL = re.compile(r"G\['(\w+)'\]")


def native_entry(entry: Any, names: tuple[str, ...], G: dict, slow: Callable[..., Any], entries: list, stats: Any,
                 mismatch: type[BaseException], on_mismatch: Callable[[Any, tuple], Any]) -> Any:
    """The extension's fast entry answering for cache `entry` of a function of parameters `names`
    (all positional), or None where the entry does not qualify or the extension is not loaded.
    `slow(*args)` is the Python path it hands every other call to; `entries` the frame's list
    (the fast entry runs only while `entry` is its only item); `stats.cache_hits` counts hits;
    `on_mismatch(exc, args)` answers a `mismatch` error from the graph, as the glue does."""
    module = native_checks()
    if module is None or not hasattr(module, "entry"):  # an extension built before it had one
        return None
    match = _ONE_CALL.match(getattr(entry.result, "glue_source", None) or "")
    if match is None:
        return None
    runtime_name, arguments, out = match.groups()
    if runtime_name not in getattr(entry.glue, "__globals__", {}):
        return None
    position = {name: k for k, name in enumerate(names)}
    graph_args = tuple(position.get(name, -1) for name in _LOCAL.findall(arguments))
    if -1 in graph_args:
        return None
    found = _guarded(entry.check.guards, position, module)
    if found is None:
        return None
    specs, grad, dtype, distinct, ids = found
    return module.entry(slow, entries, entry, specs, grad, dtype, distinct, runtime_name, graph_args,
                        -1 if out is None else int(out), stats, mismatch, on_mismatch, G, ids)


def _guarded(guards: list, position: dict[str, int], module: Any) -> tuple[tuple, Any, Any, bool, tuple] | None:
    """(a tensor spec per argument or None, grad mode or None, default dtype or None, whether the
    arguments must be distinct objects, the (name, object) pairs of the globals checked by identity)
    when every guard is one the fast entry checks, else None."""
    specs: list[Any] = [None] * len(position)
    ids: list[tuple[str, Any]] = []
    grad, dtype, distinct = None, None, False
    for guard in guards:
        if guard.kind == "check_tensor":
            k = _argument(guard.source, position)
            if k is None or specs[k] is not None:
                return None
            specs[k] = native_spec(guard.expected, module)
            if specs[k] is None:
                return None
        elif guard.kind == "check_id" and _GLOBAL.fullmatch(guard.source) \
                and not isinstance(guard.expected, types.FunctionType):  # a function's code is checked too
            ids.append((_GLOBAL.fullmatch(guard.source).group(1), guard.expected))  # type: ignore[union-attr]
        elif guard.kind == "check_grad_mode" and grad is None:
            grad = bool(guard.expected)
        elif guard.kind == "check_global_state" and dtype is None and not guard.expected.autocast:
            dtype = guard.expected.default_dtype
        elif guard.kind == "check_aliasing" and not distinct:
            # every group one argument: no two of them may be the same object (the C check compares
            # all arguments, a stricter test when some are not tensors: those calls take the slow path)
            if any(len(group) != 1 or _argument(group[0], position) is None for group in guard.expected):
                return None
            distinct = True
        else:
            return None
    return tuple(specs), grad, dtype, distinct, tuple(ids)


def _argument(source: str, position: dict[str, int]) -> int | None:
    match = _LOCAL.fullmatch(source)
    return None if match is None else position.get(match.group(1))
