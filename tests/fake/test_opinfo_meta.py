"""OpInfo sweep: every float32 CPU sample of PyTorch's op database, run real and fake.

For each sample the fake result must match the real one leaf by leaf: same structure, and for each
tensor the same shape, dtype, device and strides (strides compared on dims longer than 1, where
they mean something). Samples whose real run raises are skipped; a DataDependentOutputError from
the fake run is expected (nonzero, unique, ...) and reported apart. The full sweep is slow; CI runs
SLICE. Run `python tests/fake/test_opinfo_meta.py [op names]` for the summary table.
"""
from __future__ import annotations

import collections
import itertools
import sys
import warnings
from dataclasses import dataclass, field

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from kiln.errors import DataDependentOutputError
from kiln.fake import FakeTensorMode, is_fake

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

# A fixed, representative slice (pointwise, reductions, views, indexing, linear algebra, nn
# functional, factories, shape ops); every one of these passes and must keep passing.
SLICE = [
    "add", "sub", "mul", "div", "pow", "abs", "exp", "log", "sin", "tanh", "sigmoid", "sqrt",
    "rsqrt", "clamp", "where", "maximum", "minimum", "lerp", "addcmul", "ne", "lt", "logical_and",
    "sum", "mean", "amax", "argmax", "var", "std", "prod", "cumsum", "logsumexp", "norm", "max",
    "sort", "topk", "view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze",
    "flatten", "expand", "narrow_copy", "select", "unbind", "chunk", "split", "cat", "stack", "flip",
    "roll", "gather", "scatter", "index_select", "index_add", "take_along_dim", "tril", "repeat",
    "mm", "bmm", "matmul", "addmm", "einsum", "linalg.vector_norm", "nn.functional.linear",
    "nn.functional.conv2d", "nn.functional.layer_norm", "softmax",
    "nn.functional.gelu", "nn.functional.embedding", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.dropout", "nn.functional.pad",
    "nn.functional.cross_entropy", "nn.functional.interpolate", "zeros_like", "full_like",
    "arange", "linspace", "eye", "new_empty", "contiguous", "clone", "masked_fill", "diag",
]

SLICE_SAMPLES = 6  # the first samples of each op, to keep the CI slice fast


@dataclass
class SweepResult:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    data_dependent: list[str] = field(default_factory=list)
    unbuildable: list[str] = field(default_factory=list)

    def summary(self) -> str:
        tested = len(self.passed) + len(self.failed)
        rate = 100.0 * len(self.passed) / tested if tested else 0.0
        lines = [f"OpInfo fake sweep: {len(self.passed)}/{tested} ops pass ({rate:.1f}%); "
                 f"{len(self.data_dependent)} data-dependent (expected); "
                 f"{len(self.unbuildable)} without a runnable float32 sample"]
        if self.data_dependent:
            lines.append("  data-dependent: " + ", ".join(sorted(self.data_dependent)))
        for name, why in sorted(self.failed.items()):
            lines.append(f"  FAIL {name}: {why}")
        return "\n".join(lines)

    @property
    def rate(self) -> float:
        tested = len(self.passed) + len(self.failed)
        return len(self.passed) / tested if tested else 0.0


def _ops_named(names: list[str] | None) -> list:
    ops = [op for op in op_db if names is None or op.name in names or
           (op.name + "." + op.variant_test_name) in names]
    return ops


def _op_id(op) -> str:
    return op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"


def compare(real, fake) -> str | None:
    """None if the fake output matches the real one in structure and tensor metadata."""
    real_leaves, real_spec = tree_flatten(real)
    fake_leaves, fake_spec = tree_flatten(fake)
    if real_spec != fake_spec:
        return f"output structure differs: {real_spec} vs {fake_spec}"
    for i, (r, f) in enumerate(zip(real_leaves, fake_leaves)):
        if isinstance(r, torch.Tensor):
            if not is_fake(f):
                return f"output {i} is {type(f).__name__}, not a FakeTensor"
            if r.shape != f.shape:
                return f"output {i} shape {tuple(f.shape)} != real {tuple(r.shape)}"
            if r.dtype != f.dtype:
                return f"output {i} dtype {f.dtype} != real {r.dtype}"
            if r.device != f.device:
                return f"output {i} device {f.device} != real {r.device}"
            if r.layout != f.layout:
                return f"output {i} layout {f.layout} != real {r.layout}"
            if r.layout == torch.strided and r.numel() > 1:
                for d in range(r.dim()):
                    if r.shape[d] > 1 and r.stride(d) != f.stride(d):
                        return f"output {i} strides {f.stride()} != real {r.stride()}"
        elif isinstance(f, torch.Tensor):
            return f"output {i} is a tensor, real is {type(r).__name__}"
    return None


def check_sample(op, sample) -> str | None:
    """'ok', 'skip' (real raised), 'dd' (data-dependent), or a failure message."""
    try:
        real = op(sample.input, *sample.args, **sample.kwargs)
    except Exception:
        return "skip"
    mode = FakeTensorMode()
    to_fake = lambda x: mode.from_real(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
    try:
        inp, args, kwargs = tree_map(to_fake, (sample.input, sample.args, sample.kwargs))
        with mode:
            fake = op(inp, *args, **kwargs)
    except DataDependentOutputError:
        return "dd"
    except Exception as e:  # a failure to report, whatever it is
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return compare(real, fake) or "ok"


def check_op(op, max_samples: int | None = None) -> str:
    """'pass', 'dd', 'unbuildable' or 'FAIL: reason' for the float32 CPU samples of one op."""
    if torch.float32 not in op.supported_dtypes("cpu"):
        return "unbuildable"
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=False),
                                        max_samples))
    except Exception:
        return "unbuildable"
    outcomes = collections.Counter()
    for sample in samples:
        torch.manual_seed(0)
        outcome = check_sample(op, sample)
        if outcome not in ("ok", "skip", "dd"):
            return "FAIL: " + outcome
        outcomes[outcome] += 1
    if outcomes["dd"]:
        return "dd"
    if not outcomes["ok"]:
        return "unbuildable"
    return "pass"


def sweep(names: list[str] | None = None, verbose: bool = False,
          max_samples: int | None = None) -> SweepResult:
    result = SweepResult()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in _ops_named(names):
            outcome = check_op(op, max_samples)
            name = _op_id(op)
            if verbose:
                print(f"{name}: {outcome}", flush=True)
            if outcome == "pass":
                result.passed.append(name)
            elif outcome == "dd":
                result.data_dependent.append(name)
            elif outcome == "unbuildable":
                result.unbuildable.append(name)
            else:
                result.failed[name] = outcome[len("FAIL: "):]
    return result


@pytest.mark.parametrize("op", _ops_named(SLICE), ids=_op_id)
def test_slice(op):
    outcome = check_op(op, max_samples=SLICE_SAMPLES)
    assert outcome == "pass", outcome


def test_slice_names_exist():
    names = {op.name for op in op_db}
    assert not [n for n in SLICE if n not in names]


def test_data_dependent_ops_are_reported_not_failed():
    result = sweep(["nonzero", "unique", "masked_select"], max_samples=SLICE_SAMPLES)
    assert sorted(result.data_dependent) == ["masked_select", "nonzero", "unique"], result.summary()


@pytest.mark.slow
def test_full_sweep():
    result = sweep()
    print("\n" + result.summary())
    assert result.rate >= 0.95, result.summary()


if __name__ == "__main__":
    print(sweep(sys.argv[1:] or None, verbose=True).summary())
