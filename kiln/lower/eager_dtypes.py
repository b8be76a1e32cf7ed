"""Ops whose eager CPU kernel refuses the dtypes they are given, found before they are lowered.

A kernel Kiln writes computes `relu` of a bool tensor, `argmax` of one, `floor` of an integer
tensor or `max_unpool2d` of a complex one as readily as of floats, but eager's kernel raises
("not implemented for 'Bool'", "does not support bool input"): a compiled program would return a
value where eager's raises, and the fake tensors' meta kernels do not check the dtype. So each op of
a graph that reads a tensor is run once, at lowering time, on one-element real tensors of the same
dtypes and ranks (zeros: no index is out of range, no divisor is nonzero by accident), and an op
that raises one of eager's dtype refusals is marked: it is neither decomposed nor lowered, and runs
as the ATen call, which raises eager's own error when the graph runs. Float32 and float64 are probed
too: eager refuses the integer-only ops (`x ^ 1`, `&`, shifts, gcd) of a float tensor, whose kernel
Kiln would write and fail to build. Any other error of the probe (shapes that only make sense at
full size) says nothing about the dtype and is ignored. Results are cached per op, dtypes, ranks
and constant arguments.

A constant Scalar argument that does not fit a dtype of the op (`x.clamp(-200, 300)`,
`masked_fill(m, 300)`, `full(..., 300)` of an int8 tensor, `threshold(x, 1, 1e40)` of a float32 one)
is another refusal: ATen's kernels convert such a Scalar with a range check ("value cannot be
converted to type int8_t without overflow"), where a kernel Kiln writes would wrap it. An op with such
an argument is probed whatever its dtypes (a factory op on two-element sizes), and marked the same way.
A Scalar that is a symbol (an int or float argument of a dynamic graph) is probed as a stand-in eager
would refuse (out of a narrow dtype's range; -1 as the power of an integer tensor), so that an op
which checks the value runs as the ATen call and checks each call's.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

# node.meta key of an op eager refuses for its dtypes (the refusal's text); kiln.lower.graph runs it as ATen
EAGER_REFUSES = "kiln_eager_refuses"

# the words of eager's dtype refusals (AT_DISPATCH's "not implemented for 'Bool'", a kernel's own checks)
_REFUSAL = re.compile(r"not implemented for|does not support|not supported for|is not supported|"
                      r"only supports floating|expected a floating|must be a floating|"
                      r"only support floating|supports only floating|"
                      r"integers to negative integer powers|"  # an int tensor ** a negative int
                      r"without overflow", re.IGNORECASE)  # a Scalar argument out of the dtype's range
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
    negative = _negative_stand_in(node, values, tensors)
    if negative is not None:  # an int tensor to a symbolic power: eager refuses a negative one
        why = _probe_node(node, negative, 1)
        if why is not None:
            return why
    overflowing, values = _overflowing_scalar(node, values, tensors, metas.get(node))
    if not overflowing and not tensors:
        return None
    if overflowing and not tensors:  # a factory op: its sizes do not matter to the range check
        values = pytree.tree_map(lambda v: [1] * (len(v) - 1) + [_WIDE] if _is_size(v) else v, values, is_leaf=_is_size)
    return _probe_node(node, values, _WIDE if overflowing else 1)


def _probe_node(node: torch.fx.Node, values: Any, width: int) -> str | None:
    if not _probe_worthy(node.target, _unscalared(node, values)):
        return None
    key = pytree.tree_map(_signature, values)
    try:
        hash(str(key))
    except Exception:
        return None
    return _probe(node.target, repr(key), values, width)


def _negative_stand_in(node: torch.fx.Node, values: Any, tensors: list[torch.Tensor]) -> Any:
    """The op's values with each symbolic int Scalar made -1, where a tensor is of an integer type
    (eager refuses an integer tensor to a negative integer power when the graph runs, which a
    symbol does not show); else None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not any(not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool
                                 for t in tensors):
        return None
    args, kwargs = values
    positions = [i for i, a in enumerate(schema.arguments[:len(args)])
                 if _is_scalar(a) and isinstance(args[i], torch.SymInt)]
    names = [a.name for a in schema.arguments if _is_scalar(a) and isinstance(kwargs.get(a.name), torch.SymInt)]
    if not positions and not names:
        return None
    return (tuple(-1 if i in positions else v for i, v in enumerate(args)),
            {k: -1 if k in names else v for k, v in kwargs.items()})


def _is_size(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(
        isinstance(e, (int, torch.SymInt)) and not isinstance(e, bool) for e in v)


def _unscalared(node: torch.fx.Node, values: Any) -> list[Any]:
    """The leaves of the op's arguments but its Scalar ones (a fill value is no size to allocate)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return pytree.tree_leaves(values)
    args, kwargs = values
    kept = [v for a, v in zip(schema.arguments, args) if not _is_scalar(a)] + list(args[len(schema.arguments):])
    kept += [v for k, v in kwargs.items() if not any(a.name == k and _is_scalar(a) for a in schema.arguments)]
    return pytree.tree_leaves(kept)


def _overflowing_scalar(node: torch.fx.Node, values: Any, tensors: list[torch.Tensor],
                        result: Any) -> tuple[bool, Any]:
    """Whether a number passed as a `Scalar` of the op's schema may lie outside the range of a dtype
    the op involves (its tensors', its result's, its dtype argument), and the values to probe the op
    with. A constant is judged by c10's rule for checked Scalar conversions: infinities and NaN fit a
    floating type, an unsigned type also takes negatives down to minus its maximum (they wrap), bool
    takes anything. A symbolic one (an int or float argument of a dynamic graph) may be anything when
    the graph runs: where a dtype is narrow enough for a Python number to overflow it, it is probed
    as a stand-in that does, so an op that checks its Scalar runs as the ATen call, which checks the
    value of each call."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False, values
    args, kwargs = values
    positions = [i for i, a in enumerate(schema.arguments[:len(args)]) if _is_scalar(a)]
    names = [a.name for a in schema.arguments if a.name in kwargs and _is_scalar(a)]
    numbers = [args[i] for i in positions] + [kwargs[k] for k in names]
    if not any(isinstance(v, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(v, bool) for v in numbers):
        return False, values
    dtypes = {t.dtype for t in tensors} | {r.dtype for r in pytree.tree_leaves(result) if isinstance(r, torch.Tensor)}
    if isinstance(kwargs.get("dtype"), torch.dtype):
        dtypes.add(kwargs["dtype"])
    if any(_overflows(v, d) for v in numbers if isinstance(v, (int, float)) and not isinstance(v, bool) for d in dtypes):
        return True, values
    if not dtypes & _NARROW or not any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in numbers):
        return False, values

    def stand_in(v: Any) -> Any:
        return 2 ** 40 if isinstance(v, torch.SymInt) else 1e300 if isinstance(v, torch.SymFloat) else v

    args = tuple(stand_in(v) if i in positions else v for i, v in enumerate(args))
    kwargs = {k: stand_in(v) if k in names else v for k, v in kwargs.items()}
    return True, (args, kwargs)


# dtypes a Python number passed to a dynamic graph may overflow (2**40 does, 1e300 does)
_NARROW = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.float16})


def _is_scalar(argument: Any) -> bool:
    return str(argument.type) in ("number", "Optional[number]")  # a Scalar or Scalar? of the schema


def _overflows(value: int | float, dtype: torch.dtype) -> bool:
    if dtype == torch.bool or dtype.is_complex:
        return False
    if dtype.is_floating_point:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return abs(value) > torch.finfo(dtype).max
    if isinstance(value, float) and not math.isfinite(value):
        return True
    info = torch.iinfo(dtype)
    if info.min == 0:  # unsigned: a negative wraps when its magnitude fits
        return value > info.max or -value > info.max
    return value < info.min or value > info.max


# Ops besides the pointwise ones whose kernels are plain loops over their input, safe to run on the
# probe's one-element tensors (a probe never runs an op that might abort on made-up inputs: an RNN,
# oneDNN's ops, anything with a workspace or a layout contract)
_PLAIN_KERNELS = frozenset({"argmax", "argmin", "amax", "amin", "sum", "prod", "mean", "max", "min", "_softmax",
                            "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "logsumexp",
                            "cumsum", "cumprod", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
                            "any", "all", "sort", "topk", "hardswish", "hardswish_backward", "hardsigmoid_backward",
                            "fmod", "remainder", "div", "floor_divide",
                            # ops that convert a Scalar argument to their dtype (probed for its range)
                            "fill", "full", "full_like", "new_full", "scalar_tensor", "constant_pad_nd",
                            "index_fill", "scatter", "masked_fill", "threshold", "hardtanh", "leaky_relu", "elu"})


_SPREAD_REDUCTIONS = frozenset({"var", "std", "var_mean", "std_mean"})


def _schema_name(target: Any) -> str:
    return getattr(getattr(target, "_schema", None), "name", "").split("::")[-1]


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
# a Scalar's range is checked on tensors of two elements: ATen fills a one-element tensor of a half
# type without the check (`full([1], 70000, dtype=float16)` is inf, `full([2], ...)` raises)
_WIDE = 2


def _example_of(v: Any) -> Any:
    """A symbolic Scalar as its example value: the real op given the SymInt itself would ask its
    ShapeEnv for the value, which records a guard, after capture, that pins the dynamic graph to
    this size (bicubic interpolation's `clamp(index, 0, s0 - 1)` recompiled at the next size)."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = getattr(v.node, "hint", None)
        kind = int if isinstance(v, torch.SymInt) else float if isinstance(v, torch.SymFloat) else bool
        return kind(hint) if hint is not None else kind(1)
    return v


def _probe(target: Any, key: str, values: Any, width: int = 1) -> str | None:
    """Eager's refusal of `target` on zeros of the dtypes and ranks of `values`' tensors, each
    `width` elements along its last dim (1 for the dtype probes)."""
    key = f"{key} width {width}"
    if (target, key) in _cache:
        return _cache[(target, key)]
    # a variance of one element warns (degrees of freedom <= 0) from C++, past Python's warning
    # filters, at each cold compile: two along every dim for these
    spread = _schema_name(target) in _SPREAD_REDUCTIONS

    def example(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return _example_of(v)
        shape = (2,) * v.dim() if spread else (1,) * (v.dim() - 1) + (width,) * min(v.dim(), 1)
        return torch.zeros(shape, dtype=v.dtype)
    args, kwargs = pytree.tree_map(example, values)
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
