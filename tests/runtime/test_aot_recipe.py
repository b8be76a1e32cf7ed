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


def _strided(n: int = 4) -> torch.Tensor:
    return torch.arange(n * 6.0).reshape(2 * n, 3)[::2]


def test_views_rebuilt_by_replay_survive_the_recipe() -> None:
    # outputs aliasing an updated strided input and an intermediate, and an input re-strided in
    # place: their view chains travel as data and replay on the caller's tensors as before
    def f(a):
        a.add_(1)
        y = a * 2
        views = (a[:, :1], y, y[1:], a.t())
        a.t_()
        return *views, a[0], a.sum()

    with torch.no_grad():
        recipe = describe(_runtime(f, _strided()))
    assert recipe is not None
    meta = recipe.fields["meta"]
    assert [o.kind for o in meta.outputs][:5] == ["input_view", "base", "base_view", "input_view", "input_view"]
    assert meta.metadata_mutations and meta.metadata_mutations[0][0] == 0 and meta.mutated_inputs == (0,)
    loaded = rebuild(_round_trip(recipe))
    a, a_eager = _strided(), _strided()
    got, want = loaded(a), f(a_eager)
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
    assert torch.equal(a, a_eager) and a.shape == a_eager.shape and a.stride() == a_eager.stride()
    assert got[0].untyped_storage()._cdata == a.untyped_storage()._cdata  # a view of the caller's tensor
    assert got[2]._base is got[1] or got[2]._base is got[1]._base


def test_a_frame_updating_one_of_several_tensor_inputs_is_not_stored() -> None:
    # at run time it checks that no other input shares the updated one's memory, and runs the
    # captured graph op by op when one does: a runtime rebuilt from disk has no captured graph
    def f(a, b):
        a.add_(b)
        return a.sum()

    with torch.no_grad():
        assert describe(_runtime(f, torch.randn(4, 3), torch.randn(4, 3))) is None


def test_a_view_chain_naming_anything_but_a_view_op_is_refused() -> None:
    from kiln.runtime.aot import OutputRecord, RuntimeMeta
    from kiln.runtime.views import ViewStep

    def f(a):
        return a[1:], a.sum()

    with torch.no_grad():
        recipe = describe(_runtime(f, _strided()))
    assert recipe is not None
    meta = recipe.fields["meta"]
    planted = OutputRecord("input_view", 0, None, None, (ViewStep("system", ("echo",)),))
    fields = dict(recipe.fields, meta=RuntimeMeta(meta.mutated_inputs, (planted, *meta.outputs[1:]),
                                                 meta.num_graph_outputs, meta.num_intermediate_bases))
    with pytest.raises(ValueError, match="not a view op"):
        rebuild(_round_trip(Recipe("aot", fields)))


def test_a_view_whose_arguments_are_size_symbols_is_not_stored() -> None:
    def f(a):
        return a.view(a.shape[0] * 3)[: a.shape[0] - 1], a.sum()  # view([3*s0]), slice(0, 0, s0 - 1)

    compiled = kiln.compile(f, dynamic=True, options={"opt_level": "-O1"})
    with torch.no_grad():
        for n in (4, 6):  # the chain's symbols are read from this call's input
            x = torch.randn(n, 3)
            got = compiled(x)[0]
            assert torch.equal(got, f(x)[0]) and got.untyped_storage()._cdata == x.untyped_storage()._cdata
    glue = frames_of(compiled).entries[0].glue
    runtime = next(v for v in glue.__globals__.values() if isinstance(v, AotRuntime))
    assert describe(runtime) is None


def test_recipe_keeps_eagers_version_bumps() -> None:
    """A runtime read back from its recipe moves an updated input's counter once per in-place op,
    as eager does (RuntimeMeta.extra_version_bumps)."""
    def f(x):
        x.add_(1)
        x.mul_(2)
        x[1:].sub_(1)
        return x.sum()

    runtime = _runtime(f, torch.randn(5))
    recipe = describe(runtime)
    assert recipe is not None
    loaded = rebuild(_round_trip(recipe))
    x = torch.randn(5)
    expected = x.clone()
    start = x._version
    (got,) = loaded(x)
    assert x._version - start == 3
    torch.testing.assert_close(got, f(expected))
    torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("grad", [False, True])
def test_recipe_keeps_the_versions_of_results_updated_in_place(grad: bool) -> None:
    # a returned intermediate updated in place leaves with eager's version, rebuilt from data too
    def f(x):
        y = x * 2
        y.add_(1)
        y.mul_(3)
        return y, y[1:]

    x = torch.randn(5, requires_grad=grad)
    runtime = _runtime(f, x)
    recipe = describe(runtime)
    assert recipe is not None and (recipe.fields["function"] is not None) == grad
    loaded = rebuild(_round_trip(recipe))
    got, want = loaded(x), f(x)
    assert [t._version for t in got] == [t._version for t in want] == [2, 2]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
