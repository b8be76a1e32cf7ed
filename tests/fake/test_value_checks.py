"""Which graph nodes may raise on their inputs' values (kiln.fake.value_checks), at both levels a
graph is written at: torch-level nodes as capture records them and ATen nodes."""
from __future__ import annotations

import operator

import torch
import torch.fx

from kiln.fake.value_checks import raises_on_values

aten = torch.ops.aten


def _node(graph: torch.fx.Graph, kind: str, target, args, value, key: str = "example_value", **kwargs):
    node = graph.create_node(kind, target, args, kwargs)
    node.meta[key] = value
    return node


def test_torch_level_nodes() -> None:
    g = torch.fx.Graph()
    ints, floats = g.placeholder("a"), g.placeholder("b")
    ints.meta["example_value"], floats.meta["example_value"] = torch.ones(2, dtype=torch.int64), torch.ones(2)
    i = torch.ones(2, dtype=torch.int64)
    f = torch.ones(2)
    assert raises_on_values(_node(g, "call_function", operator.floordiv, (ints, ints), i))
    assert not raises_on_values(_node(g, "call_function", operator.floordiv, (floats, floats), f))
    assert raises_on_values(_node(g, "call_method", "__rmod__", (ints, 3), i))
    assert raises_on_values(_node(g, "call_function", torch.div, (ints, ints), i, rounding_mode="floor"))
    assert not raises_on_values(_node(g, "call_function", torch.div, (ints, ints), f))  # true division
    assert raises_on_values(_node(g, "call_function", operator.getitem, (floats, ints), f))
    assert raises_on_values(_node(g, "call_function", operator.getitem, (floats, (slice(None), ints)), f))
    assert not raises_on_values(_node(g, "call_function", operator.getitem, (floats, 0), f[0]))
    assert raises_on_values(_node(g, "call_method", "gather", (floats, 0, ints), f))
    assert raises_on_values(_node(g, "call_function", torch.nn.functional.embedding, (ints, floats), f))
    assert raises_on_values(_node(g, "call_function", torch.linalg.cholesky, (floats,), f))
    assert not raises_on_values(_node(g, "call_function", torch.add, (ints, ints), i))
    assert not raises_on_values(_node(g, "call_method", "sum", (ints,), i))


def test_aten_nodes() -> None:
    g = torch.fx.Graph()
    ints = g.placeholder("a")
    ints.meta["val"] = torch.ones(2, dtype=torch.int64)
    i, f = torch.ones(2, dtype=torch.int64), torch.ones(2)
    assert raises_on_values(_node(g, "call_function", aten.floor_divide.default, (ints, ints), i, "val"))
    assert raises_on_values(_node(g, "call_function", aten.remainder.Scalar, (ints, 3), i, "val"))
    assert not raises_on_values(_node(g, "call_function", aten.remainder.Tensor, (ints, ints), f, "val"))
    assert raises_on_values(_node(g, "call_function", aten.div.Tensor_mode, (ints, ints), i, "val",
                                  rounding_mode="trunc"))
    assert raises_on_values(_node(g, "call_function", aten.index.Tensor, (ints, [ints]), i, "val"))
    assert raises_on_values(_node(g, "call_function", aten._linalg_check_errors.default, (ints, "x", False),
                                  None, "val"))
    assert not raises_on_values(_node(g, "call_function", aten.linalg_cholesky_ex.default, (ints,), (f, i), "val"))
    assert raises_on_values(_node(g, "call_function", aten.linalg_cholesky_ex.default, (ints,), (f, i), "val",
                                  check_errors=True))
    # a size's `//` (a SymInt or an int) is no tensor op
    assert not raises_on_values(_node(g, "call_function", operator.floordiv, (4, 2), 2, "val"))
