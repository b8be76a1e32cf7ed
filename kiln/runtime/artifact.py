"""The artifact protocol: a compiled graph that describes itself as data and is rebuilt from it.

A backend's output (the callable a backend returns for one graph) may offer
`artifact_recipe() -> Recipe | None`: plain data (records of kiln.runtime.records) from which an
equal callable can be made in another process, or None when it holds something that cannot travel
(a constant tensor, a Python callable of the user's). The runtime owns every loader: a table from
recipe kind to `load(fields) -> callable`, filled with `@loader(kind)` beside each runtime type, so
rebuilding needs neither the stage that compiled the artifact nor the frame cache that stored it.
The frame cache (kiln.capture.persist) calls only `describe` and `rebuild`.
PyTorch counterpart: the serializable CompiledFxGraph / AOTAutogradCacheEntry of torch's caches.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

from kiln.runtime.records import record_type

RECIPE_ATTR = "artifact_recipe"  # the method (or attribute holding a function) of the protocol

LOADERS: dict[str, Callable[[dict[str, Any]], Any]] = {}
# runtime modules whose import fills LOADERS; rebuild imports them on first use
_LOADER_MODULES = ("kiln.runtime.kernel_wrapper", "kiln.runtime.aot", "kiln.runtime.native", "kiln.runtime.pieces")


@record_type
@dataclass(frozen=True)
class Recipe:
    """One artifact as data: `kind` names its loader, `fields` are that loader's arguments."""

    kind: str
    fields: dict[str, Any]


class ArtifactError(Exception):
    """A recipe names no loader or its loader refused it (the caller compiles again)."""


def loader(kind: str) -> Callable[[Callable[[dict[str, Any]], Any]], Callable[[dict[str, Any]], Any]]:
    """Register `load(fields) -> callable` as the way to rebuild artifacts of `kind`."""
    def register(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        if kind in LOADERS and LOADERS[kind] is not fn:
            raise ValueError(f"artifact kind {kind!r} already has a loader")
        LOADERS[kind] = fn
        return fn
    return register


def describe(artifact: Any) -> Recipe | None:
    """The recipe of a backend's output, or None when it has none (it is then not persisted)."""
    method = getattr(artifact, RECIPE_ATTR, None)
    if not callable(method):
        return None
    recipe = method()
    return recipe if isinstance(recipe, Recipe) else None


def rebuild(recipe: Recipe) -> Any:
    """The callable a recipe describes; ArtifactError when no loader admits it, or the loader's
    own error (a kernel library that left the cache raises kiln.runtime.build.LibraryError)."""
    for name in _LOADER_MODULES:
        if name not in sys.modules:
            importlib.import_module(name)
    if not isinstance(recipe, Recipe) or not isinstance(recipe.fields, dict):
        raise ArtifactError(f"not a recipe: {type(recipe).__name__}")
    load = LOADERS.get(recipe.kind)
    if load is None:
        raise ArtifactError(f"no loader for artifacts of kind {recipe.kind!r}")
    return load(recipe.fields)
