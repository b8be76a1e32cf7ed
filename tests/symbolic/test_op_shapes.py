"""Symbolic output sizes of common ops vs. the real op, at the hint and at other sizes the guards allow.

Each case runs the op on meta tensors whose sizes are SymInts (under the Python dispatcher, as fake
tensors do), then: the output sizes evaluated at the example sizes equal the real op's; the recorded
guards hold there; and for other sizes, whenever every guard holds, the symbolic sizes still equal
the real op's output (a guard set that lets a wrong graph through fails this test).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher

from kiln.symbolic import ShapeEnv, expr_of
from kiln.symbolic.expr import evaluate_at


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: list[tuple]  # dims: an int (static) or a symbol name "a", "b" (dynamic, hint in HINTS)
    index_high: dict[int, int] = dataclasses.field(default_factory=dict)  # input -> int64 in [0, high)
    generic: bool = True  # some other size must pass the guards (the op did not specialize)


HINTS = {"a": 6, "b": 5}
# every name differs from its hint, so a case whose guards pinned a size passes none of these
OTHER = [{"a": 7, "b": 4}, {"a": 9, "b": 9}, {"a": 12, "b": 3}, {"a": 2, "b": 2}, {"a": 1, "b": 7}, {"a": 8, "b": 1}]

CASES = [
    Case("matmul", lambda x, w: x @ w, [("a", 8), (8, 16)]),
    Case("matmul_3d", lambda x, w: x @ w, [(2, "a", 8), (8, "b")]),
    Case("bmm", lambda x, y: torch.bmm(x, y), [(2, "a", 4), (2, 4, "b")]),
    Case("add_broadcast", lambda x, b: x + b, [("a", 8), (8,)]),
    Case("add_outer", lambda x, y: x + y, [("a", 1), (1, "b")]),
    Case("mul_same", lambda x, y: x * y, [("a", "b"), ("a", "b")]),
    Case("view_flat", lambda x: x.view(-1), [("a", 8)]),
    Case("view_split", lambda x: x.view(-1, 4), [("a", 8)]),
    Case("reshape_copy", lambda x: x.t().reshape(-1, 2), [("a", 8)]),
    Case("cat_dim0", lambda x, y: torch.cat([x, y]), [("a", 8), ("b", 8)]),
    Case("cat_dim1", lambda x, y: torch.cat([x, y], 1), [("a", 3), ("a", "b")]),
    Case("stack", lambda x, y: torch.stack([x, y]), [("a", 4), ("a", 4)]),
    Case("sum", lambda x: x.sum(0), [("a", "b")]),
    Case("mean_keepdim", lambda x: x.mean(1, keepdim=True), [("a", "b")]),
    Case("amax", lambda x: x.amax(-1), [(2, "a", "b")]),
    Case("var", lambda x: x.var(0), [("a", 3)]),
    Case("softmax", lambda x: x.softmax(-1), [("a", "b")]),
    Case("log_softmax", lambda x: F.log_softmax(x, 0), [("a", "b")]),
    Case("layer_norm", lambda x, w, b: F.layer_norm(x, [8], w, b), [("a", "b", 8), (8,), (8,)]),
    Case("conv2d", lambda x, w: F.conv2d(x, w, stride=2, padding=1), [(2, 3, "a", "b"), (4, 3, 3, 3)]),
    Case("conv1d_dilated", lambda x, w: F.conv1d(x, w, dilation=2), [(1, 2, "a"), (3, 2, 2)]),
    Case("max_pool2d", lambda x: F.max_pool2d(x, 2), [(1, 2, "a", "b")]),
    Case("interpolate", lambda x: F.interpolate(x, scale_factor=2), [(1, 2, "a")]),
    Case("slice", lambda x: x[1:], [("a", 4)]),
    Case("slice_step", lambda x: x[::2], [("a", 4)]),
    Case("slice_neg", lambda x: x[:-1, 1:], [("a", "b")]),
    Case("select", lambda x: x[:, 0], [("a", 4)]),
    Case("index_tensor", lambda x, i: x[i], [("a", 4), (3,)], index_high={1: 2}),
    Case("index_select", lambda x, i: x.index_select(1, i), [(3, "a"), ("b",)], index_high={1: 2}),
    Case("gather", lambda x, i: x.gather(1, i), [("a", 4), ("a", 2)], index_high={1: 4}),
    Case("embedding", lambda i, w: F.embedding(i, w), [("a", "b"), (10, 8)], index_high={0: 10}),
    Case("permute_expand", lambda x: x.unsqueeze(0).permute(2, 0, 1).expand(-1, 3, -1), [("a", "b")]),
    Case("flatten", lambda x: x.flatten(1), [(2, "a", "b")]),
    Case("transpose_contig", lambda x: x.transpose(0, 1).contiguous(), [("a", "b")]),
    Case("pad", lambda x: F.pad(x, (1, 2)), [("a", "b")]),
    Case("cumsum", lambda x: x.cumsum(0), [("a", "b")]),
    Case("where", lambda c, x: torch.where(c > 0, x, 0.0), [("a", 1), ("a", "b")]),
    Case("topk", lambda x: x.topk(2, -1), [("a", "b")]),
    Case("sort", lambda x: x.sort(0), [("a", 3)]),
    Case("new_zeros", lambda x: x.new_zeros(x.shape[0] * 2, 3), [("a", 4)]),
    Case("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [(2, "a", 8), (2, "b", 8), (2, "b", 8)]),
    Case("linear", lambda x, w, b: F.linear(x, w, b), [("a", 8), (4, 8), (4,)]),
    Case("split", lambda x: x.split(2), [("a", 3)], generic=False),
    Case("chunk", lambda x: x.chunk(3), [("a", 3)], generic=False),
]


def make_inputs(case: Case, values: dict[str, int], env: ShapeEnv | None) -> list[torch.Tensor]:
    """Real tensors for `values` (env None), or meta tensors with one symbol per name (env given)."""
    made: list[torch.Tensor] = []
    symbols: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    for i, dims in enumerate(case.inputs):
        if env is None:
            shape = [values[d] if isinstance(d, str) else d for d in dims]
            if i in case.index_high:
                made.append(torch.randint(0, case.index_high[i], shape, generator=gen))
            else:
                made.append(torch.randn(shape, generator=gen))
            continue
        shape = []
        for j, d in enumerate(dims):
            if isinstance(d, str):
                if d not in symbols:
                    symbols[d] = env.create_symbol(values[d], f"L['x{i}'].size()[{j}]")
                shape.append(symbols[d])
            else:
                shape.append(d)
        dtype = torch.long if i in case.index_high else torch.float32
        made.append(torch.empty(shape, dtype=dtype, device="meta"))
    return made


def source_tensors(case: Case, values: dict[str, int]) -> dict[str, torch.Tensor]:
    """The `L` a guard sees: x{i} is input i (with the sizes named in values)."""
    return {f"x{i}": t for i, t in enumerate(make_inputs(case, values, None))}


def shapes_of(out: Any) -> list:
    if isinstance(out, torch.Tensor):
        return [list(out.shape)]
    return [s for o in out for s in shapes_of(o)]


def concrete(shape_list: list, values: dict) -> list:
    return [[d if isinstance(d, int) else int(evaluate_at(expr_of(d), values)) for d in s] for s in shape_list]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_symbolic_shape_matches_real(case: Case):
    env = ShapeEnv()
    with enable_python_dispatcher():
        out = case.fn(*make_inputs(case, HINTS, env))
    sym_shapes = shapes_of(out)
    real = shapes_of(case.fn(*make_inputs(case, HINTS, None)))
    L = source_tensors(case, HINTS)
    at_hint = concrete(sym_shapes, env.symbol_values(L))
    assert at_hint == [list(s) for s in real]
    assert env.failing_guard(L) is None
    passed = 0
    for values in OTHER:
        L = source_tensors(case, values)
        if env.failing_guard(L) is not None:
            continue
        passed += 1
        expected = [list(s) for s in shapes_of(case.fn(*L.values()))]
        assert concrete(sym_shapes, env.symbol_values(L)) == expected, (values, [g.python for g in env.guards])
    if case.generic:
        assert passed >= 1, [g.python for g in env.guards]


def test_size_one_inputs_fail_the_guards():
    """The >= 2 assumption behind folded broadcasting must be checked: a size-1 input recompiles."""
    case = next(c for c in CASES if c.name == "add_broadcast")
    env = ShapeEnv()
    with enable_python_dispatcher():
        case.fn(*make_inputs(case, HINTS, env))
    assert env.failing_guard(source_tensors(case, {"a": 1, "b": 5})) is not None


def test_through_kiln_fake():
    """The same shapes through kiln.fake's FakeTensorMode.from_real with dynamic dims."""
    import kiln.fake as fake
    env = ShapeEnv()
    mode = fake.FakeTensorMode(shape_env=env)
    x_real, w_real = torch.randn(6, 8), torch.randn(8, 16)
    x = mode.from_real(x_real, source="L['x']", dynamic_dims=(0,))
    w = mode.from_real(w_real, source="L['w']")
    with mode:
        y = F.layer_norm(x @ w + 1, [16]).softmax(-1)
        z = torch.cat([y, y]).view(-1, 4).sum(0)
    assert [str(d) for d in y.shape] == ["s0", "16"]
    assert z.shape == (4,)
    assert [g.python for g in env.guards] == ["L['x'].size()[0] >= 2"]
