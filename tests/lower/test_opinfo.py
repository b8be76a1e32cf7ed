"""OpInfo forward sweep through compile_graph: a fixed CI slice here, the whole database @slow.

Run `python tests/lower/opinfo_sweep.py` for the full table and the pass rate.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from kiln import config
from kiln.lower import compile_graph
from kiln.runtime import native

sys.path.insert(0, str(Path(__file__).parent))
from opinfo_sweep import as_function, check_op, op_db, samples  # noqa: E402

CI_SLICE = [
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "remainder", "abs", "neg", "exp", "log",
    "rsqrt", "sin", "tanh", "sigmoid", "nn.functional.gelu", "nn.functional.silu", "clamp", "where", "maximum",
    "eq", "sum", "mean", "amax", "argmax", "var", "softmax", "log_softmax", "logsumexp", "nn.functional.layer_norm",
    "cat", "permute", "expand", "index_select", "gather", "nn.functional.embedding", "masked_fill", "cumsum",
    "cumprod",
]


@pytest.mark.cpp
@pytest.mark.parametrize("name", CI_SLICE)
def test_opinfo_slice(name: str) -> None:
    result = check_op(name, opt_level="-O1")
    assert result == "pass", result  # every op of the slice has a lowering: a skip here means one was lost


@pytest.mark.cpp
@pytest.mark.slow
def test_opinfo_full_sweep() -> None:
    results = {n: check_op(n, opt_level="-O1") for n in sorted(op_db())}
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    passed = sum(r == "pass" for r in tried.values())
    print(f"OpInfo forward sweep: {passed}/{len(tried)} passed")
    assert passed / len(tried) > 0.95, {n: r for n, r in tried.items() if r != "pass"}


@pytest.mark.cpp
@pytest.mark.parametrize("plan", [False, True], ids=["compiled", "plan"])
@pytest.mark.parametrize("name", CI_SLICE)
def test_opinfo_slice_native_wrapper_matches_python(name: str, plan: bool) -> None:
    """The native wrapper (one C++ function per graph, or its plan run by the boundary extension)
    gives the Python wrapper's outputs, bit for bit (same kernels, same externs): every sample of
    the op in one graph, compiled both ways."""
    cases = samples(op_db()[name], torch.float32)
    fn, leaves = as_function(op_db()[name], cases)
    gm = make_fx(fn)(*leaves)
    with config.patch(cpu_wrapper="python"):
        python = compile_graph(gm, leaves, options={"opt_level": "-O1"})
    with config.patch(cpu_wrapper="native", native_plan=plan):
        made = compile_graph(gm, leaves, options={"opt_level": "-O1"})
    running = getattr(made.fn, "current", made.fn)  # a plan runs behind a settled TieredWrapper
    assert getattr(running, "func", None) is native.boundary().call, "the graph kept the Python wrapper"
    want = pytree.tree_leaves(python(*leaves))
    got = pytree.tree_leaves(made(*leaves))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        else:
            assert g == w
