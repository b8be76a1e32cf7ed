"""kiln.runtime.aot and the artifact protocol: a compiled graph's runtime as data (a recipe) and
back, in one process.

The persistent frame cache stores these recipes through kiln.runtime.records (data only); here the
rebuilt runtime must compute what the original computes, forward and backward.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.capture import persist
from kiln.capture.entry import frames_of
from kiln.runtime.aot import AotRuntime
from kiln.runtime.artifact import Recipe, describe, rebuild


@pytest.fixture(autouse=True)
def _own_cache(tmp_path):
    kiln.reset()
    with kiln.config.patch(cache_dir=str(tmp_path)):
        yield
    kiln.reset()


def _runtime(fn, *args) -> AotRuntime:
    compiled = kiln.compile(fn, options={"opt_level": "-O1"})
    compiled(*args)
    glue = frames_of(compiled).entries[0].glue
    runtimes = [v for v in glue.__globals__.values() if isinstance(v, AotRuntime)]
    assert len(runtimes) == 1
    return runtimes[0]


def _round_trip(recipe: Recipe) -> Recipe:
    return persist.loads(persist.dumps(recipe))


def test_inference_recipe_rebuilds_the_same_function() -> None:
    def f(x, y):
        return torch.sin(x) * y + 1, (x @ y.t()).relu()

    x, y = torch.randn(6, 5), torch.randn(6, 5)
    with torch.no_grad():
        runtime = _runtime(f, x, y)
        recipe = describe(runtime)
        assert recipe is not None and recipe.kind == "aot" and recipe.fields["function"] is None
        forward = recipe.fields["forward"]  # the Python wrapper, and where its native one will be once hot
        assert forward.kind == "tiered" and forward.fields["python"].kind == "wrapper"
        loaded = rebuild(_round_trip(recipe))
        for got, want in zip(loaded(x, y), f(x, y)):
            torch.testing.assert_close(got, want)


def test_training_recipe_runs_the_compiled_backward() -> None:
    def f(x, w):
        return (torch.tanh(x @ w) ** 2).sum()

    x = torch.randn(4, 3)
    w = torch.randn(3, 2, requires_grad=True)
    recipe = describe(_runtime(f, x, w))
    assert recipe is not None and recipe.fields["function"] is not None
    loaded = rebuild(_round_trip(recipe))
    out = loaded(x, w)[0]  # the runtime returns the graph's outputs; the glue picks them
    out.backward()
    got = w.grad.clone()
    w.grad = None
    f(x, w).backward()
    torch.testing.assert_close(got, w.grad)


def test_runtime_with_lifted_tensors_has_no_recipe() -> None:
    runtime = AotRuntime(root=torch.nn.Linear(2, 2), lifted=("weight",), meta=None, out_spec=None,
                         binding={}, forward=lambda *a: a)
    assert describe(runtime) is None
    assert persist.loads(persist.dumps(torch.float16)) is torch.float16
