"""The runtime wrapper's compile-time half: where each size symbol is read at run time.

The runtime itself (AotRuntime, the autograd.Function over the compiled forward and backward) lives
in kiln.runtime.aot, which imports only torch so that a graph loaded from the persistent frame
cache runs without the tracer; it is re-exported here for kiln.autograd.backend.
Input: the traced example inputs. Output: a SymbolBinding for AotRuntime.
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py.
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from kiln.autograd.tracer import expr_of
from kiln.runtime.aot import AotRuntime, make_autograd_function

__all__ = ["AotRuntime", "SymbolBinding", "bind_symbols", "make_autograd_function"]

# symbol -> (flat input index, dim); dim None means the input is itself the SymInt
SymbolBinding = dict[sympy.Symbol, tuple[int, int | None]]


def bind_symbols(values: Sequence[Any]) -> SymbolBinding:
    """Where each size symbol can be read from at runtime, from the traced example inputs."""
    binding: SymbolBinding = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.SymInt):
            expr = expr_of(v)
            if isinstance(expr, sympy.Symbol):
                binding.setdefault(expr, (i, None))
        elif isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt):
                    expr = expr_of(s)
                    if isinstance(expr, sympy.Symbol):
                        binding.setdefault(expr, (i, d))
    return binding
