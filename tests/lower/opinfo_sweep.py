"""Run PyTorch OpInfo samples through kiln.lower.compile_graph and compare with eager.

Shared by the CI slice (tests/lower/test_opinfo.py) and the full sweep (@slow, and
`python tests/lower/opinfo_sweep.py` which prints the pass rate). All samples of one op go into
one graph, so each op costs one C++ build (and nothing once the disk cache has it).
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from kiln.lower import compile_graph
from kiln.lower.decompose import wants_decomposition
from kiln.lower.lowerings import LOWERINGS

MAX_SAMPLES = 4
NONDETERMINISTIC = {"nn.functional.rrelu", "bernoulli", "normal", "uniform", "randint_like", "rand_like",
                    "randn_like", "nn.functional.dropout", "nn.functional.alpha_dropout"}


@functools.lru_cache(maxsize=None)
def op_db() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db as db
    return {f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name: o for o in db}


def samples(opinfo: Any, dtype: torch.dtype, *, requires_grad: bool = False,
            limit: int = MAX_SAMPLES) -> list[tuple[Any, tuple, dict]]:
    """The first `limit` samples as (input, args, kwargs), seeded so that runs agree."""
    torch.manual_seed(0)
    out = []
    for s in opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        out.append((s.input, tuple(s.args), dict(s.kwargs)))
        if len(out) >= limit:
            break
    return out


def as_function(opinfo: Any, cases: list[tuple[Any, tuple, dict]]) -> tuple[Any, list[torch.Tensor]]:
    """One function of every sample's tensors that calls the op on each sample, and those tensors."""
    leaves, specs = [], []
    for inp, args, kwargs in cases:
        flat, spec = pytree.tree_flatten((inp, args, kwargs))
        specs.append((spec, [isinstance(x, torch.Tensor) for x in flat], flat))
        leaves += [x for x in flat if isinstance(x, torch.Tensor)]

    def fn(*tensors: torch.Tensor) -> tuple:
        it = iter(tensors)
        outs = []
        for spec, is_t, flat in specs:
            vals = [next(it) if t else x for t, x in zip(is_t, flat)]
            inp, args, kwargs = pytree.tree_unflatten(vals, spec)
            outs.append(opinfo.op(inp, *args, **kwargs))
        return tuple(outs)

    return fn, leaves


def check_op(name: str, dtype: torch.dtype = torch.float32, opt_level: str = "-O3") -> str:
    """'pass', 'skip: why' or 'fail: why' for one op of the OpInfo database."""
    opinfo = op_db()[name]
    if name.startswith(("empty", "new_empty")) or name in NONDETERMINISTIC:
        return "skip: uninitialized or random output"
    if dtype not in opinfo.supported_dtypes("cpu"):
        return "skip: dtype"
    cases = samples(opinfo, dtype)
    if not cases:
        return "skip: no samples"
    fn, leaves = as_function(opinfo, cases)
    try:
        expected = fn(*leaves)
        gm = make_fx(fn)(*leaves)
    except Exception as e:  # the op cannot run or be traced here: not Kiln's to judge
        return f"skip: eager/trace {type(e).__name__}"
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if any(getattr(getattr(t, "_schema", None), "is_mutable", False) for t in targets):
        return "skip: not a functional graph"  # AOT autograd hands lower functional graphs only
    if not any(t in LOWERINGS or wants_decomposition(t) for t in targets):
        return "skip: no lowering"
    if any("rand" in str(t) or "bernoulli" in str(t) or "dropout" in str(t) for t in targets):
        return "skip: random"
    try:
        compiled = compile_graph(gm, leaves, options={"opt_level": opt_level})
        got = compiled(*leaves)
    except Exception as e:
        return f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    exp_flat = [x for x in pytree.tree_leaves(expected)]
    got_flat = [x for x in pytree.tree_leaves(got)]
    if len(exp_flat) != len(got_flat):
        return f"fail: {len(got_flat)} outputs, expected {len(exp_flat)}"
    for g, e in zip(got_flat, exp_flat):
        try:
            if isinstance(e, torch.Tensor):
                assert isinstance(g, torch.Tensor), type(g)
                assert g.dtype == e.dtype, (g.dtype, e.dtype)
                torch.testing.assert_close(g, e, equal_nan=True, atol=1e-4, rtol=1e-4)
            else:
                assert g == e, (g, e)
        except AssertionError as err:
            return f"fail: mismatch {str(err).splitlines()[0][:200]}"
    return "pass"


def main() -> None:
    names = sys.argv[1:] or sorted(op_db())
    results = {n: check_op(n) for n in names}
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    for n, r in sorted(results.items()):
        if not r.startswith("skip") or len(names) < 20:
            print(f"{n:40s} {r}")
    passed = sum(r == "pass" for r in tried.values())
    print(f"\nOpInfo forward sweep: {passed}/{len(tried)} passed "
          f"({100 * passed / max(len(tried), 1):.1f}%), {len(results) - len(tried)} skipped")


if __name__ == "__main__":
    main()
