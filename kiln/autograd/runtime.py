"""The runtime wrapper's compile-time half: where each size symbol is read at run time.

The runtime itself (AotRuntime, the autograd.Function over the compiled forward and backward) lives
in kiln.runtime.aot, which imports only torch so that a graph loaded from the persistent frame
cache runs without the tracer; it is re-exported here for kiln.autograd.backend.
Input: the traced example inputs. Output: a SymbolBinding for AotRuntime. Also here: the wrapper
that gives outputs without a derivative eager's error at backward time (`with_missing_derivatives`).
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.autograd.tracer import expr_of
from kiln.runtime.aot import INPUT_UPDATES, MODULE_STATE, AotRuntime, make_autograd_function

__all__ = ["INPUT_UPDATES", "MODULE_STATE", "AotRuntime", "SymbolBinding", "bind_symbols", "make_autograd_function", "with_missing_derivatives"]

# symbol -> (flat input index, dim); dim None means the input is itself the SymInt
SymbolBinding = dict[sympy.Symbol, tuple[int, int | None]]


def bind_symbols(values: Sequence[Any]) -> SymbolBinding:
    """Where each size symbol can be read from at runtime, from the traced example inputs."""
    binding: SymbolBinding = {}
    for i, v in enumerate(values):
        if isinstance(v, (torch.SymInt, torch.SymFloat)):  # SymFloat: a float argument (`x[: int(n * f)]`)
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


class MissingDerivative(torch.autograd.Function):
    """An output whose backward reaches an op without a derivative: it requires grad (as eager's
    does), and its backward, run only when a backward reaches it, raises eager's error."""

    @staticmethod
    def forward(ctx: Any, message: str, value: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.message = message
        return value.detach()

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(ctx.message)


class WithMissingDerivatives:
    """A compiled autograd.Function (`fast_apply`) whose outputs at `missing` (position -> eager's
    error) get a MissingDerivative node on the inputs that require grad. It has no recipe: such a
    graph is not persisted."""

    def __init__(self, function: Any, missing: dict[int, str]) -> None:
        self.function = function
        self.missing = missing
        self.run: Callable[..., Any] = getattr(function, "fast_apply", function.apply)

    def fast_apply(self, *args: Any) -> Any:
        outs = list(self.run(*args))
        if torch.is_grad_enabled():
            sources = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            for k, message in self.missing.items():
                if sources and isinstance(outs[k], torch.Tensor):
                    outs[k] = MissingDerivative.apply(message, outs[k], *sources)
        return tuple(outs)

    apply = fast_apply


def with_missing_derivatives(function: Any, missing: Sequence[tuple[int, str]]) -> Any:
    """`function`, or a WithMissingDerivatives over it when some outputs have no derivative."""
    return WithMissingDerivatives(function, dict(missing)) if missing else function
