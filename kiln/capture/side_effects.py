"""Side effects the traced code made on objects outside the frame, replayed by the glue.

While tracing, writes to globals, to attributes of modules and objects, to closure cells, and
mutations of lists, dicts and sets that came from outside are not applied; they are recorded here
(reads during the trace see the recorded value). After the graph has run, the glue applies them in
the order the program first made them, with their final values. In-place tensor ops are not side
effects here: they are nodes of the graph. Corresponds to torch/_dynamo/side_effects.py.
"""
from __future__ import annotations

import itertools
import keyword
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln.capture.sources import Source
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.variables.base import Variable


@dataclass
class _AttrWrite:
    obj: Any
    owner: "Variable"
    name: str
    value: "Variable"
    plain: bool = False  # replayed with object.__setattr__: the class's own __setattr__ was traced
    base_setattr: Any = None  # replayed with this base class __setattr__ (nn.Module's), for the same reason
    deleted: bool = False  # `del obj.name`: the attribute is gone (value is the object itself, unused)


@dataclass
class _GlobalWrite:
    source: Source
    value: "Variable"


def _written_values(kind: str, effect: Any) -> list["Variable"]:
    from kiln.capture.variables.dict import DictVariable
    from kiln.capture.variables.sequence import ListVariable

    if kind == "contents":
        if isinstance(effect, ListVariable):
            return list(effect.items)
        if isinstance(effect, DictVariable):
            return list(effect.items.values())
        return []
    if kind == "attr":
        return [effect.owner] if effect.deleted else [effect.owner, effect.value]
    if kind == "global":
        return [effect.value]
    if kind == "hook":
        return list(effect)
    if kind == "retain_grad":
        return [effect]
    if kind == "cell":
        return [] if effect.contents is None else [effect.contents]
    return []


_ABSENT = object()  # no effect recorded for a key


def _contents(container: "Variable") -> list | None:
    """A copy of a list's or dict's items (a dict's as pairs); None for other containers."""
    items = getattr(container, "items", None)
    if isinstance(items, dict):
        return list(items.items())
    return list(items) if isinstance(items, list) else None


def _same_contents(now: list | None, before: list) -> bool:
    """The same items, each the same Variable (and a dict's the same keys, in the same order)."""
    if now is None or len(now) != len(before):
        return False
    for a, b in zip(now, before):
        if isinstance(b, tuple):
            if not (type(a[0]) is type(b[0]) and a[0] == b[0] and a[1] is b[1]):
                return False
        elif a is not b:
            return False
    return True


class SideEffects:
    """The pending effects of one capture, keyed so that a later write replaces an earlier one."""

    def __init__(self) -> None:
        self._effects: dict[tuple, Any] = {}  # insertion order is program order of first write
        self._unreachable: set[int] = set()  # ids of Variables of outside containers no source reaches
        # every recording adds one (a second write of the same key too): a caller learns whether
        # some code it traced wrote anything outside the frame (an lru_cache'd body, see functions)
        self.writes = 0
        self._serial = itertools.count()  # keys of effects that are never replaced (hooks, retain_grad)
        self._class_attribute_names: set[str] = set()  # names the trace set on a class (class_write)
        self.cached_bodies_open = 0  # lru_cache bodies being traced (the outermost call is replayed)
        # for each higher-order op body being traced (open_body), innermost last: the state before
        # the body's first write of each key (the effect there was, a copy of a container's items)
        self._bodies: list[dict[tuple, tuple[Any, Any]]] = []

    def __bool__(self) -> bool:
        return bool(self._effects)

    def __len__(self) -> int:
        return len(self._effects)

    # ------------------------------------------------------------------ recording
    def unreachable(self, container: "Variable") -> None:
        """`container` is a real list/dict/set from outside that no source reaches (held by the
        closure cell of a function read without a source): a change to it could not be replayed."""
        self._unreachable.add(id(container))

    def mutate(self, container: "Variable") -> None:
        """A list/dict/set changed in place; one from outside (with a source) is rewritten later."""
        if container.source is None:
            if id(container) in self._unreachable:
                raise Unsupported("changing a container from outside the frame that no source reaches (held by "
                                  "the closure of a function read without a source)", kind="unsupported")
            return
        self.writes += 1
        self._note(("contents", id(container)), _contents(container))
        self._effects.setdefault(("contents", id(container)), container)

    def mutated(self, container: "Variable") -> bool:
        """True when the trace changed `container` (a list/dict/set from outside) in place."""
        return ("contents", id(container)) in self._effects

    def store_attr(self, obj: Any, owner: "Variable", name: str, value: "Variable", plain: bool = False,
                   base_setattr: Any = None, made: bool = False) -> None:
        """`obj.name = value`, replayed after the graph on what `owner` reconstructs: its source, or
        (`made`) the graph output a tensor the frame computed is."""
        self.writes += 1
        self._note(("attr", id(obj), name), None)
        if owner.source is None and not made:
            raise Unsupported(f"setting attribute {name!r} on an object without a source", kind="unsupported")
        self._effects[("attr", id(obj), name)] = _AttrWrite(obj, owner, name, value, plain, base_setattr)
        if isinstance(obj, type):
            self._class_attribute_names.add(name)

    def delete_attr(self, obj: Any, owner: "Variable", name: str) -> None:
        """`del obj.name` of an object from outside whose instance dict holds the name (or a write
        of this trace put it there): replayed as a removal from that dict."""
        self.writes += 1
        self._note(("attr", id(obj), name), None)
        if owner.source is None:
            raise Unsupported(f"deleting attribute {name!r} of an object without a source", kind="unsupported")
        self._effects[("attr", id(obj), name)] = _AttrWrite(obj, owner, name, owner, deleted=True)

    def pending_attr(self, obj: Any, name: str) -> "Variable | None":
        write = self._effects.get(("attr", id(obj), name))
        return None if write is None or write.deleted else write.value

    def writes_class_attribute(self, name: str) -> bool:
        """Whether the trace set an attribute `name` on some class (asked on every attribute read)."""
        return name in self._class_attribute_names

    def class_write(self, cls: type, name: str) -> "Variable | None":
        """The value a lookup of `name` through `cls.__mro__` finds where the trace wrote it on a class
        (`C.k = v`, replayed after the graph): the first class of the MRO that was written or that
        holds the name itself decides. None where no class of the MRO was written (the real lookup
        answers)."""
        if not any(key[0] == "attr" and key[2] == name for key in self._effects):
            return None
        for klass in getattr(cls, "__mro__", ()):
            write = self._effects.get(("attr", id(klass), name))
            if write is not None and not write.deleted:
                return write.value
            if name in klass.__dict__:
                return None
        return None

    def writes_attributes_of(self, obj: Any) -> bool:
        """True when the trace set or deleted an attribute of `obj`."""
        return any(key[0] == "attr" and key[1] == id(obj) for key in self._effects)

    def deleted_attr(self, obj: Any, name: str) -> bool:
        """True when the trace deleted `obj.name` (and did not set it again)."""
        write = self._effects.get(("attr", id(obj), name))
        return write is not None and write.deleted

    def changed_container(self, source: Source) -> "Variable | None":
        """The container read through `source` that the trace changed in place (a module's
        `_buffers` after `register_buffer`), or None: later reads must see its new contents."""
        name = source.name()
        for key, effect in self._effects.items():
            if key[0] == "contents" and effect.source is not None and effect.source.name() == name:
                return effect
        return None

    def changed_containers_under(self, source: Source) -> list["Variable"]:
        """The containers read through `source` or below it that the trace changed in place."""
        prefix = source.name()
        return [effect for key, effect in self._effects.items()
                if key[0] == "contents" and effect.source is not None
                and (effect.source.name() == prefix or effect.source.name().startswith((prefix + ".", prefix + "[")))]

    def touches(self, source: Source) -> bool:
        """True when a pending effect writes into what `source` reaches: a container read through
        it, or an attribute of an object read through it, was changed by the trace."""
        prefix = source.name()

        def under(owner: Any) -> bool:
            name = "" if owner is None or owner.source is None else owner.source.name()
            return name == prefix or name.startswith((prefix + ".", prefix + "["))

        for key, effect in self._effects.items():
            if key[0] == "contents" and under(effect) or key[0] == "attr" and under(effect.owner):
                return True
        return False

    def register_tensor_hook(self, tensor: "Variable", hook: "Variable") -> tuple:
        """`tensor.register_hook(hook)` on a tensor from outside: replayed after the graph (the
        hook runs in the backward pass, later still). Each registration is its own effect; its key
        is returned (the handle's, see remove_tensor_hook and GlueBuilder.hook_handles)."""
        key = ("hook", next(self._serial))
        self._note(key, None)
        self.writes += 1
        self._effects[key] = (tensor, hook)
        return key

    def remove_tensor_hook(self, key: tuple) -> None:
        """`handle.remove()` of a registration still to replay: it is not replayed at all."""
        if key in self._effects:
            self._note(key, None)
            self.writes += 1
            del self._effects[key]

    def retain_tensor_grad(self, tensor: "Variable") -> None:
        """`tensor.retain_grad()` on a non-leaf from outside: replayed after the graph, before any
        backward can run."""
        key = ("retain_grad", next(self._serial))
        self._note(key, None)
        self.writes += 1
        self._effects[key] = tensor

    def replay_cached_call(self, cached: "Variable", args: list["Variable"]) -> None:
        """A call of an lru_cache function whose pure body the trace stepped into: made again
        through the cache after the graph, so that the cache fills (and counts hits) as eager's
        calls make it (a cache_info() read, a cache_clear() later, see the same cache)."""
        key = ("cached_call", next(self._serial))
        self._note(key, None)
        self._effects[key] = (cached, args)

    def store_global(self, source: Source, value: "Variable") -> None:
        self._note(("global", source.name()), None)
        self.writes += 1
        self._effects[("global", source.name())] = _GlobalWrite(source, value)

    def pending_global(self, source: Source) -> "Variable | None":
        write = self._effects.get(("global", source.name()))
        return None if write is None else write.value

    def store_cell(self, cell: "Variable", value: "Variable") -> None:
        self._note(("cell", id(cell)), None)
        self.writes += 1
        if cell.source is None:
            raise Unsupported("writing a closure cell that has no source", kind="unsupported")
        self._effects[("cell", id(cell))] = cell

    def advance_iterator(self, iterator: Any, source: Source) -> None:
        """The trace stepped a list/tuple/range iterator object from outside the frame: the real
        one takes as many next() calls after the graph (`iterator.steps()`, read at replay)."""
        self._note(("advance", id(iterator)), None)
        self.writes += 1
        self._effects[("advance", id(iterator))] = (iterator, source)

    # ------------------------------------------------------------------ higher-order op bodies
    def open_body(self) -> None:
        """The body of a higher-order op (vmap, grad, cond) starts: the state before each of its
        writes is kept, for close_body."""
        self._bodies.append({})

    def close_body(self) -> bool:
        """The body ends. True when it left nothing changed outside the frame: the writes it undid
        itself (functional_call puts a module's parameters back) are forgotten. False when a write
        stays (eager's op would leave it, or refuse it)."""
        notes = self._bodies.pop()
        if not all(self._restored(key, before, copy) for key, (before, copy) in notes.items()):
            return False
        for key, (before, _copy) in notes.items():
            if before is _ABSENT:
                self._effects.pop(key, None)
        return True

    def _note(self, key: tuple, copy: Any) -> None:
        for notes in self._bodies:
            if key not in notes:
                notes[key] = (self._effects.get(key, _ABSENT), copy)

    def _restored(self, key: tuple, before: Any, copy: Any) -> bool:
        from kiln.capture.sources import AttrSource

        now = self._effects.get(key, _ABSENT)
        if now is _ABSENT and before is _ABSENT:
            return True  # a body inside this one undid its write (close_body forgot it)
        if key[0] == "contents":
            return copy is not None and now is not _ABSENT and _same_contents(_contents(now), copy)
        if key[0] != "attr" or now is _ABSENT:
            return False
        if before is not _ABSENT:
            return bool(now.value is before.value and now.deleted == before.deleted)
        # the body wrote back the value the attribute had when the frame started (read through it)
        source = None if now.deleted else now.value.source
        return source is not None and source.name() == AttrSource(now.owner.source, now.name).name()

    # ------------------------------------------------------------------ replay
    def emit(self, glue: "GlueBuilder") -> None:
        """Append the replay of every effect to the glue, in program order."""
        from kiln.capture.variables.deque import DequeVariable
        from kiln.capture.variables.dict import DictVariable, key_text, replay_contents
        from kiln.capture.variables.sequence import ListVariable
        from kiln.capture.variables.sets import SetVariable

        # every mutated container reached through another one (kwargs['cache'].layers) is looked up
        # before any replay: replaying the outer one first (kwargs.pop('cache')) would lose the path
        targets: dict[Any, str] = {}
        for key, effect in self._effects.items():
            if key[0] == "contents":
                targets[key] = effect.source.name()
                if not re.fullmatch(r"[LG]\[[^\[\]]*\]", targets[key]):
                    name = glue.fresh("c")
                    glue.line(f"{name} = {targets[key]}")
                    targets[key] = name
        # Every value an effect writes is read before any effect is replayed: a value the frame
        # took out of a container (`o.v = stack.pop()`) is read from its place in the container,
        # which the replay of that container's new contents removes.
        glue.read_first([value for key, effect in self._effects.items() for value in _written_values(key[0], effect)])
        for key, effect in self._effects.items():
            kind = key[0]
            if kind == "contents":
                target = targets[key]
                if isinstance(effect, ListVariable):
                    items = ", ".join(glue.reconstruct(i) for i in effect.items)
                    glue.line(f"{target}[:] = [{items}]")
                elif isinstance(effect, DictVariable):
                    replay_contents(glue, effect, target)
                elif isinstance(effect, SetVariable):
                    effect.replay(glue, target)
                elif isinstance(effect, DequeVariable):
                    effect.replay(glue, target)
            elif kind == "attr" and effect.deleted:
                # set and deleted by the trace, or there before: gone from the instance dict either way
                glue.line(f"{glue.reconstruct(effect.owner)}.__dict__.pop({effect.name!r}, None)")
            elif kind == "attr":
                owner, value = glue.reconstruct(effect.owner), glue.reconstruct(effect.value)
                if effect.plain or effect.base_setattr is not None:
                    setter = object.__setattr__ if effect.base_setattr is None else effect.base_setattr
                    glue.line(f"{glue.constant(setter)}({owner}, {effect.name!r}, {value})")
                elif effect.name.isidentifier() and not keyword.iskeyword(effect.name):
                    glue.line(f"{owner}.{effect.name} = {value}")
                else:  # setattr(obj, "we{ird}", v): not an identifier, written with setattr
                    glue.line(f"setattr({owner}, {effect.name!r}, {value})")
            elif kind == "global":
                glue.line(f"{effect.source.name()} = {glue.reconstruct(effect.value)}")
            elif kind == "hook":
                tensor, hook = effect
                handle = glue.fresh("hook_handle")
                glue.line(f"{handle} = {glue.reconstruct(tensor)}.register_hook({glue.reconstruct(hook)})")
                glue.hook_handles[key] = handle
            elif kind == "retain_grad":
                glue.line(f"{glue.reconstruct(effect)}.retain_grad()")
            elif kind == "cached_call":
                cached, args = effect
                glue.line(f"{glue.reconstruct(cached)}({', '.join(glue.reconstruct(a) for a in args)})")
            elif kind == "cell":
                glue.line(f"{effect.source.name()} = {glue.reconstruct(effect.contents)}")
            elif kind == "advance":
                iterator, source = effect
                if iterator.steps():
                    glue.line(f"{glue.constant(advance_by)}({source.name()}, {iterator.steps()})")


def advance_by(iterator: Any, steps: int) -> None:
    """Replay of `steps` next() calls the trace made on an iterator from outside the frame."""
    for _ in range(steps):
        next(iterator, None)
