"""Diagnostics: explain(), the KILN_DEBUG dump, the run report, the bisector, the minifier, the lint.

Everything here reads the stages' IR objects; no stage imports this package (logging is kiln.log).
`kiln.debug.bisect(fn, *args)` and `kiln.debug.minify(fn, *args)` are the functions of the modules
of the same name (as `kiln.lower.schedule` is the pass); `python -m kiln` runs them from a shell.
"""
from kiln.debug.bisect import BisectResult, bisect
from kiln.debug.minify import MinifyResult, minify, minify_graph

__all__ = ["BisectResult", "MinifyResult", "bisect", "minify", "minify_graph"]
