"""Compiling a list of guards into one check function: `compile_guards` -> `CheckFn`.

The generated function reads each source once (a local, shared by the sources that extend it),
checks the guards in order with early exit, and returns False when a source cannot be read.
`CheckFn.first_failure` and `explain_failure` name the first failing guard in the user's words;
`read_source` reads a source the way the generated code does, without compiling it.
"""
from __future__ import annotations

import re
import weakref
from types import CodeType
from typing import Any, Callable, Sequence

from kiln import log
from kiln.capture.guards import static
from kiln.capture.guards.identity import watch
from kiln.capture.guards.kinds import Check, Emitter, GUARD_KINDS, Guard, user_name
from kiln.capture.guards.native import _made, native_checks


_TERM_RE = re.compile(r"[LGF](?:\['[^']*'\])?(?:\.[A-Za-z_]\w*|\[[^\[\]]*\]|\(\))*")


_STEP_RE = re.compile(r"\['([^'\\]*)'\]|\[(-?\d+)\]|\.([A-Za-z_]\w*)")
_PARSED: dict[str, tuple | None] = {}  # source -> (root, steps, ends), or None: not a plain chain
_PARSED_MAX = 100_000


def read_source(source: str, env: dict) -> Any:
    """The value of a source over env's L, G and F, as `eval(source, env)` gives it. A chain of
    string keys, int indices and attributes (nearly every source) is walked without compiling
    the text: a warm start reads a thousand sources for the dynamic-shape policy."""
    parsed = _chain(source)
    if parsed is None:
        return eval(source, env)
    root, steps, _ = parsed
    value = env[root]
    for kind, key in steps:
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


def _chain(source: str) -> tuple | None:
    """(root, steps, the end offset of the root and of each step) of a plain chain, else None."""
    parsed = _PARSED.get(source, ())
    if parsed == ():
        if len(_PARSED) >= _PARSED_MAX:  # a long-lived process compiling many models: start over
            _PARSED.clear()
        parsed = _PARSED[source] = _parse_chain(source)
    return parsed


def _parse_chain(source: str) -> tuple | None:
    if source[:1] not in ("L", "G", "F") or (len(source) > 1 and source[1] not in "[."):
        return None
    steps = []
    ends = [1]
    while ends[-1] < len(source):
        match = _STEP_RE.match(source, ends[-1])
        if match is None:
            return None
        key, index, attr = match.groups()
        steps.append(("item", key) if key is not None else ("item", int(index)) if index is not None else ("attr", attr))
        ends.append(match.end())
    return source[0], tuple(steps), tuple(ends)


# The entries a frame may drop (their objects freed) before it runs eagerly: torch.compile's
# accumulated_recompile_limit, whose default this is.
ACCUMULATED_LIMIT = 256


def _never(L: dict, G: dict, F: Any) -> bool:
    return False  # the code of an invalidated check function


class CheckFn:
    """The compiled guards of one cache entry: `check(L, G, F) -> bool`, its source text, and why it fails.

    `fn` is the generated function itself; the entry calls it directly on the hot path.
    """

    def __init__(self, guards: list[Guard], fn: Callable[[dict, dict, Any], bool], source: str,
                 checks: list[list[Check]], constants: dict[str, Any], code: CodeType | None = None,
                 native: bool = False) -> None:
        self.guards = guards
        self.fn = fn
        self.source = source
        self.code = code  # `source` compiled (the persistent cache stores it marshalled)
        self.native = native  # whether the tensor and keys checks call the boundary extension
        self._checks = checks
        self._constants = constants
        self.valid = True  # False once an object it compares by identity was freed
        self.on_invalid: Callable[[], None] | None = None  # what `enter` set
        self._watching: list = []

    def watch(self, refs: list) -> None:
        """Invalidate this check once an object of `refs` (weak references its identity guards
        compare with) is freed: none of its entries' calls can match again."""
        me = weakref.ref(self)

        def invalidate() -> None:
            check = me()
            if check is not None:
                check.invalidate()
        objects = [r() for r in refs]
        self._watching = watch([obj for obj in objects if obj is not None], invalidate)
        if any(obj is None for obj in objects):
            self.invalidate()

    def invalidate(self) -> None:
        """An object an identity guard compares with was freed: the check fails from now on for
        whoever holds its function (a thread in the middle of a cache's loop, a disk candidate), and
        `on_invalid` drops its entry from the cache, where it would count against cache_size_limit.
        Called from a weak reference's callback, which runs before the freed object's memory can
        hold another: the weak references in the check fail already, this makes it fail whole."""
        if not self.valid:
            return
        self.valid = False
        self.fn.__code__ = _never.__code__
        hook, self.on_invalid = self.on_invalid, None
        if hook is not None:
            hook()

    def enter(self, cache: Any, entry: Any) -> None:
        """Put `entry` (the cache entry holding this check) first in `cache.entries`, to be taken out
        once the check is invalidated (counted in `cache.dropped`; the frame's fast entry is made
        again: kiln.capture.entry), as torch.compile drops such an entry from its frame's cache. The
        drop runs in a weak reference's callback, wherever the object died: one list.remove, whose
        search by identity (a cache entry is equal only to itself) runs no Python code midway. Past
        ACCUMULATED_LIMIT drops (new objects compared by identity, made and freed per call) the frame
        runs eagerly, as torch.compile's accumulated_recompile_limit bounds its recompiles."""
        entries = cache.entries

        def drop() -> None:
            try:
                entries.remove(entry)
            except ValueError:  # kiln.reset() emptied the list already
                return
            cache.dropped += 1
            if cache.dropped >= ACCUMULATED_LIMIT and cache.eager_reason is None:
                cache.eager_reason = (f"recompiled {cache.dropped} times for objects compared by identity "
                                      f"and freed since (a new object per call?)")
        self.on_invalid = drop
        entries.insert(0, entry)
        if not self.valid:  # freed between its capture and now
            drop()

    def use_native(self, module: Any) -> None:
        """Switch to the native tensor and keys checks of `module` (the boundary extension). The
        function object stays (a cache entry holds it): its code is replaced, and its globals get
        the new code's constants, named apart from the old ones (`___n<k>`, see Emitter), so a call
        running the old code meanwhile still reads its own."""
        if self.native or not self.valid:
            return
        new = compile_guards(self.guards, native=module)
        self.fn.__globals__.update(new._constants)
        self.fn.__code__ = new.fn.__code__
        self.source, self.code, self._checks, self._constants = new.source, new.code, new._checks, new._constants
        self.native = True

    def __call__(self, L: dict, G: dict, F: Any) -> bool:
        return self.fn(L, G, F)

    def first_failure(self, L: dict, G: dict, F: Any) -> tuple[Guard, str] | None:
        """The first guard that fails on (L, G, F), with the reason in the user's words; None if all pass."""
        env = {"L": L, "G": G, "F": F, **self._constants}
        for guard, checks in zip(self.guards, self._checks):
            if guard.kind == "check_shape":
                reason = _explain_shape(guard, env)
                if reason is not None:
                    return guard, reason
                continue
            if guard.source:
                try:
                    value = eval(guard.source, env)
                except Exception as exc:  # a missing attribute or key is itself the change
                    return guard, f"{guard.name} could not be read ({type(exc).__name__}: {exc})"
            else:
                value = env  # a guard over no one value (grad mode, aliasing) reads the whole frame
            for check in checks:
                try:
                    ok = eval(check.render("___value") if guard.source else check.code, {**env, "___value": value})
                except Exception:
                    ok = False
                if not ok:
                    return guard, check.why(value)
        return None

    def explain_failure(self, L: dict, G: dict, F: Any) -> str:
        """The first failing guard in the user's words, e.g. `x.size()[0] changed from 8 to 16`."""
        failure = self.first_failure(L, G, F)
        return "all guards pass" if failure is None else failure[1]


def _explain_shape(guard: Guard, env: dict) -> str | None:
    try:
        if eval(guard.source, env):
            return None
    except Exception as exc:
        return f"{user_name(guard.source)} could not be evaluated ({type(exc).__name__}: {exc})"
    values = []
    for term in dict.fromkeys(_TERM_RE.findall(guard.source)):
        try:
            values.append(f"{user_name(term)} = {eval(term, env)!r}")
        except Exception:
            continue
    where = f" (guard added at {guard.expected})" if isinstance(guard.expected, str) else ""
    now = f"; now {', '.join(values)}" if values else ""
    return f"{user_name(guard.source)} no longer holds{now}{where}"


def shape_guard(shape_guard_record: Any) -> Guard:
    """A check_shape Guard from a ShapeEnv ShapeGuard (its `.python` text and `.location`) or plain text."""
    if isinstance(shape_guard_record, str):
        return Guard(shape_guard_record, "check_shape", None)
    return Guard(shape_guard_record.python, "check_shape", getattr(shape_guard_record, "location", None))


_DEFAULT: Any = object()


def compile_guards(guards: Sequence[Guard], shape_guards: Sequence[Any] = (),
                   compiled: tuple[str, CodeType] | None = None, native: Any = _DEFAULT) -> CheckFn:
    """Compile guards (and the ShapeEnv's guards, checked last) into one function with early exit.

    `compiled`: (source, code) that this function made for the same guards in another process
    with the same Kiln sources (kiln.capture.persist's key guarantees both): the source text is
    not generated again nor compiled (a tenth of a second for a transformer block's guards); the
    constants are bound as before, in the same order, so the code's names mean the same.
    `native`: the boundary extension for the native tensor and keys checks, or None for Python
    only. By default: the extension when it is built (`native_checks`); a function made before
    then switches to it once it loads (the tier-up thread builds it), see `CheckFn.use_native`."""
    upgrade_later = native is _DEFAULT
    if native is _DEFAULT:
        native = native_checks()
    ordered = _ordered(guards, shape_guards)
    em = Emitter(native)
    hoisted = _Hoisted()  # source expression -> local name, in order of first use
    lines: list[str] = []
    if compiled is None and any(_MODULES in g.source for g in ordered):
        # globals of other modules are read through sys.modules (sources.GlobalSource): one
        # __import__ per check instead of one per module (forty in a transformers model's entry)
        lines.append(f"___modules = {_MODULES}")
        hoisted.add(_MODULES, "___modules")
    all_checks = [GUARD_KINDS[guard.kind](guard.expected, guard.name, em) for guard in ordered]
    grouped, folded = _empty_attribute_groups(ordered) if compiled is None else ({}, set())
    # guards whose outcome the others fix (kiln.capture.guards.static): checked once, here
    fixed = static.fixed_guards(ordered, all_checks, em.constants) - grouped.keys() - folded
    once = static.repeated_functions(ordered)  # a function's contents checked at its first identity guard
    for index, (guard, checks) in enumerate(zip(ordered, all_checks)):
        if compiled is not None or index in folded or index in fixed:
            continue
        if index in grouped:
            _empty_attributes_line(*grouped[index], native is not None, hoisted, lines)
        else:
            _guard_line(guard, static.identity_only(checks) if index in once else checks, hoisted, lines)

    if compiled is not None:
        source, code = compiled
        left_out = static.recorded(source)  # what it relied on holds here too
        if _global_names(code) <= em.constants.keys() and (
                left_out is None or (left_out[0] <= fixed and left_out[1] <= once)):
            namespace = dict(em.constants)
            exec(code, namespace)
            return _made(_watched(CheckFn(ordered, namespace["___check_guards"], source, all_checks, em.constants,
                                          code, native is not None), em), upgrade_later)
        # not this function's code for these guards after all (or made for the other variant, or it
        # left out guards that the objects found in this process do not fix)
        return compile_guards(ordered, native=native if not upgrade_later else _DEFAULT)
    source = static.header(fixed, once) + _check_function_source(lines)
    namespace = dict(em.constants)
    code = compile(source, "<kiln guards>", "exec")
    exec(code, namespace)
    log.artifact("guards", lambda: "guards:\n" + "\n".join(f"  {g}" for g in ordered) + "\n" + source)
    return _made(_watched(CheckFn(ordered, namespace["___check_guards"], source, all_checks, em.constants, code,
                                  native is not None), em), upgrade_later)


def _watched(check: CheckFn, em: Emitter) -> CheckFn:
    if em.weak:
        check.watch(em.weak)
    return check


def _ordered(guards: Sequence[Guard], shape_guards: Sequence[Any]) -> list[Guard]:
    """The guards once each (the ShapeEnv's after the capture's); those relating several values
    (aliasing, shapes) after the guards that check each value's type."""
    unique: dict[tuple, Guard] = {}
    for guard in list(guards) + [shape_guard(g) for g in shape_guards]:
        unique.setdefault(guard.key(), guard)
    last = ("check_aliasing", "check_shape")
    ordered = [g for g in unique.values() if g.kind not in last]
    for kind in last:
        ordered += [g for g in unique.values() if g.kind == kind]
    return ordered


_POSITION = re.compile(r"(list\(.*\.(?:values|keys)\(\)\))\[\d+\]")


def _read(source: str, hoisted: _Hoisted, lines: list[str]) -> str:
    """The local holding `source`'s value, read into it by a new line the first time. A dict's
    value or key by position (sources.DictValueSource, DictKeySource) reads the dict's list into a
    local of its own first: a registry of a hundred functions (torch.distributions.kl's) is listed
    once per check, not once per guard."""
    if source not in hoisted:
        positional = _POSITION.fullmatch(source)
        if positional is not None:
            _read(positional.group(1), hoisted, lines)
        local = f"___v{len(hoisted)}"
        lines.append(f"{local} = {_rewrite(source, hoisted)}")
        hoisted.add(source, local)
    return hoisted[source]


def _empty_attributes_line(parent: str, names: tuple[str, ...], native: bool, hoisted: _Hoisted,
                           lines: list[str]) -> None:
    """One statement for a module's hook dicts that must all be empty (`_empty_attribute_groups`):
    one native call, or their lengths with the parent read once (a local)."""
    comment = f"# check_len {user_name(parent)}.{{{', '.join(names)}}}"
    if native:
        lines.append(f"if not ___empty_attrs({_rewrite(parent, hoisted)}, {names!r}): return False  {comment}")
        return
    local = _read(parent, hoisted, lines)
    lengths = " or ".join(f"len({local}.{attr})" for attr in names)
    lines.append(f"if {lengths}: return False  {comment}")


def _guard_line(guard: Guard, checks: list[Check], hoisted: _Hoisted, lines: list[str]) -> None:
    """The statement that checks one guard, its source read into a local once."""
    if guard.kind == "check_shape":
        lines.append(f"if not ({_rewrite(guard.source, hoisted)}): return False")
        return
    value = _read(guard.source, hoisted, lines) if guard.source else "None"
    # a guard over no one value (grad mode, aliasing) has no `{v}`: its code is used as it is
    rendered = [c.render(value) if guard.source else c.code for c in checks]
    condition = " and ".join(f"({code})" if " or " in code else code for code in rendered)
    if not guard.source:  # a guard over several sources (aliasing) reads them through their locals
        condition = _rewrite(condition, hoisted)
    lines.append(f"if not ({condition}): return False  # {guard.kind} {user_name(guard.source)}")


def _check_function_source(lines: list[str]) -> str:
    body = "\n".join("        " + line for line in lines) or "        pass"
    return (
        "def ___check_guards(L, G, F):\n"
        "    try:\n"
        f"{body}\n"
        "    except Exception:\n"
        "        return False  # a source that cannot be read any more is a failed guard\n"
        "    return True\n"
    )


_ATTRIBUTE_SOURCE = re.compile(r"(.+)\.([A-Za-z_]\w*)")


def _empty_attribute_groups(ordered: Sequence[Guard]) -> tuple[dict[int, tuple[str, tuple[str, ...]]], set[int]]:
    """check_len-0 guards on two or more attributes of one object (a module's four hook dicts, read
    for every module a forward calls): {index of the first: (object's source, attribute names)} for
    one native `empty_attrs` call there, and the indices of the others, which it covers. The
    attributes are not kept as locals: a later guard that reads one reads it itself."""
    by_parent: dict[str, list[tuple[int, str]]] = {}
    for index, guard in enumerate(ordered):
        if guard.kind != "check_len" or guard.expected != 0:
            continue
        match = _ATTRIBUTE_SOURCE.fullmatch(guard.source)
        if match is not None and _TERM_RE.fullmatch(match[1]):
            by_parent.setdefault(match[1], []).append((index, match[2]))
    grouped: dict[int, tuple[str, tuple[str, ...]]] = {}
    folded: set[int] = set()
    for parent, members in by_parent.items():
        if len(members) > 1:
            grouped[members[0][0]] = (parent, tuple(name for _, name in members))
            folded.update(index for index, _ in members[1:])
    return grouped, folded


def _global_names(module_code: CodeType) -> set[str]:
    """The `___`-prefixed globals the generated check function reads."""
    names: set[str] = set()
    for const in module_code.co_consts:
        if isinstance(const, CodeType):
            names |= {n for n in const.co_names if n.startswith("___")}
    return names


class _Hoisted(dict):
    """Source expression -> the local the check function reads it into, also indexed by the last
    `_TAIL` characters of each source: a source inside an expression leaves its tail there, so
    `_rewrite` looks at the sources whose tails the expression holds (and the short ones) instead
    of every source read so far. A model's guard set holds hundreds to thousands of sources, and a
    warm start compiles it once for each entry it reads from disk."""

    def __init__(self) -> None:
        super().__init__()
        self.by_tail: dict[str, list[tuple[int, int, str]]] = {}  # tail -> (-len, order, source)
        self.short: list[tuple[int, int, str]] = []

    def add(self, source: str, local: str) -> None:
        self[source] = local
        entry = (-len(source), len(self), source)
        if len(source) < _TAIL:
            self.short.append(entry)
        else:
            self.by_tail.setdefault(source[-_TAIL:], []).append(entry)


_TAIL = 10


_MODULES = "__import__('sys').modules"


def _rewrite(expr: str, hoisted: _Hoisted) -> str:
    """Replace the longest already-read sources inside `expr` by their locals (a source followed by
    more of a name, `x` in `x1`, is not that source); equal lengths in the order they were read."""
    chain = _chain(expr)
    if chain is not None:
        # A chain of keys, indices and attributes holds other sources only as its prefixes (text
        # inside a key is not code): the longest one read so far is the local to start from.
        for end in reversed(chain[2]):
            local = hoisted.get(expr[:end])
            if local is not None:
                return local + expr[end:]
        return expr
    tails = {expr[i:i + _TAIL] for i in range(len(expr) - _TAIL + 1)}
    candidates = [e for e in hoisted.short if -e[0] <= len(expr)]
    for tail in tails:
        candidates += hoisted.by_tail.get(tail, ())
    for _, _, src in sorted(candidates):
        if src in expr:
            expr = _replace_source(expr, src, hoisted[src])
    return expr


def _replace_source(expr: str, src: str, local: str) -> str:
    parts = []
    at = 0
    found = expr.find(src)
    while found >= 0:
        end = found + len(src)
        if end < len(expr) and (expr[end].isalnum() or expr[end] == "_"):
            found = expr.find(src, found + 1)
            continue
        parts += [expr[at:found], local]
        at = end
        found = expr.find(src, end)
    return "".join(parts) + expr[at:]
