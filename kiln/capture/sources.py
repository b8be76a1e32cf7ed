"""Sources: where a traced value came from, as a Python expression over the frame environment.

Every value the tracer reads from outside (an argument, a global, an attribute of a module, a closure
cell) carries a `Source`. Its `name()` is an expression in the environment `L, G, F` of docs/seams.md;
guards check that expression and the glue re-reads it at run time. The counterpart of
torch/_dynamo/source.py.
"""
from __future__ import annotations

import keyword
import math
from dataclasses import dataclass

import torch


class Source:
    """Base of the source records; subclasses are frozen dataclasses with a `name()` expression."""

    def name(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name()


@dataclass(frozen=True)
class LocalSource(Source):
    """A local of the frame being captured (an argument, or a resume function's stack slot)."""

    local: str

    def name(self) -> str:
        return f"L[{self.local!r}]"


def resume_stack_slot(source: Source) -> bool:
    """True when `source` reads from a stack slot the glue passed to a resume function (`___stackN`)."""
    while not isinstance(source, LocalSource):
        base = getattr(source, "base", None)
        if base is None:
            return False
        source = base
    return source.local.startswith("___stack")


def source_chain(source: Source) -> list[Source]:
    """`source` and every source it is read through, down to its root (a local, a global, a
    closure cell of the frame's own function, or a process-wide read)."""
    chain = [source]
    while True:
        base = getattr(source, "base", None)
        if base is None and isinstance(source, ClosureSource):
            base = source.fn
        if not isinstance(base, Source):
            return chain
        source = base
        chain.append(source)


@dataclass(frozen=True)
class GlobalSource(Source):
    """A global of the frame's own module (`G`), or of another module by its name in sys.modules."""

    global_name: str
    module: str | None = None

    def name(self) -> str:
        if self.module is None:
            return f"G[{self.global_name!r}]"
        # Inlined functions from other modules see their own globals; the only way to reach them
        # from L, G, F is through sys.modules.
        return f"__import__('sys').modules[{self.module!r}].__dict__[{self.global_name!r}]"


@dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of closure cell `index` of the function whose source is `fn` (None: `F`)."""

    index: int
    fn: Source | None = None

    def name(self) -> str:
        base = "F" if self.fn is None else self.fn.name()
        return f"{base}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class AttrSource(Source):
    """`base.attr`."""

    base: Source
    attr: str

    def name(self) -> str:
        if self.attr.isidentifier() and not keyword.iskeyword(self.attr):
            return f"{self.base.name()}.{self.attr}"
        # setattr(obj, "we{ird}", v): a name that is not an identifier is read with getattr
        return f"getattr({self.base.name()}, {self.attr!r})"


@dataclass(frozen=True)
class ItemSource(Source):
    """`base[key]` for a constant key (an index of a list/tuple, a key of a dict)."""

    base: Source
    key: object

    def name(self) -> str:
        return f"{self.base.name()}[{constant_literal(self.key)}]"


@dataclass(frozen=True)
class RawItemSource(Source):
    """`dict.__getitem__(base, key)`: the stored value of a dict subclass whose own __getitem__
    computes something else."""

    base: Source
    key: object

    def name(self) -> str:
        return f"dict.__getitem__({self.base.name()}, {constant_literal(self.key)})"


@dataclass(frozen=True)
class DictValueSource(Source):
    """The value at position `index` of dict `base`, for a key without a literal (a class, a
    function): a keys guard on `base` pins which key sits at that position."""

    base: Source
    index: int

    def name(self) -> str:
        return f"list({self.base.name()}.values())[{self.index}]"


@dataclass(frozen=True)
class DictKeySource(Source):
    """The key at position `index` of dict `base` (a tensor key, hashed by identity): a length
    guard on `base` and a guard on each key pin which key sits where."""

    base: Source
    index: int

    def name(self) -> str:
        return f"list({self.base.name()}.keys())[{self.index}]"


@dataclass(frozen=True)
class ObjectKeySource(Source):
    """`base[key]` where the key is the object read from the source `key`: a dict keyed by identity
    (an optimizer's state, keyed by its parameters), indexed without a scan of its keys."""

    base: Source
    key: Source

    def name(self) -> str:
        return f"{self.base.name()}[{self.key.name()}]"


@dataclass(frozen=True)
class WeakRefCallSource(Source):
    """`base()` for a weak reference at `base`: the object it refers to (None once that is gone)."""

    base: Source

    def name(self) -> str:
        return f"{self.base.name()}()"


@dataclass(frozen=True)
class CallSource(Source):
    """`base.method()` for argument-free reads such as `keys()`, `size()` or `__reduce__()`."""

    base: Source
    method: str

    def name(self) -> str:
        return f"{self.base.name()}.{self.method}()"


@dataclass(frozen=True)
class ModuleFunctionCallSource(Source):
    """`module.function()` of a module in sys.modules: process state such as abc's cache token."""

    module: str
    function: str

    def name(self) -> str:
        return f"{GlobalSource(self.function, self.module).name()}()"


@dataclass(frozen=True)
class EnvironSource(Source):
    """`os.environ.get(key)`: one environment variable, None when unset."""

    key: str

    def name(self) -> str:
        return f"__import__('os').environ.get({self.key!r})"


@dataclass(frozen=True)
class TypeSource(Source):
    """`type(base)`."""

    base: Source

    def name(self) -> str:
        return f"type({self.base.name()})"


def constant_literal(value: object) -> str:
    """A Python literal for a hashable constant key; ValueError for anything without one."""
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return repr(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        raise ValueError(f"no literal for {value!r}")
    if isinstance(value, tuple):
        inner = ", ".join(constant_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, torch.dtype):  # a dict keyed by dtypes (`table[x.dtype]`)
        return f"__import__('torch').{str(value).removeprefix('torch.')}"
    if isinstance(value, torch.device):
        return f"__import__('torch').device({str(value)!r})"
    raise ValueError(f"no literal for {value!r}")
