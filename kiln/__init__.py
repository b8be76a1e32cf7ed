"""Kiln: torch.compile rebuilt in plain Python.

The public API mirrors torch.compile (see DESIGN.md): `kiln.compile`, `kiln.explain`, `kiln.reset`,
`kiln.stats`, `kiln.mark_dynamic`, `kiln.disable`, `kiln.allow_in_graph`, `kiln.config`.
"""
from kiln import config

__all__ = ["config"]
