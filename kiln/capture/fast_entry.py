"""The fast entry of a compiled function: guards, glue and graph call as one C call of the boundary extension.

Where it sits: kiln.capture.entry's exact entry (`def entry(x, y, *extra)`, a method's too) calls
`_kiln_fast(x, y)` once every entry of its frame's cache qualifies (`native_entry`), and runs its
loop over the entries in Python otherwise. Input: the frame's cache entries (their guards, their
glue source). Output: the extension's `Entry` object (`frame_entry` in kiln/runtime/boundary.cpp),
or None. The counterpart in torch.compile is Dynamo's C++ guard manager in front of a frame's cache
(torch/csrc/dynamo).

The values the guards read are registers of the C object: the bound self of a method, the call's
arguments, then one load per step of a source (`L['self']._modules['fc']._parameters['weight']`:
an item, an attribute, an item, an item; a prefix shared by several sources is read once per
call). An entry qualifies when every guard is one the extension checks itself on its register:
tensor metadata (`check_tensor`, a plain tensor or Parameter), identity (`check_id`, a function's
code and defaults too), `check_type` (both through a weak reference where the guard holds its
object weakly: `_IS_REF`, `_TYPE_REF`), `check_len`, `check_value` (None, bools, dtypes, ints,
finite floats with a zero's sign, strings), `check_none`/`check_not_none`, `check_keys`,
`check_absent`, grad mode, the default dtype with autocast off and the default device,
`check_aliasing`; and its glue is one graph call over sources that tensor guards check, returning
one result or the whole tuple.
Anything else (shape guards, closures' cells, class attributes, a break) keeps the Python loop, and
says why under KILN_LOGS=perf_hints. docs/seams.md has the invariants.
"""
from __future__ import annotations

import re
import sys
import threading
import types
import weakref
from typing import Any, Callable

import torch

from kiln import config, log
from kiln.capture.guards.compile import _STEP_RE, _TERM_RE, _replace_source
from kiln.capture.guards.identity import WeakHeld, held
from kiln.capture.guards.native import native_checks, native_spec, when_native_loads

# the glue of one graph call (kiln.capture.glue.GlueBuilder.finish)
_ONE_CALL = re.compile(r"def __glue_\w+\(L, G, F\):\n"
                       r"    __out = (__\w+)\(([^\n]*)\)\n"
                       r"    return (?:__out\[(\d+)\]|__out)\n\Z")
_SYS = "__import__('sys')"  # the root of the global hooks' sources (torch.nn.modules.module's dicts)

# the extension's check ops (KOP_* in boundary.cpp)
_TENSOR, _IS, _TYPE, _LEN, _VALUE, _KEYS, _ABSENT, _GRAD, _STATE, _ALIAS, _IS_NOT, _EXPR, _IS_REF, _TYPE_REF = range(14)
_LOAD_ATTR, _LOAD_ITEM, _LOAD_GLOBAL, _LOAD_CONST, _LOAD_CALL = range(5)
_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})  # `.size()` in a source


class _Refused(Exception):
    """Why a cache entry cannot be checked by the fast entry (logged under perf_hints)."""


def native_entry(cached: list, names: tuple[str, ...], bound: tuple, G: dict, slow: Callable[..., Any],
                 entries: list, stats: Any, mismatch: type[BaseException],
                 on_mismatch: Callable[[Any, tuple], Any], label: str = "",
                 again: tuple[types.FunctionType, types.CodeType] | None = None) -> Any:
    """The extension's fast entry answering for the cache entries `cached` (the frame's list
    `entries` as it is now) of a function whose locals are `names` (all positional; the first
    `len(bound)` are the `bound` objects, a method's self), or None where an entry does not qualify
    or the extension is not loaded. `slow(*args)` is the Python path it hands every other call to
    (the fast entry runs only while `entries` holds exactly `cached`); `stats.cache_hits` counts
    hits; `on_mismatch(exc, args)` answers a `mismatch` error from the graph, as the glue does.
    `again` is the entry function and the code to give it once the extension loads, where it is not
    loaded yet (see retry_when_loaded)."""
    module = native_checks()
    if module is None and again is not None:
        retry_when_loaded(*again)
    if module is None or not hasattr(module, "frame_entry"):  # an extension built before it had one
        return None
    program = _Program(names, len(bound))
    try:
        alternatives = tuple(program.alternative(entry, module) for entry in cached)
    except _Refused as why:
        log.artifact("perf_hints", f"{label}: calls take the Python entry: {why}")
        return None
    return module.frame_entry(slow, entries, tuple(cached), alternatives, bound, len(names) - len(bound),
                              tuple(program.loads), stats, mismatch, on_mismatch, G)


# Entry functions that took the Python loop while the extension was not loaded, and the code each
# takes when it loads (kiln.capture.entry's `again`: ask native_entry anew, then make the call)
_AWAITING: "weakref.WeakKeyDictionary[types.FunctionType, types.CodeType]" = weakref.WeakKeyDictionary()
_awaiting_lock = threading.Lock()
_waiting = [False]


def retry_when_loaded(entry: types.FunctionType, again: types.CodeType) -> None:
    """Give `entry` the code `again` once the boundary extension loads. In a fresh cache the
    extension is built by the native wrappers' tier-up thread, after the first calls of every frame
    (a resume frame's too): without this, each frame whose cache filled before then kept the Python
    loop over its entries for good, its checks native but its call not. The code is swapped, not
    the call made, from the loading thread: the next call on the caller's own thread asks again,
    under the compile lock, as a miss does."""
    if not (config.native_guards and config.fast_entry):
        return
    with _awaiting_lock:
        _AWAITING[entry] = again
        register = not _waiting[0]
        _waiting[0] = True
    if register:
        when_native_loads(_retry_awaiting)


def _retry_awaiting(module: Any) -> None:
    with _awaiting_lock:
        waiting = list(_AWAITING.items())
        _AWAITING.clear()
        _waiting[0] = False
    if not hasattr(module, "frame_entry"):
        return
    for entry, again in waiting:
        entry.__code__ = again


class _Program:
    """The registers and loads shared by the alternatives of one fast entry."""

    def __init__(self, names: tuple[str, ...], nbound: int) -> None:
        self.position = {name: k for k, name in enumerate(names)}
        self.first_load = len(names)
        self.loads: list[tuple[int, int, Any]] = []
        self._known: dict[tuple, int] = {}

    def _load(self, src: int, kind: int, key: Any) -> int:
        memo = (src, kind, key if kind != _LOAD_CONST else id(key), type(key))
        reg = self._known.get(memo)
        if reg is None:
            reg = self._known[memo] = self.first_load + len(self.loads)
            self.loads.append((src, kind, key))
        return reg

    def register(self, source: str) -> int:
        """The register holding the value of `source`, a chain of items and attributes."""
        pos = 1
        if source.startswith(_SYS):
            reg, pos = self._load(-1, _LOAD_CONST, sys), len(_SYS)
        elif source[:2] in ("L[", "G["):
            match = _STEP_RE.match(source, 1)
            if match is None or match.group(1) is None:
                raise _Refused(f"source {source} is not a chain of items and attributes")
            name, pos = match.group(1), match.end()
            if source[0] == "L":
                if name not in self.position:
                    raise _Refused(f"source {source} reads a local that is no parameter")
                reg = self.position[name]
            else:
                reg = self._load(-1, _LOAD_GLOBAL, name)
        else:
            raise _Refused(f"guard source {source or '(none)'} is not an argument's or a global's")
        while pos < len(source):
            match = _STEP_RE.match(source, pos)
            if match is None:
                raise _Refused(f"source {source} is not a chain of items and attributes")
            key, index, attr = match.groups()
            pos = match.end()
            if attr is not None and source.startswith("()", pos) and attr in _METHODS:
                reg, pos = self._load(reg, _LOAD_CALL, attr), pos + 2  # the same call as the Python check's
            elif attr is not None:
                reg = self._load(reg, _LOAD_ATTR, attr)
            else:
                reg = self._load(reg, _LOAD_ITEM, key if key is not None else int(index))
        return reg

    def expression(self, texts: list[str], namespace: dict) -> tuple:
        """The check of shape guards `texts` (Python over L, G, F): one function of the registers its
        sources read, compiled from the same text with each source replaced by its register, run in
        the Python check's namespace (its helpers and constants)."""
        terms: dict[str, int] = {}
        for text in texts:
            for match in _TERM_RE.finditer(text):
                terms.setdefault(match.group(0), self.register(match.group(0)))
        expr = " and ".join(f"({text})" for text in texts)
        for term in sorted(terms, key=len, reverse=True):
            expr = _replace_source(expr, term, f"___r{terms[term]}")
        regs = tuple(sorted(set(terms.values())))
        code = compile(f"lambda {', '.join(f'___r{r}' for r in regs)}: {expr}", "<kiln shape guards>", "eval")
        if {"L", "G", "F"} & _names(code):
            raise _Refused("a shape guard reads the frame other than through its sources")
        return (_EXPR, -1, (eval(code, namespace), regs))  # noqa: S307  # the guards' own text

    def alternative(self, entry: Any, module: Any) -> tuple:
        """(runtime name, checks, graph registers, out) of one cache entry, or _Refused."""
        match = _ONE_CALL.match(getattr(entry.result, "glue_source", None) or "")
        if match is None:
            raise _Refused("the glue does more than one graph call on guarded tensors")
        runtime_name, arguments, out = match.groups()
        if runtime_name not in getattr(entry.glue, "__globals__", {}):
            raise _Refused("the graph is not in the glue's namespace")
        first: list[tuple] = []  # grad mode and global state: cheapest, and what alternates most
        checks: list[tuple] = []
        shapes: list[str] = []
        for guard in entry.check.guards:
            if guard.kind == "check_grad_mode":
                first.append((_GRAD, -1, bool(guard.expected)))
            elif guard.kind == "check_global_state":
                if guard.expected.autocast:
                    raise _Refused("a graph traced under autocast")
                if not hasattr(module, "state_ok"):  # KOP_STATE took a dtype alone then
                    raise _Refused("the boundary extension was built before default-device checks: rebuild it "
                                   "(python -m kiln boundary)")
                first.append((_STATE, -1, (guard.expected.default_dtype, guard.expected.default_device)))
            elif guard.kind == "check_aliasing":
                groups = tuple(tuple(self.register(s) for s in group) for group in guard.expected)
                checks.append((_ALIAS, -1, groups))
            elif guard.kind == "check_shape":
                shapes.append(guard.source)
            else:
                reg = self.register(guard.source)
                checks.extend(self._checks(guard, reg, entry, module))
        graph_regs = tuple(self.register(a) for a in arguments.split(", ")) if arguments else ()
        # checks of the arguments before those of what they hold (a module's parameters); shape
        # guards last, as in the Python check (they hold where the tensors' ranks do)
        checks.sort(key=lambda c: c[1] >= self.first_load)
        if shapes:
            checks.append(self.expression(shapes, entry.check.fn.__globals__))
        return runtime_name, tuple(first + checks), graph_regs, -1 if out is None else int(out)

    def _checks(self, guard: Any, reg: int, entry: Any, module: Any) -> list[tuple]:
        kind, expected = guard.kind, guard.expected
        if kind == "check_tensor":
            spec = native_spec(expected, module)
            if spec is None:
                raise _Refused(f"{guard.source}: a tensor the native check cannot read ({expected.type.__name__})")
            return [(_TENSOR, reg, spec)]
        if kind == "check_id":
            return [self._identity(guard, reg, module, _IS, _IS_REF)] + (
                self._function_contents(expected, reg, entry, guard.source)
                if isinstance(expected, types.FunctionType) else [])
        if kind == "check_type":
            return [self._identity(guard, reg, module, _TYPE, _TYPE_REF)]
        if kind == "check_len":
            return [(_LEN, reg, int(expected))]
        if kind == "check_none":
            return [(_IS, reg, None)]
        if kind == "check_not_none":
            return [(_IS_NOT, reg, None)]
        if kind == "check_keys":
            return [(_KEYS, reg, tuple(expected))]
        if kind == "check_absent":
            return [(_ABSENT, reg, tuple(expected))]
        if kind == "check_value":
            if expected is None or expected is Ellipsis or isinstance(expected, (bool, torch.dtype, torch.layout)):
                return [(_IS, reg, expected)]
            if type(expected) is int or type(expected) is str \
                    or (type(expected) is float and expected == expected and abs(expected) != float("inf")):
                return [(_VALUE, reg, expected)]
            raise _Refused(f"{guard.source}: a constant of type {type(expected).__name__}")
        raise _Refused(f"a {kind} guard on {guard.source or '(the frame)'}")

    @staticmethod
    def _identity(guard: Any, reg: int, module: Any, strong: int, weak: int) -> tuple:
        """The check of a check_id guard (`_IS`) or a check_type one (`_TYPE`): with the object its
        guard holds weakly through the weak reference it holds (`_IS_REF`, `_TYPE_REF`: never passing
        once the object is freed), else with the object. An extension built before it knew those
        ops (its `frame_entry_ops`) is not given them."""
        stored = held(guard)
        if type(stored) is not WeakHeld:
            return (strong, reg, stored)
        if getattr(module, "frame_entry_ops", 0) <= _TYPE_REF:
            raise _Refused("the boundary extension was built before weak identity checks: rebuild it "
                           "(python -m kiln boundary)")
        if stored.ref() is None:
            raise _Refused(f"{guard.source}: an object compared by identity was freed")
        return (weak, reg, stored.ref)

    def _function_contents(self, fn: types.FunctionType, reg: int, entry: Any, source: str) -> list[tuple]:
        """The checks of kinds._function_contents: code and defaults by identity. The Python check
        bound them when it was compiled; they are read again here, so only where they are still
        those objects (a function whose __code__ was assigned since keeps the Python loop)."""
        bound = getattr(entry.check, "_constants", {}).values()
        code, defaults = fn.__code__, fn.__defaults__
        if not any(v is code for v in bound) or (defaults is not None and not any(v is defaults for v in bound)) \
                or fn.__kwdefaults__ is not None:
            raise _Refused(f"{source}: a function whose code, defaults or keyword defaults are checked in Python")
        return [(_IS, self._load(reg, _LOAD_ATTR, "__code__"), code),
                (_IS, self._load(reg, _LOAD_ATTR, "__defaults__"), defaults),
                (_IS, self._load(reg, _LOAD_ATTR, "__kwdefaults__"), None)]


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names `code` and the code objects inside it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names
