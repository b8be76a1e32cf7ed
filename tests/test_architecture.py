"""The import graph of kiln/: imports point down the pipeline, and stage packages form no cycle.

The graph is built from the sources with `ast` (imports inside functions count: a lazy import is
still a dependency), so the test needs no import of kiln. Each module belongs to one unit: a stage
package (`kiln.capture`, `kiln.lower`, ...) or a top-level module (`kiln.api`, `kiln.log`, ...).
`ALLOWED` says which units a unit may import; the layering is the one docs/seams.md states in its
opening paragraph, the packages taken in the pipeline order of the README's "Where each idea lives".
"""
from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

KILN = pathlib.Path(__file__).resolve().parent.parent / "kiln"

# The bottom: every unit may import these; they import nothing of Kiln but each other (see the end of
# the table). compile_time is the per-stage compile profile every stage stamps, logged through log.
BASE = frozenset({"config", "errors", "log", "compile_time"})

# unit -> the units it may import (besides itself and BASE). Reading down the table walks down the
# pipeline; a unit only names units further down, which is what keeps the graph acyclic.
ALLOWED: dict[str, frozenset[str]] = {
    # The package root assembles the public API, debug tools included: nothing imports it back.
    "kiln": frozenset({"api", "backends", "symbolic", "debug"}),
    # `python -m kiln` (the diagnostics command line) runs on top of everything.
    "__main__": frozenset({"kiln", "api", "backends", "debug", "capture", "autograd", "lower", "runtime",
                           "fake", "symbolic"}),
    # debug reads every stage (explain compiles through the api); no stage imports debug.
    "debug": frozenset({"api", "backends", "capture", "autograd", "lower", "runtime", "fake", "symbolic"}),
    # kiln.compile: the entry (capture) with a backend looked up by name.
    "api": frozenset({"backends", "capture", "autograd", "lower", "runtime", "fake", "symbolic"}),
    # Backends chain AOT autograd and the lowering; capture only ever sees the callable.
    "backends": frozenset({"autograd", "lower", "runtime", "fake", "symbolic"}),
    # Capture and autograd use fake and symbolic; both hand compiled graphs to the runtime.
    "capture": frozenset({"fake", "symbolic", "runtime"}),
    "autograd": frozenset({"fake", "symbolic", "runtime"}),
    # The lowering uses symbolic sizes and builds its artifacts with the runtime.
    "lower": frozenset({"fake", "symbolic", "runtime"}),
    # The runtime owns the compiled-artifact protocol: it takes lower's output as data, not imports.
    "runtime": frozenset({"symbolic"}),
    "fake": frozenset({"symbolic"}),
    "symbolic": frozenset(),
    "compile_time": frozenset({"log", "config"}),
    "log": frozenset({"config"}),
    "config": frozenset(),
    "errors": frozenset(),
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(KILN.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_exists(name: str) -> bool:
    rel = pathlib.Path(*name.split("."))
    return (KILN.parent / rel).with_suffix(".py").exists() or (KILN.parent / rel / "__init__.py").exists()


def _targets(node: ast.AST, package: str) -> list[str]:
    """The kiln modules one import statement loads (`from kiln import log` loads kiln.log)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    found = []
    for alias in node.names:
        submodule = f"{module}.{alias.name}"
        found.append(submodule if _module_exists(submodule) else module)
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the import sites, `module:line -> target`."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(KILN.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package):
                if target != "kiln" and not target.startswith("kiln."):
                    continue
                source_unit, target_unit = _unit(module), _unit(target)
                if source_unit != target_unit:
                    edges[(source_unit, target_unit)].append(f"{module}:{node.lineno} -> {target}")
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one unit (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _allowed(source: str, target: str) -> bool:
    return target in BASE and source not in BASE or target in ALLOWED[source]


def test_every_unit_is_in_the_table():
    units = {_unit(_module_name(p)) for p in KILN.rglob("*.py")}
    assert units == set(ALLOWED), f"add to ALLOWED: {sorted(units - set(ALLOWED))}; " \
                                  f"gone: {sorted(set(ALLOWED) - units)}"


def test_the_table_is_acyclic():
    graph = {unit: set(targets) | (set(BASE) if unit not in BASE else set()) for unit, targets in ALLOWED.items()}
    assert _cycles(graph) == []


def test_imports_point_down_the_pipeline():
    bad = {edge: sites for edge, sites in import_edges().items()
           if not _allowed(*edge)}
    message = "\n".join(f"{a} may not import {b}:\n    " + "\n    ".join(sites) for (a, b), sites in sorted(bad.items()))
    assert not bad, message


def test_no_cycles_between_units():
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in import_edges():
        graph[source].add(target)
    assert _cycles(graph) == []



def test_lazy_and_relative_imports_are_edges():
    tree = ast.parse("def f():\n    from ..lower import ir\n    from kiln import log\n    import kiln.fake.mode\n")
    found = [target for node in ast.walk(tree) for target in _targets(node, "kiln.capture")]
    assert sorted(found) == ["kiln.fake.mode", "kiln.log", "kiln.lower.ir"]
    assert not _allowed("lower", "debug") and _allowed("debug", "lower") and _allowed("lower", "log")
