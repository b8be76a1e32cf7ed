"""Kiln: torch.compile rebuilt in plain Python.

The public API mirrors torch.compile (see README.md): `kiln.compile`, `kiln.explain`, `kiln.reset`,
`kiln.stats`, `kiln.mark_dynamic`, `kiln.disable`, `kiln.allow_in_graph`, `kiln.config`, and the
backend registry (`kiln.register_backend`, `kiln.list_backends`, `kiln.inductor_backend`).
"""
from kiln import config
from kiln.api import OptimizedModule, allow_in_graph, compile, disable, graph_break, reset, stats
from kiln.backends import inductor_backend, list_backends, register_backend
from kiln.debug import hooks as _debug_hooks
from kiln.debug.explain import explain
from kiln.symbolic.marks import mark_dynamic, mark_static, maybe_mark_dynamic

# debug reads every stage and no stage imports it: the package root attaches its dump, run report
# and repro to the stages here (each acts only while its setting is on).
_debug_hooks.install()

__all__ = [
    "OptimizedModule", "allow_in_graph", "compile", "config", "disable", "explain", "graph_break", "inductor_backend",
    "list_backends", "mark_dynamic", "mark_static", "maybe_mark_dynamic", "register_backend", "reset",
    "stats",
]
