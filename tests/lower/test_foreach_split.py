"""Foreach ops split per tensor (decompose.foreach_decompositions): torch.optim's foreach=True path.

Each `aten._foreach_<op>` overload used to run as one ATen call over the whole list, its results a
list of fresh buffers between kernels. Now each tensor's result is the plain op on that tensor, a
pointwise node that fuses with its neighbours. Compared with eager on lists of mixed shapes (a
matrix, a vector, a 0-d tensor), list/scalar/scalar-list/tensor-scalar overloads, keyword-only
arguments of the plain op (addcmul's `value`) and renamed ones (lerp's `end`), in-place forms on
the function's inputs, integer and float64 lists; the overload with a tensor of per-tensor scalars
is left whole and still right.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.lower.decompose import foreach_decompositions

pytestmark = pytest.mark.cpp

aten = torch.ops.aten


def _lists(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), ()]
    xs = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    ys = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    zs = [torch.rand(s, generator=g, dtype=dtype) + 0.5 for s in shapes]
    return xs, ys, zs


CASES = {
    "add_list_alpha": lambda xs, ys, zs: torch._foreach_add(xs, ys, alpha=0.5),
    "add_scalar": lambda xs, ys, zs: torch._foreach_add(xs, 2.0),
    "sub_scalar_list": lambda xs, ys, zs: torch._foreach_sub(xs, [1.0, 2.0, 3.0]),
    "mul_tensor_scalar": lambda xs, ys, zs: torch._foreach_mul(xs, torch.tensor(3.0)),
    "div_list": lambda xs, ys, zs: torch._foreach_div(xs, zs),
    "addcmul_value": lambda xs, ys, zs: torch._foreach_addcmul(xs, ys, zs, value=0.3),
    "addcdiv_scalar_list": lambda xs, ys, zs: torch._foreach_addcdiv(xs, ys, zs, [0.1, 0.2, 0.3]),
    "addcdiv_tensor_scalars": lambda xs, ys, zs: torch._foreach_addcdiv(xs, ys, zs, torch.tensor([0.1, 0.2, 0.3])),
    "lerp_scalar": lambda xs, ys, zs: torch._foreach_lerp(xs, ys, 0.25),
    "lerp_list": lambda xs, ys, zs: torch._foreach_lerp(xs, ys, [z * 0.5 for z in zs]),
    "pow_scalar": lambda xs, ys, zs: torch._foreach_pow(zs, 2.5),
    "pow_scalar_base": lambda xs, ys, zs: torch._foreach_pow(2.0, xs),
    "pow_list": lambda xs, ys, zs: torch._foreach_pow(zs, ys),
    "unary_chain": lambda xs, ys, zs: torch._foreach_reciprocal(torch._foreach_exp(torch._foreach_neg(
        torch._foreach_sqrt(zs)))),
    "maximum_clamp": lambda xs, ys, zs: torch._foreach_clamp_max(torch._foreach_maximum(xs, ys), [0.5, 0.1, 0.0]),
    "clamp_min_sign": lambda xs, ys, zs: torch._foreach_sign(torch._foreach_clamp_min(xs, 0.1)),
}


def _in_place(xs, ys, zs):
    # an optimizer's update on the function's own inputs: functionalized, then split
    torch._foreach_mul_(ys, 0.9)
    torch._foreach_add_(ys, zs, alpha=0.1)
    torch._foreach_addcdiv_(xs, ys, torch._foreach_add(torch._foreach_sqrt(zs), 1e-8), value=-0.01)
    return None


CASES["in_place_update"] = _in_place


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_foreach_ops_match_eager(name, dtype):
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor", fullgraph=True)
    got_args, want_args = _lists(dtype), _lists(dtype)
    got, want = compiled(*got_args), fn(*want_args)
    if want is not None:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w)
    for gs, ws in zip(got_args, want_args):
        for g, w in zip(gs, ws):
            torch.testing.assert_close(g, w)
    assert kiln.stats()["fallbacks"] == 0


def test_integer_lists_keep_their_type():
    def fn(xs):
        return torch._foreach_mul(torch._foreach_add(xs, 3), 2)

    xs = [torch.arange(6).reshape(2, 3), torch.arange(4, dtype=torch.int32)]
    got = kiln.compile(fn, backend="inductor")(xs)
    for g, w in zip(got, fn(xs)):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_which_overloads_are_split():
    table = foreach_decompositions()
    assert aten._foreach_addcmul.Scalar in table and aten._foreach_lerp.Scalar in table
    assert aten._foreach_add.List in table and aten._foreach_pow.ScalarAndTensor in table
    # per-tensor scalars held in a tensor, and the in-place forms (functionalized away first), are not
    assert aten._foreach_addcdiv.Tensor not in table and aten._foreach_add_.List not in table
