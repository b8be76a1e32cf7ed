"""Ops whose errors depend on tensor values, which fake tensors cannot see: a graph keeps them even
when nothing reads their result.

Eager checks every element such an op computes (an index in range, an integer divisor not zero) and
raises on a bad one whether or not the result is used afterwards. A fake tensor carries no values,
so a trace cannot know the check passes; removing the op as dead code (capture's graph, AOT
autograd's joint graph and its forward, the lowering's decompositions) would turn eager's exception
into a returned value. Every dead-code pass of Kiln asks `raises_on_values` of a node before it
drops it; the lowering then makes sure the kept check runs over every element (kiln.lower.coverage).

One table for both levels a graph is written at: torch-level nodes (capture: torch functions,
Tensor methods, `operator.floordiv`) and ATen nodes (AOT autograd, the lowering), by the op's name.
Corresponds to the value checks torch.compile's Inductor emits (`check_bounds`, device asserts),
which its dead-code elimination drops with the op.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

# Index bounds: the op reads or writes at positions given by an integer tensor's values.
_INDEXING = frozenset({
    "index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put", "gather", "scatter",
    "scatter_add", "scatter_reduce", "index_select", "embedding", "take", "take_along_dim", "index_add",
    "index_copy", "index_fill", "one_hot", "nll_loss", "nll_loss_forward", "nll_loss2d_forward",
    "cross_entropy", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only",
})
# Integer division by zero: ZeroDivisionError from ATen's kernels (floating-point division gives
# inf or NaN and never raises, so these count only with an integer result).
_DIVISIONS = frozenset({
    "floor_divide", "floordiv", "remainder", "mod", "fmod", "rfloordiv", "rmod",
})
# Factorizations that fail on some matrices (not positive-definite, singular): LinAlgError.
# `_linalg_check_errors` is the op ATen's composites raise through, from a factorization's info.
_FACTORIZATIONS = frozenset({
    "cholesky", "linalg_cholesky", "inverse", "linalg_inv", "linalg_solve", "solve", "linalg_lu_factor",
    "lu_factor", "_linalg_check_errors", "linalg_inv_ex", "linalg_cholesky_ex", "linalg_solve_ex",
})
# Asserts on a tensor's value (`torch._assert_async(x.sum() > 1)`): the whole point of the op.
_ASSERTS = frozenset({"_assert_async", "_functional_assert_async", "_assert", "_assert_scalar"})
# `div` raises only with a rounding mode (integer true division gives floats).
_ROUNDING_DIVISIONS = frozenset({"div", "divide"})


def _name(target: Any) -> str:
    """The op's name without overload, dunder underscores or the in-place suffix's doubling."""
    if isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
    elif isinstance(target, str):
        name = target
    else:
        name = getattr(target, "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name.startswith("i") and name[1:] in _DIVISIONS:  # __ifloordiv__
            name = name[1:]
    return name


def _value_of(node: torch.fx.Node) -> Any:
    """The node's example value: ATen graphs keep it in meta['val'], captured ones in 'example_value'."""
    return node.meta.get("val", node.meta.get("example_value"))


def _integer_result(node: torch.fx.Node) -> bool:
    """Whether the node's result is an integer (or bool) tensor; unknown counts as yes (kept). Sizes
    (a SymInt's `//`) are no tensor: a zero divisor there fails while tracing, or is guarded."""
    value = _value_of(node)
    if isinstance(value, torch.Tensor):
        return not value.dtype.is_floating_point and not value.dtype.is_complex
    return value is None


def _tensor_index(node: torch.fx.Node) -> bool:
    """`x[i]` with a tensor among its indices (an int or a slice is checked while tracing)."""
    if len(node.args) < 2:
        return False
    first = _value_of(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(first, torch.Tensor):
        return False  # a tuple's element (a multi-output op's getitem)
    index = node.args[1]
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.fx.Node) and isinstance(_value_of(p), torch.Tensor) for p in parts)


def raises_on_values(node: torch.fx.Node) -> bool:
    """Whether the node may raise an error that depends on its inputs' values: such a node is never
    dead code."""
    if node.op not in ("call_function", "call_method"):
        return False
    target = node.target
    if target is operator.getitem or target == "__getitem__":
        return _tensor_index(node)
    name = _name(target)
    if name in _FACTORIZATIONS:
        if name.endswith("_ex"):  # raises only when asked to check its info
            return bool(node.kwargs.get("check_errors", False))
        return True
    if name in _INDEXING or name in _ASSERTS:
        return True
    if name in _DIVISIONS:
        return _integer_result(node)
    if name in _ROUNDING_DIVISIONS:
        mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
        return mode is not None and _integer_result(node)
    return False
