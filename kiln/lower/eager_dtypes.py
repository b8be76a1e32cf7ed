"""Ops whose eager CPU kernel refuses the dtypes they are given, found before they are lowered.

A kernel Kiln writes computes `relu` of a bool tensor, `argmax` of one, `floor` of an integer
tensor or `max_unpool2d` of a complex one as readily as of floats, but eager's kernel raises
("not implemented for 'Bool'", "does not support bool input"): a compiled program would return a
value where eager's raises, and the fake tensors' meta kernels do not check the dtype. So each op of
a graph that reads a tensor of a dtype other than float32/float64 is run once, at lowering time, on
one-element real tensors of the same dtypes and ranks (zeros: no index is out of range, no divisor
is nonzero by accident), and an op that raises one of eager's dtype refusals is marked: it is neither
decomposed nor lowered, and runs as the ATen call, which raises eager's own error when the graph
runs. Any other error of the probe (shapes that only make sense at full size) says nothing about
the dtype and is ignored. Results are cached per op, dtypes, ranks and constant arguments.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

# node.meta key of an op eager refuses for its dtypes (the refusal's text); kiln.lower.graph runs it as ATen
EAGER_REFUSES = "kiln_eager_refuses"

_PLAIN = (torch.float32, torch.float64)
# the words of eager's dtype refusals (AT_DISPATCH's "not implemented for 'Bool'", a kernel's own checks)
_REFUSAL = re.compile(r"not implemented for|does not support|not supported for|is not supported|"
                      r"only supports floating|expected a floating|must be a floating|"
                      r"only support floating|supports only floating|"
                      r"integers to negative integer powers", re.IGNORECASE)  # an int tensor ** a negative int
_MAX_ELEMENTS = 4096  # a constant size argument larger than this is not probed (it would allocate)


def mark_refused(gm: torch.fx.GraphModule, metas: dict[torch.fx.Node, Any], computed: Callable[[Any], bool]) -> int:
    """Mark each op of `gm` that Kiln would compute itself (`computed(target)`: it has a lowering or
    a decomposition) and whose eager kernel refuses its inputs' dtypes; returns how many. An op that
    runs as an ATen call anyway (an extern: mm, convolution, RNNs, oneDNN's ops) raises eager's error
    by itself and is never probed: only simple kernels run on the probe's made-up inputs."""
    marked = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or not computed(node.target):
            continue
        why = refusal(node, metas)
        if why is not None:
            node.meta[EAGER_REFUSES] = why
            marked += 1
    return marked


def refusal(node: torch.fx.Node, metas: dict[torch.fx.Node, Any]) -> str | None:
    """Eager's dtype refusal for this op and its inputs' dtypes, or None (accepted, or not probed)."""
    values = pytree.tree_map(lambda a: metas.get(a) if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
    leaves = pytree.tree_leaves(values)
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    if not tensors or all(t.dtype in _PLAIN for t in tensors) or not _probe_worthy(node.target, leaves):
        return None
    key = pytree.tree_map(_signature, values)
    try:
        hash(str(key))
    except Exception:
        return None
    return _probe(node.target, repr(key), values)


# Ops besides the pointwise ones whose kernels are plain loops over their input, safe to run on the
# probe's one-element tensors (a probe never runs an op that might abort on made-up inputs: an RNN,
# oneDNN's ops, anything with a workspace or a layout contract)
_PLAIN_KERNELS = frozenset({"argmax", "argmin", "amax", "amin", "sum", "prod", "mean", "max", "min", "_softmax",
                            "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "logsumexp",
                            "cumsum", "cumprod", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
                            "any", "all", "sort", "topk", "hardswish", "hardswish_backward", "hardsigmoid_backward",
                            "fmod", "remainder", "div", "floor_divide"})


def _probe_worthy(target: Any, leaves: list[Any]) -> bool:
    if torch.Tag.pointwise not in getattr(target, "tags", ()) \
            and getattr(getattr(target, "_schema", None), "name", "").split("::")[-1] not in _PLAIN_KERNELS:
        return False
    if any(isinstance(v, torch.Tensor) and (v.layout != torch.strided or v.device.type != "cpu") for v in leaves):
        return False
    if any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in leaves):
        return False
    if torch.Tag.nondeterministic_seeded in getattr(target, "tags", ()):
        return False
    sizes = [v for v in leaves if isinstance(v, int) and not isinstance(v, bool)]
    return math.prod(abs(s) for s in sizes[:8]) <= _MAX_ELEMENTS if sizes else True


def _signature(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), v.dim())
    return v


_cache: dict[tuple[Any, str], str | None] = {}


def _probe(target: Any, key: str, values: Any) -> str | None:
    if (target, key) in _cache:
        return _cache[(target, key)]
    args, kwargs = pytree.tree_map(
        lambda v: torch.zeros((1,) * v.dim(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v, values)
    why = None
    try:
        with torch.no_grad():
            target(*args, **kwargs)
    except (NotImplementedError, RuntimeError, TypeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, NotImplementedError) or _REFUSAL.search(text):
            why = f"{type(exc).__name__}: {text}"
    except Exception:
        pass  # a probe-sized input the op cannot take: nothing about the dtype
    if len(_cache) < 4096:
        _cache[(target, key)] = why
    return why
