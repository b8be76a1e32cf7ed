"""numpy scalars passed to a graph op (`x.clamp(min=np.finfo(np.float32).min)`,
`torch.full((2,), np.int16(3))`).

A graph's code cannot hold a numpy scalar (FX prints `np.float32(...)`), and torch reads one as
the Python number it holds for some arguments but as a 0-d tensor of its own dtype for others
(`torch.tensor(np.float64(0.5))` is float64 where 0.5 makes float32). So each top-level numpy
scalar argument becomes its Python number only when the op, run on the fakes both ways, gives
results of the same kinds, dtypes and shapes; otherwise it stays, and the graph op refuses it (a
clean break).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

Run = Callable[[Sequence[Variable], dict[str, Variable]], Any]


def _is_numpy_scalar(var: Variable) -> bool:
    return isinstance(var, ConstantVariable) and isinstance(var.value, (np.integer, np.floating, np.bool_)) \
        and type(var.value) not in (np.int64, np.bool_)  # these two the graph takes as int and bool already


def _as_number(var: Variable) -> Variable:
    return ConstantVariable(var.as_constant().item()) if _is_numpy_scalar(var) else var


def _signature(value: Any) -> Any:
    """What must not change when a numpy scalar becomes a number: kinds, dtypes and shapes."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.device)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_signature(v) for v in value))
    return type(value)


def numpy_scalars_as_numbers(run: Run, target: Any, args: Sequence[Variable],
                             kwargs: dict[str, Variable]) -> tuple[Sequence[Variable], dict[str, Variable]]:
    """`args`/`kwargs` with their numpy scalars as Python numbers where the op cannot tell (see
    the module docstring); unchanged where it can, or where there are none. An in-place op
    (`x.add_(...)`) is not run twice on the fakes to find out: it keeps them (a clean break)."""
    if not any(_is_numpy_scalar(a) for a in args) and not any(_is_numpy_scalar(v) for v in kwargs.values()):
        return args, kwargs
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return args, kwargs
    numbers = [_as_number(a) for a in args]
    number_kwargs = {k: _as_number(v) for k, v in kwargs.items()}
    try:
        as_given = run(args, kwargs)
        as_numbers = run(numbers, number_kwargs)
    except (Unsupported, RuntimeError, TypeError, ValueError):
        return args, kwargs
    if _signature(as_given) != _signature(as_numbers):
        return args, kwargs
    return numbers, number_kwargs
