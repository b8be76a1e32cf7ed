"""Sweep over PyTorch's OpInfo database: dim 0 of each op's first input made symbolic.

For each op's first float32 sample, run it on meta tensors with a static dim 0 and with a symbolic
one (under the Python dispatcher). Where the static run works and agrees with the real op, the
symbolic run must work too, give the same sizes at the hint, and record guards that hold there.
Anything that fails only because the size is symbolic is a Kiln bug. Slow (~90 s): `-m slow`.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._pytree import tree_flatten, tree_map

from kiln.symbolic import ShapeEnv, expr_of
from kiln.symbolic.expr import evaluate_at

pytestmark = pytest.mark.slow


def _to_meta(a):
    return a.to("meta") if isinstance(a, torch.Tensor) and a.layout == torch.strided else a


def _shapes(out, env: ShapeEnv | None) -> list:
    flat, _ = tree_flatten(out)
    shapes = []
    for t in flat:
        if isinstance(t, torch.Tensor):
            if env is None:
                shapes.append([int(d) for d in t.shape])
            else:
                shapes.append([d if isinstance(d, int) else int(evaluate_at(env.replace(expr_of(d)), env._hints))
                               for d in t.shape])
    return shapes


def _torch_symint_works(op, x: torch.Tensor, args, kwargs) -> bool:
    """The oracle: does the op run with torch's own ShapeEnv/SymNode in the same setting? (Some ops,
    e.g. cov and kron, hit an internal assert of the arg parser on bare symbolic meta tensors.)"""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv as TorchShapeEnv

    env = TorchShapeEnv()
    source = ConstantSource("x_size_0")
    sym = env.create_symbol(int(x.shape[0]), source, dynamic_dim=DimDynamic.DYNAMIC)
    s0 = env.create_symintnode(sym, hint=int(x.shape[0]), source=source)
    try:
        with enable_python_dispatcher():
            op(torch.empty([s0, *x.shape[1:]], dtype=x.dtype, device="meta"), *args, **kwargs)
    except Exception:
        return False
    return True


def _first_sample(op):
    try:
        return next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
    except Exception:
        return None


def test_symbolic_dim0_agrees_with_static_meta():
    from torch.testing._internal.common_methods_invocations import op_db

    failures = []
    checked = 0
    for op in op_db:
        sample = _first_sample(op)
        if sample is None:
            continue
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.dim() == 0 or x.shape[0] < 2 \
                or not x.is_contiguous():
            continue
        args, kwargs = tree_map(_to_meta, sample.args), tree_map(_to_meta, sample.kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                real = _shapes(op(x, *sample.args, **sample.kwargs), None)
                with enable_python_dispatcher():
                    static = _shapes(op(x.to("meta"), *args, **kwargs), None)
            except Exception:
                continue  # not an op the meta kernels handle: nothing symbolic to learn here
            if static != real:
                continue
            env = ShapeEnv()
            s0 = env.create_symbol(int(x.shape[0]), "L['x'].size()[0]")
            try:
                with enable_python_dispatcher():
                    out = op(torch.empty([s0, *x.shape[1:]], dtype=x.dtype, device="meta"), *args, **kwargs)
                got = _shapes(out, env)
            except Exception as e:  # data-dependent ops may refuse; anything else is a failure
                data_dependent = "data-dependent" in str(e) or "depends on the data" in str(e)
                if not data_dependent and _torch_symint_works(op, x, args, kwargs):
                    failures.append(f"{op.name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                continue
        checked += 1
        if got != real:
            failures.append(f"{op.name}: symbolic sizes {got} != real {real}")
        elif env.failing_guard({"x": x}) is not None:
            failures.append(f"{op.name}: guard fails at the example: {env.failing_guard({'x': x}).python}")
    assert checked > 300
    assert failures == []
