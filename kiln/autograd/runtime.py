"""The runtime wrapper: what capture calls with real tensors in place of the traced graph.

It appends the module tensors the trace lifted, runs the compiled forward (inside a
torch.autograd.Function when a backward was compiled, so `loss.backward()` runs the compiled
backward), copies the new values of mutated inputs back into the caller's tensors exactly once,
and rebuilds outputs that alias inputs or each other as views so user code sees eager's aliasing.
Input: compiled callables plus FunctionalMeta. Output: a callable over the flat real inputs.
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch
from torch.utils._pytree import TreeSpec, tree_unflatten

from kiln.autograd.functionalize import FunctionalMeta, OutputInfo
from kiln.autograd.tracer import expr_of

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


def _evaluate(x: Any, binding: SymbolBinding, args: Sequence[Any]) -> int:
    if not isinstance(x, torch.SymInt):
        return int(x)
    expr = expr_of(x)
    values = {}
    for sym in expr.free_symbols:
        index, dim = binding[sym]
        values[sym] = sympy.Integer(args[index] if dim is None else args[index].shape[dim])
    return int(expr.xreplace(values))


def _rebuild_view(base: torch.Tensor, info: OutputInfo, binding: SymbolBinding,
                  args: Sequence[Any]) -> torch.Tensor:
    size, stride, offset = info.view
    return base.as_strided([_evaluate(s, binding, args) for s in size],
                           [_evaluate(s, binding, args) for s in stride],
                           _evaluate(offset, binding, args))


def make_autograd_function(compiled_forward: Callable, compiled_backward: Callable, *,
                           num_forward_outputs: int,
                           num_saved_tensors: int, differentiable: Sequence[int],
                           primal_needs_grad: Sequence[bool]) -> type[torch.autograd.Function]:
    """A torch.autograd.Function whose forward and backward are the two compiled graphs."""
    diff = tuple(differentiable)
    non_diff = tuple(k for k in range(num_forward_outputs) if k not in diff)

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            # The joint graph was traced with grad mode on, and some kernels look at it (the
            # mkldnn RNN returns its workspace for the backward only then); detached inputs keep
            # autograd from recording anything in here.
            detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
            with torch.enable_grad():
                outs = compiled_forward(*detached)
            fw_outs = outs[:num_forward_outputs]
            saved = outs[num_forward_outputs:num_forward_outputs + num_saved_tensors]
            ctx.save_for_backward(*saved)
            ctx.symints = tuple(outs[num_forward_outputs + num_saved_tensors:])
            ctx.mark_non_differentiable(*[fw_outs[k] for k in non_diff
                                          if isinstance(fw_outs[k], torch.Tensor)])
            return tuple(fw_outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            # the backward graph was traced with contiguous tangents; a zero grad arrives for an
            # unused output because materialize_grads is on
            tangents = [grad_outputs[k].contiguous() for k in diff]
            grads = compiled_backward(*ctx.saved_tensors, *ctx.symints, *tangents)
            return tuple(g if need else None for g, need in zip(grads, primal_needs_grad))

    return CompiledFunction


class AotRuntime:
    """The callable handed back to capture for one graph."""

    def __init__(self, *, root: torch.nn.Module, lifted: tuple[str, ...], meta: FunctionalMeta,
                 out_spec: TreeSpec, binding: SymbolBinding, forward: Callable,
                 function: type[torch.autograd.Function] | None = None, report: Any = None) -> None:
        self.root = root
        self.lifted = lifted
        self.meta = meta
        self.out_spec = out_spec
        self.binding = binding
        self.forward = forward
        self.function = function
        self.aot_report = report

    def _lifted_values(self) -> list[torch.Tensor]:
        values = []
        for path in self.lifted:
            obj: Any = self.root
            for part in path.split("."):
                obj = getattr(obj, part)
            values.append(obj)
        return values

    def __call__(self, *args: Any) -> Any:
        flat = list(args) + self._lifted_values()
        if self.function is not None:
            outs = self.function.apply(*flat)
        else:
            outs = self.forward(*flat)
        meta = self.meta
        mutated = meta.mutated_inputs
        for index, new in zip(mutated, outs[:len(mutated)]):
            # once per call, after the graph: the caller's tensor (a buffer such as a BatchNorm
            # running mean, or a user input) ends up as eager would leave it; a new value that
            # carries a gradient is copied with autograd on, so the caller's tensor gets its history
            with torch.set_grad_enabled(torch.is_grad_enabled() and new.requires_grad):
                flat[index].copy_(new)
        graph_outs = outs[len(mutated):]
        num_user = meta.num_graph_outputs - meta.num_intermediate_bases
        bases = graph_outs[num_user:]
        results: list[Any] = []
        for info in meta.outputs:
            results.append(self._output(info, flat, graph_outs, bases, results))
        return tree_unflatten(results, self.out_spec)

    def _output(self, info: OutputInfo, flat: list[Any], graph_outs: Sequence[Any],
                bases: Sequence[Any], results: list[Any]) -> Any:
        kind = info.kind
        if kind == "graph":
            return graph_outs[info.graph_index]
        if kind == "input":
            return flat[info.base]
        if kind == "input_view":
            return _rebuild_view(flat[info.base], info, self.binding, flat)
        if kind == "base":
            return bases[info.base]
        if kind == "base_view":
            return _rebuild_view(bases[info.base], info, self.binding, flat)
        if kind == "same_as":
            return results[info.base]
        return info.value
