"""Backward half of the OpInfo sweep: gradients through Kiln's whole default backend vs eager autograd.

For each differentiable op, its first samples (requires_grad=True) are traced into one ATen graph
with make_fx (Kiln's capture is not under test here), handed
to backend "inductor" (kiln.autograd's AOT trace + partition, kiln.lower's compile_graph for both
halves), run, and backpropagated with a fixed random cotangent (sum of outputs times random
weights); the input gradients are compared with torch.autograd.grad on the eager op. Shared by
the CI slice (tests/lower/test_opinfo_backward.py) and the full sweep (@slow, and
`python tests/lower/opinfo_backward_sweep.py [names...]`, which prints the pass rate).
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).parent))
from opinfo_sweep import NONDETERMINISTIC, as_function, op_db, samples  # noqa: E402

from kiln.backends import inductor  # noqa: E402

MAX_SAMPLES = 2
# Loose enough for reductions whose summation order differs from ATen's; float64 keeps it tight.
TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-7, rtol=1e-7)}


def grad_samples(opinfo: Any, dtype: torch.dtype) -> list[tuple[Any, tuple, dict]]:
    """The first MAX_SAMPLES samples with requires_grad=True inputs."""
    return samples(opinfo, dtype, requires_grad=True, limit=MAX_SAMPLES)


def _cotangent_loss(outputs: Any, weights: list[torch.Tensor]) -> torch.Tensor:
    """sum(out * w) over the floating outputs that carry a gradient."""
    terms = [(o * w).sum() for o, w in zip(_grad_outputs(outputs), weights)]
    return torch.stack(terms).sum()


def _grad_outputs(outputs: Any) -> list[torch.Tensor]:
    return [o for o in pytree.tree_leaves(outputs)
            if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.requires_grad]


def check_op_backward(name: str, dtype: torch.dtype = torch.float32, opt_level: str = "-O3") -> str:
    """'pass', 'skip: why' or 'fail: why' for the gradients of one op of the OpInfo database."""
    opinfo = op_db()[name]
    if name.startswith(("empty", "new_empty")) or name in NONDETERMINISTIC:
        return "skip: uninitialized or random output"
    if not opinfo.supports_autograd:
        return "skip: not differentiable"
    if opinfo.op is opinfo.inplace_variant:  # the op's own in-place/out= variants: see below too
        return "skip: in-place variant"
    if dtype not in opinfo.supported_backward_dtypes("cpu"):
        return "skip: dtype"
    try:
        cases = grad_samples(opinfo, dtype)
    except Exception as e:
        return f"skip: samples {type(e).__name__}"
    if not cases:
        return "skip: no samples"
    fn, leaves = as_function(opinfo, cases)
    if not any(t.requires_grad for t in leaves):
        return "skip: no input requires grad"

    wants = [t for t in leaves if t.requires_grad]
    try:
        expected = fn(*leaves)
        diff_out = _grad_outputs(expected)
        if not diff_out:
            return "skip: outputs not differentiable"
        torch.manual_seed(1)
        weights = [torch.randn_like(o) for o in diff_out]
        expected_grads = torch.autograd.grad(_cotangent_loss(expected, weights), wants, allow_unused=True)
        # Traced with grad on: some ops pick a forward-only kernel under no_grad (embedding_bag's
        # _embedding_bag_forward_only has no derivative), or branch on requires_grad.
        gm = make_fx(fn)(*leaves)
        for node in gm.graph.nodes:  # make_fx's metadata: fakes of another mode, without requires_grad
            node.meta.pop("val", None)
            node.meta.pop("example_value", None)
    except Exception as e:  # the op cannot run, differentiate or be traced here: not Kiln's to judge
        return f"skip: eager/trace {type(e).__name__}"
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if any("rand" in str(t) or "bernoulli" in str(t) or "dropout" in str(t) for t in targets):
        return "skip: random"
    in_place = name.endswith("_") and not name.endswith("__")
    if in_place or any("out" in kwargs for _, _, kwargs in cases):
        return "skip: in-place or out= variant"
    # Other mutations (an op's internal copy_/fill_ into a fresh tensor) stay: kiln.autograd functionalizes.
    if any(str(t).startswith(("aten.nonzero", "aten.masked_select", "aten.unique", "aten._local_scalar_dense"))
           for t in targets):
        return "skip: data-dependent output shape"
    try:
        compiled = inductor(gm, list(leaves), options={"opt_level": opt_level})
        got = compiled(*leaves)
        got_out = _grad_outputs(got)
        if len(got_out) != len(diff_out):
            return f"fail: {len(got_out)} differentiable outputs, expected {len(diff_out)}"
        got_grads = torch.autograd.grad(_cotangent_loss(got, weights), wants, allow_unused=True)
    except Exception as e:
        if type(e).__name__ == "DataDependentOutputError":  # Kiln refuses it clearly: not a wrong answer
            return "skip: data-dependent output (Kiln refuses it)"
        return f"fail: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    for i, (g, e) in enumerate(zip(got_grads, expected_grads)):
        if g is None or e is None:
            # Kiln may materialize a zero gradient where eager reports none (and vice versa).
            other = e if g is None else g
            if other is not None and other.abs().max() > 0:
                return f"fail: grad {i} is None in {'Kiln' if g is None else 'eager'} only"
            continue
        try:
            assert g.shape == e.shape, (g.shape, e.shape)
            torch.testing.assert_close(g, e, equal_nan=True, **TOLERANCES[dtype])
        except AssertionError as err:
            diff = (g.double() - e.double()).abs().nan_to_num(0).max().item() if g.shape == e.shape else "shape"
            return f"fail: grad {i} max diff {diff}: {str(err).splitlines()[0][:120]}"
    return "pass"


def summarize(results: dict[str, str], dtype: torch.dtype = torch.float32) -> str:
    """Pass rate over ops and over samples (an op's samples share one graph, so they pass or fail
    together), then how many ops were skipped for each reason."""
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    passed = sum(r == "pass" for r in tried.values())
    n_samples = {n: len(grad_samples(op_db()[n], dtype)) for n in tried}
    samples_passed = sum(n_samples[n] for n, r in tried.items() if r == "pass")
    reasons = collections.Counter("skip: eager/trace" if r.startswith("skip: eager/trace") else r
                                  for r in results.values() if r.startswith("skip"))
    skipped = ", ".join(f"{count} {why[6:]}" for why, count in reasons.most_common())
    return (f"OpInfo backward sweep: {passed}/{len(tried)} ops passed "
            f"({100 * passed / max(len(tried), 1):.1f}%), {samples_passed}/{sum(n_samples.values())} samples; "
            f"{len(results) - len(tried)} ops skipped ({skipped})")


def main() -> None:
    names = sys.argv[1:] or sorted(op_db())
    results = {}
    for n in names:
        results[n] = check_op_backward(n, opt_level="-O1")
        if not results[n].startswith("skip") or len(names) < 20:
            print(f"{n:40s} {results[n]}", flush=True)
    print("\n" + summarize(results))


if __name__ == "__main__":
    main()
