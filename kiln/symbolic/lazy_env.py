"""LazyShapeEnv: a capture's ShapeEnv, made when the capture first needs a symbol.

A capture whose sizes are all static (no mark_dynamic, no automatic dynamic dim, no dynamic int)
asks its shape environment only for the guards it recorded and to label reads (`because`): with
no symbol there are no guards to record, so neither question needs a ShapeEnv, and kiln.symbolic's
ShapeEnv needs sympy (about a third of a second to import). Everything else (create_symbol,
constrain, ...) makes the real ShapeEnv through kiln.symbolic's guarded import and is forwarded to it.
Sits between capture (kiln/capture/tracer.py makes one per capture) and kiln.symbolic.shape_env.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager


class LazyShapeEnv:
    """Stands for one ShapeEnv; `made` is the ShapeEnv once some caller needed it, else None."""

    def __init__(self, location_provider: Callable[[], str | None]) -> None:
        self.location_provider = location_provider
        self.made: Any = None

    def env(self) -> Any:
        """The ShapeEnv itself, made (and sympy imported) on the first call."""
        if self.made is None:
            from kiln import symbolic  # a static capture never gets here: sympy loads with the first symbol

            made = symbolic.ShapeEnv()
            made.location_provider = self.location_provider
            self.made = made
        return self.made

    @property
    def guards(self) -> list:
        return [] if self.made is None else self.made.guards

    @property
    def runtime_asserts(self) -> list:
        return [] if self.made is None else self.made.runtime_asserts

    def because(self, reason: str) -> ContextManager[None]:
        # Only create_symbol* and the unbacked kinds make symbols, and they make the ShapeEnv
        # first; a block entered before any symbol exists reads plain ints and records nothing.
        if self.made is None:
            return contextlib.nullcontext()
        return self.made.because(reason)

    def __getattr__(self, name: str) -> Any:
        # called only for names this class lacks: the ShapeEnv's own methods and fields (not dunders,
        # nor this class's own fields on an instance copy made without __init__)
        if name.startswith("__") or name in ("made", "location_provider"):
            raise AttributeError(name)
        return getattr(self.env(), name)

    def __repr__(self) -> str:
        return repr(self.made) if self.made is not None else "LazyShapeEnv(no symbol yet)"
