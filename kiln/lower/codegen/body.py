"""What both code generators share at the expression level: the render table protocol (one table of
loop-op renderings per target, filled by decorators) and BodyWriter, the base of the writers that
print a body Value as statements with common subexpressions shared.

A writer names each computed value once (`t0`, `t1`, ... from the kernel's one counter) and caches
it per Value; the targets differ only in how a temporary is declared, how an index prints, and how
a constant, a load, a masked value and an op's extra statements look: codegen/cpp.py and
codegen/triton.py fill those in.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import Const, Index, Load, Masked, Op, Value

Render = Callable[[Op, Sequence[str]], str]


class RenderTable(dict[str, Render]):
    """One target's renderings of the loop ops (kiln.lower.ops), by op name. A rendering takes the
    op and its rendered arguments and returns the expression's text."""

    def renders(self, *names: str) -> Callable[[Render], Render]:
        """Decorator: the function renders each named op (registering a name twice is a mistake)."""
        def register(fn: Render) -> Render:
            for name in names:
                assert name not in self, f"{name} rendered twice"
                self[name] = fn
            return fn
        return register

    def missing(self) -> set[str]:
        """Loop ops without a rendering (kept empty; checked by a test per target)."""
        return set(ops.OPS) - set(self)


def arg_dtype(v: Op) -> torch.dtype:
    """The dtype an op computes on: its first argument's (its own for ops without arguments)."""
    return v.args[0].dtype if v.args else v.dtype


class BodyWriter(ABC):
    """Emits statements for body values, each value computed once. Subclasses give the target's
    `RENDER` table and say how index expressions, temporaries, constants, index values, loads and
    masked values are written."""

    RENDER: RenderTable

    def __init__(self, storage: dict[str, torch.dtype], sub: dict, locals_: dict[tuple[str, sympy.Expr], str],
                 counter: list[int]) -> None:
        self.lines: list[str] = []
        self.cache: dict[Value, str] = {}
        self.storage = storage  # buffer -> the dtype it is stored in
        self.sub = sub  # the node's index variables -> the kernel's
        self.locals = locals_  # (buffer, index) -> the name holding a value this kernel already has
        self.counter = counter  # the kernel's temporary counter, shared by all its writers

    def tmp(self, text: str, dtype: torch.dtype) -> str:
        """A new temporary holding `text`, a value of `dtype`."""
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(self.declaration(name, text, dtype))
        return name

    def place(self, e: sympy.Expr) -> sympy.Expr:
        """A node's index expression over the kernel's variables."""
        return sympy.expand(e.xreplace(self.sub))

    def index(self, e: sympy.Expr) -> str:
        return self.print_index(self.place(e))

    def value(self, v: Value) -> str:
        if v in self.cache:
            return self.cache[v]
        if isinstance(v, Const):
            out = self.const(v)
        elif isinstance(v, Index):
            out = self.index_value(v)
        elif isinstance(v, Load):
            key = self.place(v.index)
            if v.extra is None and (v.buffer, key) in self.locals:
                out = self.locals[(v.buffer, key)]
            else:
                out = self.load(v, key)
        elif isinstance(v, Masked):
            out = self.masked(v)
        else:
            assert isinstance(v, Op)
            args = [self.value(a) for a in v.args]
            out = self.tmp(self.RENDER[v.name](v, args), v.dtype)
            self.after_op(v, args, out)
        self.cache[v] = out
        return out

    # ------------------------------------------------------------------ what each target writes

    @abstractmethod
    def print_index(self, e: sympy.Expr) -> str:
        """An index expression over the kernel's variables, in the target's language."""

    @abstractmethod
    def declaration(self, name: str, text: str, dtype: torch.dtype) -> str:
        """The statement that makes `name` hold `text`."""

    @abstractmethod
    def const(self, v: Const) -> str: ...

    @abstractmethod
    def index_value(self, v: Index) -> str: ...

    @abstractmethod
    def load(self, v: Load, key: sympy.Expr) -> str:
        """A load from memory at `key` (the index over the kernel's variables), plus `v.extra`."""

    @abstractmethod
    def masked(self, v: Masked) -> str:
        """`v.body` where `v.mask` holds, else `v.other`, each side computed only where it is taken."""

    def after_op(self, v: Op, args: Sequence[str], out: str) -> None:
        """Statements after an op's temporary (none by default)."""
