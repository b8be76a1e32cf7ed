"""Judging a compiled run against eager: the one verdict the bisector and the minifier share.

`run_case(fn, args, kwargs)` runs a callable on fresh copies of its inputs and records its outputs,
the gradients of its inputs and parameters (when any require grad) or the exception it raised.
`compare(ref, res, ref64)` says whether `res` (compiled) matches `ref` (eager); a difference beyond
tolerance is forgiven when eager itself is as far from a float64 run, so rounding is never called a
bug. Counterpart: torch/_dynamo/utils.py's `same(..., fp64_ref=...)` and the minifier's checks.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

# The compiled error may be this many times eager's own distance from float64 (as torch's check).
FP64_MULTIPLIER = 2.0


@dataclass
class Outcome:
    """What one run produced: flat outputs and gradients, or the exception it raised."""

    outputs: list[Any] = field(default_factory=list)
    grads: list[Any] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {str(self.error).splitlines()[0] if str(self.error) else ''}"
        return f"{len(self.outputs)} outputs, {len(self.grads)} gradients"


def clone_inputs(value: Any, dtype: torch.dtype | None = None) -> Any:
    """A copy of the inputs a run may mutate: tensors cloned (leaves stay leaves), floating ones cast
    to `dtype` when given; everything else as is."""

    def copy_one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        y = x.detach().clone()
        if dtype is not None and y.is_floating_point():
            y = y.to(dtype)
        return y.requires_grad_(x.requires_grad) if (x.requires_grad and y.is_floating_point()) else y

    return pytree.tree_map(copy_one, value)


def _grad_leaves(fn: Any, args: Any) -> list[torch.Tensor]:
    leaves = [x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(fn, torch.nn.Module):
        leaves += [p for p in fn.parameters() if p.requires_grad]
    return leaves


def run_case(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None, *,
             module: torch.nn.Module | None = None, seed: int = 0) -> Outcome:
    """Run fn once (inputs copied, RNG seeded) and, if something requires grad, one backward of a
    fixed random weighting of the outputs. `module` is the nn.Module whose parameters get gradients
    (fn itself when it is one)."""
    args, kwargs = clone_inputs((tuple(args), dict(kwargs or {})))
    owner = module if module is not None else (fn if isinstance(fn, torch.nn.Module) else None)
    leaves = _grad_leaves(owner, args) if owner is not None else _grad_leaves(None, args)
    for p in leaves:
        p.grad = None
    torch.manual_seed(seed)
    try:
        out = fn(*args, **kwargs)
        flat = [o for o in pytree.tree_leaves(out)]
        grads: list[Any] = []
        diff = [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
        if leaves and diff:
            gen = torch.Generator().manual_seed(1234)
            loss = torch.stack([(o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum().to(torch.float64)
                                for o in diff]).sum()
            loss.backward()
            grads = [None if p.grad is None else p.grad.detach().clone() for p in leaves]
        return Outcome([o.detach() if isinstance(o, torch.Tensor) else o for o in flat], grads)
    except Exception as exc:  # the verdict compares exceptions too: eager's are the reference
        return Outcome(error=exc)


def fp64_case(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None) -> Outcome | None:
    """The same run in float64 (a deep copy of a module cast to double), or None when the program
    does not run in float64 (a dtype fixed inside it, an op without a double kernel)."""
    try:
        fn64 = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
        args64, kwargs64 = clone_inputs((tuple(args), dict(kwargs or {})), torch.float64)
    except Exception:
        return None
    outcome = run_case(fn64, args64, kwargs64)
    return None if outcome.failed else outcome


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for a direct comparison with eager."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype == torch.float64:
        return 1e-7, 1e-7
    return 1e-4, 1e-5


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.double() - b.double())[torch.isfinite(b)]
    return math.sqrt(float((d * d).mean())) if d.numel() else 0.0


def compare_tensors(ref: torch.Tensor, res: torch.Tensor, ref64: torch.Tensor | None) -> str | None:
    """None when `res` matches `ref`, else why not."""
    if ref.shape != res.shape:
        return f"shape {tuple(res.shape)} instead of {tuple(ref.shape)}"
    if ref.dtype != res.dtype:
        return f"dtype {res.dtype} instead of {ref.dtype}"
    if not ref.is_floating_point() and not ref.is_complex():
        return None if torch.equal(ref, res) else "integer values differ"
    rtol, atol = tolerance(ref.dtype)
    if torch.allclose(res, ref, rtol=rtol, atol=atol, equal_nan=True):
        return None
    if not torch.equal(torch.isnan(ref), torch.isnan(res)):
        return "NaN where eager has none (or the reverse)"
    worst = float((res.double() - ref.double()).abs().nan_to_num(0.0).max())
    if ref64 is not None and ref64.shape == ref.shape:
        ref64 = ref64.to(torch.float64)
        res_err, ref_err = _rmse(res, ref64), _rmse(ref, ref64)
        # eager's own error sets the scale: a compiled result no worse than it is rounding
        if res_err <= FP64_MULTIPLIER * ref_err + atol * 0.1:
            return None
        return f"max abs difference {worst:.3g}; error against float64 {res_err:.3g} vs eager's {ref_err:.3g}"
    return f"max abs difference {worst:.3g} (rtol {rtol}, atol {atol})"


def compare(ref: Outcome, res: Outcome, ref64: Outcome | None = None) -> str | None:
    """None when the compiled outcome `res` is eager's `ref` (values, or the same exception type);
    otherwise one line saying how they differ."""
    if ref.error is not None or res.error is not None:
        if ref.error is not None and res.error is not None and type(ref.error) is type(res.error):
            return None
        if res.error is not None:
            return f"raised {type(res.error).__name__}: {str(res.error).splitlines()[0] if str(res.error) else ''}"
        return f"eager raised {type(ref.error).__name__} but the compiled run returned"
    pairs = [("output", ref.outputs, res.outputs, ref64.outputs if ref64 else None),
             ("gradient", ref.grads, res.grads, ref64.grads if ref64 else None)]
    for what, a, b, c in pairs:
        if len(a) != len(b):
            return f"{len(b)} {what}s instead of {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            z = c[i] if c is not None and i < len(c) else None
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                why = compare_tensors(x, y, z if isinstance(z, torch.Tensor) else None)
            elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                why = f"{type(y).__name__} instead of {type(x).__name__}"
            elif isinstance(x, float) and isinstance(y, float):
                why = None if math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) else f"{y} instead of {x}"
            else:
                why = None if x == y else f"{y!r} instead of {x!r}"
            if why is not None:
                return f"{what} {i}: {why}"
    return None
