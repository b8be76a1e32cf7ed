"""The data-only format of everything Kiln reads back from its cache: records, never code.

Cache files are pickles, but read with an unpickler that admits no global except Kiln's own record
types (frozen dataclasses and enums registered with `@record_type`, or defined under a package the
reader names) and a few plain builtins. Anything else a record holds travels as a *reference*: a
short tuple of plain data that a table of decoders (filled with `@reference`) turns back into the
object without calling anything the file chose: ATen overloads and torch constants by name,
sympy expressions rebuilt node by node from an allowlist of classes, and whatever the caller adds
(the frame cache names functions and classes). A planted `os.system` gadget is refused with
`RecordError`; so is any file that does not decode. Corresponds to torch's restricted
`weights_only` unpickler (torch/_weights_only_unpickler.py) and FxGraphCachePickler.
"""
from __future__ import annotations

import builtins
import dataclasses
import enum
import io
import pickle
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

# builtins a record may hold that pickle writes as globals; none of them runs code on construction
_BUILTIN_GLOBALS = {name: getattr(builtins, name) for name in ("set", "frozenset", "slice", "complex", "range",
                                                                "bytearray", "Ellipsis", "NotImplemented")}

# torch.fx's immutable containers (node arguments kept in lowered IR): list and dict subclasses
# whose construction runs no code of the file's choosing
_TORCH_CONTAINERS = frozenset({("torch.fx.immutable_collections", "immutable_list"),
                               ("torch.fx.immutable_collections", "immutable_dict")})

RECORD_TYPES: dict[tuple[str, str], type] = {}


class RecordError(Exception):
    """A cache file that is not a well-formed record: refused (the caller rebuilds what it held)."""


def record_type(cls: type) -> type:
    """Admit a dataclass or enum to cache files (a decorator beside its definition)."""
    if not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)):
        raise TypeError(f"{cls.__qualname__}: only dataclasses and enums can be cache records")
    RECORD_TYPES[(cls.__module__, cls.__qualname__)] = cls
    return cls


@dataclass(frozen=True)
class Reference:
    """How one kind of non-record object is written (`encode` -> plain data, or None when the object
    is not of this kind) and read back (`decode`, which raises RecordError or the caller's own
    exception when the data names nothing acceptable)."""

    kind: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


REFERENCES: dict[str, Reference] = {}


def reference(kind: str) -> Callable[[type], type]:
    """Register a class with static `encode`/`decode` as the built-in reference `kind`."""
    def register(cls: type) -> type:
        REFERENCES[kind] = Reference(kind, cls.encode, cls.decode)  # type: ignore[attr-defined]
        return cls
    return register


# ---------------------------------------------------------------------------------------------------
# Built-in references


@reference("op")
class _OpReference:
    """An ATen (or custom) operator overload, by its schema name."""

    @staticmethod
    def encode(obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return (obj._schema.name, obj._overloadname)
        return None

    @staticmethod
    def decode(data: Any) -> Any:
        name, overload = data
        namespace, _, op = str(name).partition("::")
        if not all(_IDENTIFIER.fullmatch(p) for p in (namespace, op, overload or "default")):
            raise RecordError(f"bad operator name {name!r}")
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        if not isinstance(found, torch._ops.OpOverload):
            raise RecordError(f"{name} is not an operator")
        return found


_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


@reference("torch")
class _TorchConstantReference:
    """A dtype, layout or memory format (`torch.float32`) by name; a device by its string."""

    @staticmethod
    def encode(obj: Any) -> Any:
        if isinstance(obj, torch.device):
            return ("device", str(obj))
        if isinstance(obj, _TORCH_CONSTANTS):
            return ("constant", str(obj).removeprefix("torch."))
        return None

    @staticmethod
    def decode(data: Any) -> Any:
        what, text = data
        if what == "device":
            return torch.device(str(text))  # torch parses the string; it names no code
        found = getattr(torch, str(text), None) if _IDENTIFIER.fullmatch(str(text)) else None
        if not isinstance(found, _TORCH_CONSTANTS):
            raise RecordError(f"torch.{text} is not a dtype, layout or memory format")
        return found


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TENSOR_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}
MAX_TENSOR_BYTES = 1 << 16  # a graph's small constants (a -100 ignore index, a mask); larger ones stay in memory


def _dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Every element at its own offset and no gaps (a permutation of a contiguous layout)."""
    expected = 1
    dims = [(n, st) for n, st in zip(shape, stride) if n != 1]
    for size, step in sorted(dims, key=lambda p: p[1]):
        if size == 0:
            return True
        if step != expected:
            return False
        expected *= size
    return True


@reference("tensor")
class _TensorReference:
    """A small constant CPU tensor as its dtype, sizes, strides and raw bytes: rebuilt into a fresh
    tensor (no storage is shared, nothing of the file's choosing is called). Only plain strided
    tensors that need no gradient: a Parameter or a subclass is not data."""

    @staticmethod
    def encode(obj: Any) -> Any:
        if type(obj) is not torch.Tensor or obj.layout is not torch.strided or obj.device.type != "cpu" \
                or obj.requires_grad or obj.is_neg() or obj.is_conj() or not _dense(obj.shape, obj.stride()):
            return None
        name = str(obj.dtype).removeprefix("torch.")
        if name not in _TENSOR_DTYPES or obj.numel() * obj.element_size() > MAX_TENSOR_BYTES:
            return None
        data = obj.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if obj.numel() else b""
        return (name, tuple(obj.shape), tuple(obj.stride()), data)

    @staticmethod
    def decode(data: Any) -> Any:
        name, shape, stride, raw = data
        dtype = _TENSOR_DTYPES.get(str(name))
        if dtype is None or not isinstance(raw, bytes) or len(raw) > MAX_TENSOR_BYTES:
            raise RecordError(f"bad tensor record of dtype {name!r}")
        shape, stride = tuple(int(n) for n in shape), tuple(int(n) for n in stride)
        if len(shape) != len(stride) or min(shape, default=0) < 0 or not _dense(shape, stride):
            raise RecordError("bad tensor sizes or strides")
        numel = 1
        for n in shape:
            numel *= n
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) != numel * itemsize:
            raise RecordError("tensor bytes do not match its sizes")
        try:
            out = torch.empty_strided(shape, stride, dtype=dtype)
            if numel:
                flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
                out.copy_(flat.view(shape))
        except RuntimeError as exc:  # strides that overlap or do not fit the sizes
            raise RecordError(f"bad tensor record: {exc}") from exc
        return out


@reference("sympy")
class _SympyReference:
    """A sympy expression as a tree of (class, children), rebuilt bottom-up. Only classes of sympy
    or Kiln that derive from sympy.Basic are admitted, and each gets already-built sympy objects as
    arguments, never strings: sympy parses a string argument with eval(). Symbol names must be
    identifiers, since generated code prints them."""

    @staticmethod
    def encode(obj: Any) -> Any:
        sympy = sys.modules.get("sympy")
        if sympy is None or not isinstance(obj, sympy.Basic):
            return None
        return _SympyReference._tree(obj, sympy)

    @staticmethod
    def _tree(e: Any, sympy: Any) -> Any:
        if isinstance(e, sympy.Symbol):
            return ("s", e.name, tuple(sorted((k, bool(v)) for k, v in e.assumptions0.items())))
        if isinstance(e, sympy.Integer):
            return ("i", int(e))
        if isinstance(e, sympy.Rational):
            return ("q", int(e.p), int(e.q))
        if isinstance(e, sympy.Float):
            # every digit its precision needs: str() keeps 15, and `size / 3` read back as
            # s0*0.333333333333333 gives 0.9999999999999989 for s0 = 3
            from mpmath.libmp import repr_dps, to_str  # sympy's own dependency, imported with it
            return ("f", to_str(e._mpf_, repr_dps(int(e._prec))), int(e._prec))
        cls = type(e)
        return ("e", cls.__module__, cls.__qualname__, tuple(_SympyReference._tree(a, sympy) for a in e.args))

    @staticmethod
    def decode(data: Any) -> Any:
        import sympy  # only graphs with symbolic sizes get here, and they load the lowering anyway

        return _SympyReference._build(data, sympy, 0)

    @staticmethod
    def _build(node: Any, sympy: Any, depth: int) -> Any:
        if depth > 200:
            raise RecordError("sympy expression nested too deep")
        tag = node[0]
        if tag == "s":
            _, name, assumptions = node
            if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
                raise RecordError(f"bad symbol name {name!r}")
            flags = {str(k): bool(v) for k, v in assumptions}
            if not all(_IDENTIFIER.fullmatch(k) for k in flags):
                raise RecordError("bad symbol assumption")
            return sympy.Symbol(name, **flags)
        if tag == "i":
            return sympy.Integer(int(node[1]))
        if tag == "q":
            return sympy.Rational(int(node[1]), int(node[2]))
        if tag == "f":
            text = str(node[1])
            if not re.fullmatch(r"[-+]?[0-9.eE+-]+|[-+]?(inf|nan)", text):
                raise RecordError(f"bad float {text!r}")
            return sympy.Float(text, precision=int(node[2]))
        if tag != "e":
            raise RecordError(f"bad sympy node {tag!r}")
        _, module, qualname, children = node
        cls = _lookup(str(module), str(qualname))
        if not (isinstance(cls, type) and issubclass(cls, sympy.Basic)
                and str(module).partition(".")[0] in ("sympy", "kiln")):
            raise RecordError(f"{module}.{qualname} is not an admitted sympy class")
        return cls(*[_SympyReference._build(c, sympy, depth + 1) for c in children])


def _lookup(module: str, qualname: str) -> Any:
    """`module.qualname` among modules already imported (reading a record never imports)."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        raise RecordError(f"module {module} is not imported")
    for part in qualname.split("."):
        if not _IDENTIFIER.fullmatch(part):
            raise RecordError(f"bad name {qualname!r}")
        obj = getattr(obj, part, None)
        if obj is None:
            raise RecordError(f"{module}.{qualname} does not exist")
    return obj


# ---------------------------------------------------------------------------------------------------
# Writing and reading


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, references: Sequence[Reference], types: Iterable[type]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._references = references
        self._types = {id(t) for t in types}

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _PLAIN_TYPES or (isinstance(obj, type) and (RECORD_TYPES.get(_name_of(obj)) is obj
                                                                    or id(obj) in self._types)):
            return None  # plain data, and record classes (written as globals that find_class admits)
        for ref in self._references:
            data = ref.encode(obj)
            if data is not None:
                return (ref.kind, data)
        return None


_PLAIN_TYPES = frozenset({int, float, bool, str, bytes, type(None), tuple, list, dict})


def _name_of(cls: type) -> tuple[str, str]:
    return (cls.__module__, cls.__qualname__)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, references: dict[str, Reference], packages: tuple[str, ...],
                 types: dict[tuple[str, str], type]) -> None:
        super().__init__(file)
        self._references = references
        self._packages = packages
        self._types = types

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTIN_GLOBALS:
            return _BUILTIN_GLOBALS[name]
        if (module, name) in _TORCH_CONTAINERS and module in sys.modules:
            return getattr(sys.modules[module], name)
        cls = RECORD_TYPES.get((module, name)) or self._types.get((module, name))
        if cls is not None:
            return cls
        if module.startswith(self._packages):
            found = _lookup(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found
        raise RecordError(f"{module}.{name} is not an admitted record type")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] in self._references):
            raise RecordError(f"unknown reference {pid!r:.80}")
        # Not the object itself: pickle's REDUCE opcode calls whatever callable is on its stack, and
        # a named function or operator must never be that callable. Placeholders are swapped for
        # the objects once the whole file is read.
        return _Placeholder(self._references[pid[0]].decode(pid[1]))


class _Placeholder:
    """An inert stand-in for a decoded reference while the file is being read."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        raise TypeError("a placeholder is never written")


def _substitute(value: Any, memo: dict[int, Any]) -> Any:
    """`value` with every placeholder replaced by its object (records are updated in place)."""
    known = memo.get(id(value))
    if known is not None:
        return known[0]
    kind = type(value)
    if kind is _Placeholder:
        out = value.value
    elif kind in (int, float, bool, str, bytes, type(None), complex):
        return value
    elif kind is tuple:
        out = tuple(_substitute(v, memo) for v in value)
    elif kind is list:
        memo[id(value)] = (value,)
        value[:] = [_substitute(v, memo) for v in value]
        out = value
    elif kind is dict:
        memo[id(value)] = (value,)
        items = [(_substitute(k, memo), _substitute(v, memo)) for k, v in value.items()]
        value.clear()
        value.update(items)
        out = value
    elif kind in (set, frozenset):
        out = kind(_substitute(v, memo) for v in value)
    elif isinstance(value, list):  # torch.fx's immutable_list (a lowered node's arguments): rebuilt
        out = kind([_substitute(v, memo) for v in value])
    elif isinstance(value, dict):  # and immutable_dict
        out = kind({_substitute(k, memo): _substitute(v, memo) for k, v in value.items()})
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        memo[id(value)] = (value,)
        for name, field_value in list(vars(value).items()):
            object.__setattr__(value, name, _substitute(field_value, memo))
        out = value
    else:
        return value  # enums, slices, sympy and torch values hold no placeholders
    memo[id(value)] = (out,)
    return out


def dumps(value: Any, references: Iterable[Reference] = (), types: Iterable[type] = ()) -> bytes:
    """`value` (records, plain data, and objects some reference names) as bytes; raises what an
    encoder raises, or pickle's error for an object nothing admits. `types`: record classes of the
    caller's, written by name (as `loads` must admit them)."""
    buffer = io.BytesIO()
    _Pickler(buffer, [*references, *REFERENCES.values()], types).dump(value)
    return buffer.getvalue()


def loads(data: bytes, references: Iterable[Reference] = (), packages: Sequence[str] = (),
          types: Iterable[type] = ()) -> Any:
    """The value `dumps` wrote. Record types: those registered with @record_type, the dataclasses
    and enums in `types`, and those of the modules under `packages` (e.g. "kiln.lower."). Any
    other global, a reference that does not decode, or a malformed file raises RecordError (the
    caller's own reference exceptions pass through)."""
    table = dict(REFERENCES)
    table.update((r.kind, r) for r in references)
    extra = {(t.__module__, t.__qualname__): t for t in types
             if dataclasses.is_dataclass(t) or issubclass(t, enum.Enum)}
    try:
        loaded = _Unpickler(io.BytesIO(data), table, tuple(packages), extra).load()
    except RecordError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, MemoryError, OverflowError, RecursionError) as exc:
        raise RecordError(f"undecodable record: {type(exc).__name__}: {exc}") from exc
    return _substitute(loaded, {})


def strings_in(value: Any, owner: str = "", depth: int = 0) -> Iterable[tuple[str, str]]:
    """Every string a record holds, as (the `Class.field` it sits in, the string): what a reader
    checks before it prints a record's names into code (a name is text the file chose)."""
    if depth > 500:
        raise RecordError("a record nested too deep")
    if isinstance(value, str):
        yield owner, value
    elif isinstance(value, (tuple, list, set, frozenset)):
        for item in value:
            yield from strings_in(item, owner, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings_in(key, owner, depth + 1)
            yield from strings_in(item, owner, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from strings_in(getattr(value, f.name), f"{type(value).__qualname__}.{f.name}", depth + 1)
