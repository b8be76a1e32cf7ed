"""numpy scalars passed to a graph op (`x.clamp(min=np.finfo(np.float32).min)`,
`torch.full((2,), np.int16(3))`).

A graph's code cannot hold a numpy scalar (FX prints `np.float32(...)`), and torch reads one as
the Python number it holds for some arguments but as a 0-d tensor of its own dtype for others
(`torch.tensor(np.float64(0.5))` is float64 where 0.5 makes float32). So each top-level numpy
scalar argument becomes its Python number only when the op, run on the fakes both ways, gives
results of the same kinds, dtypes and shapes; otherwise it stays, and the graph op refuses it (a
clean break).

A numpy scalar argument of the frame (`f(x, np.float32(0.5))`) is a NumpyScalarVariable: a graph op
that takes it as its number (the same check) gets a symbolic int or float input, guarded by the
scalar's type only, so another value of the same type reuses the graph (torch.compile passes one
as a 0-d tensor input: one graph per numpy type). Any other use reads its value, which guards the
value (as a constant) from then on.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from kiln.capture.variables.base import Variable
from kiln.capture.sources import Source
from kiln.capture.variables.constant import ConstantVariable, ItemConstantVariable
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


class NumpyScalarVariable(ItemConstantVariable):
    """A numpy integer or float from the frame's arguments: a constant guarded by value once its
    value is read, or a symbolic graph input where an op takes it as the number it holds."""

    def __init__(self, value: Any, source: Source, guard: Callable[[], None],
                 make_symbol: Callable[[], Variable]) -> None:
        super().__init__(value, source, guard)
        self._make_symbol = make_symbol
        self._symbol: Variable | None = None

    def unguarded(self) -> Any:
        return self._value

    @property
    def specialized(self) -> bool:
        return self._guard is None

    def symbol(self) -> Variable:
        if self._symbol is None:
            self._symbol = self._make_symbol()
        return self._symbol


def symbolic_numpy_scalars(run: Run, target: Any, args: Sequence[Variable],
                           kwargs: dict[str, Variable]) -> tuple[Sequence[Variable], dict[str, Variable]]:
    """`args`/`kwargs` with each numpy scalar argument not yet specialized as its symbol, where the
    op gives the same kinds of results with its number as with the numpy scalar."""
    def dynamic(var: Variable) -> bool:
        return isinstance(var, NumpyScalarVariable) and not var.specialized

    if not any(dynamic(a) for a in args) and not any(dynamic(v) for v in kwargs.values()):
        return args, kwargs
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return args, kwargs  # an in-place op is not run twice on the fakes
    as_numpy = lambda v: ConstantVariable(v.unguarded()) if dynamic(v) else v  # noqa: E731
    as_number = lambda v: ConstantVariable(v.unguarded().item()) if dynamic(v) else v  # noqa: E731
    try:
        same = _signature(run([as_numpy(a) for a in args], {k: as_numpy(v) for k, v in kwargs.items()})) == \
            _signature(run([as_number(a) for a in args], {k: as_number(v) for k, v in kwargs.items()}))
    except (Unsupported, RuntimeError, TypeError, ValueError):
        return args, kwargs
    if not same:
        return args, kwargs
    symbol = lambda v: v.symbol() if dynamic(v) else v  # noqa: E731
    return [symbol(a) for a in args], {k: symbol(v) for k, v in kwargs.items()}

