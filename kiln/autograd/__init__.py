"""kiln.autograd: AOT autograd. Captured graphs become functional ATen forward and backward graphs.

Pipeline: tracer (dispatch-mode ATen tracer) -> functionalize (no mutation, no aliasing) -> joint
(forward+backward traced ahead of time) -> partition (min-cut saves vs recomputes) -> runtime
(torch.autograd.Function, mutation epilogue, alias rebuilding). Contract in docs/seams.md.
PyTorch counterpart: torch/_functorch/aot_autograd.py.
"""
from kiln.autograd.backend import (AotReport, aot_autograd, aot_eager, aot_saved_bytes, compile_with_aot,
                                   recent_reports, trace_aten)
from kiln.autograd.decompose import core_aten_decompositions
from kiln.autograd.functionalize import verify_aten_graph
from kiln.autograd.partition import Partition, SavedValue

__all__ = [
    "AotReport", "Partition", "SavedValue", "aot_autograd", "aot_eager", "aot_saved_bytes",
    "compile_with_aot", "core_aten_decompositions", "recent_reports", "trace_aten", "verify_aten_graph",
]
