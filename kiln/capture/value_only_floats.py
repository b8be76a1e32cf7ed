"""Float arguments of torch functions that set values only, never an output's size, dtype or layout.

A symbolic float passed as one (BatchNorm's cumulative-average momentum, `1 / num_batches_tracked`
read at a graph break and made dynamic on its change) runs on fake tensors as its example value,
read from its node without a guard, so a new value does not recompile the graph; the graph's node
keeps the symbol, so the compiled call gets the new value. OutputGraph.run_fake calls this. A backend
that needs the number as a constant (AOT autograd's aten ops take a Python float) still guards it
there.
"""
from __future__ import annotations

import types
from typing import Any

import torch

# Float arguments that set values only, never an output's size, dtype or layout: a symbolic one
# (BatchNorm's cumulative-average momentum, 1 / num_batches_tracked read at a break) runs on fake
# tensors as its example value without a guard, so a new value does not recompile. (function,
# (position, keyword) of each such argument)
_VALUE_ONLY_FLOATS: dict[Any, tuple[tuple[int, str], ...]] = {
    torch.nn.functional.batch_norm: ((6, "momentum"), (7, "eps")),
    torch.nn.functional.instance_norm: ((6, "momentum"), (7, "eps")),
}


def value_only_floats_as_hints(target: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """args and kwargs with each symbolic float of _VALUE_ONLY_FLOATS replaced by its example value
    (read from the node, which records no guard); the graph's node keeps the symbol."""
    slots = _VALUE_ONLY_FLOATS.get(target) if isinstance(target, types.FunctionType) else None
    if not slots:
        return args, kwargs

    def hint(value: Any) -> Any:
        example = getattr(getattr(value, "node", None), "_hint", None)
        return example if isinstance(value, torch.SymFloat) and isinstance(example, float) else value

    positional, keywords = list(args), dict(kwargs)
    for position, keyword in slots:
        if position < len(positional):
            positional[position] = hint(positional[position])
        if keyword in keywords:
            keywords[keyword] = hint(keywords[keyword])
    return tuple(positional), keywords
