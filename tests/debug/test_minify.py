"""kiln.debug.minify shrinks each planted bug to a graph of a few nodes whose repro.py fails in a
fresh process (with the bug planted there too) and passes without it; KILN_REPRO_AFTER writes one."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.debug.minify import minify, minify_graph
from kiln.debug.repro import check_repro, graph_failure
from kiln.lower.lowerings import LOWERINGS
from tests.debug.conftest import inputs, program

pytestmark = pytest.mark.cpp
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_repro(path: str, cache: str, plant: str | None) -> subprocess.CompletedProcess:
    """repro.py in a fresh interpreter (its own artifact cache), the bug planted first if named."""
    boot = f"from tests.debug.planted import plant; plant({plant!r}); " if plant else ""
    code = boot + f"import runpy; runpy.run_path({path!r}, run_name='__main__')"
    env = dict(os.environ, KILN_CACHE_DIR=cache, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(path), timeout=300)


@pytest.mark.parametrize("bug", [
    "wrong_lowering",
    pytest.param("dropped_term", marks=pytest.mark.slow),
    pytest.param("broken_fusion", marks=pytest.mark.slow),
])
def test_minified_repro_fails_in_a_fresh_process(planted, tmp_path, bug):
    planted(bug)
    result = minify(program, *inputs())
    assert result.stage == "lower" and result.failure.kind == "accuracy", str(result)
    assert result.original_nodes >= 5
    assert result.nodes <= 3, str(result)
    path = result.write(str(tmp_path / "repro"))
    text = open(path).read()
    assert "class Repro(torch.nn.Module)" in text and "program" not in text  # none of the user's code
    failing = run_repro(path, str(tmp_path / "cache_a"), bug)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "FAILS (stage lower): wrong result" in failing.stdout
    fixed = run_repro(path, str(tmp_path / "cache_b"), None)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "matches eager" in fixed.stdout


def _crashing_cos(ctx, *args, **kwargs):
    raise RuntimeError("planted: the cos lowering crashes")


def test_crash_is_minified_to_the_crashing_node(fresh_cache, monkeypatch):
    monkeypatch.setitem(LOWERINGS, torch.ops.aten.cos.default, _crashing_cos)

    def f(x, y):
        a = torch.relu(x) + y
        b = a.exp().sum(-1, keepdim=True)
        return (torch.cos(b) * a).softmax(-1), a.mean()

    x, y = torch.randn(4, 8), torch.randn(8)
    gm = make_fx(f)(x, y)
    result = minify_graph(gm, [x, y], "lower")
    assert (result.failure.kind, result.failure.exc_type) == ("exception", "RuntimeError")
    targets = [n.target for n in result.gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.cos.default], result.gm.code
    assert result.inputs[0].numel() == 1  # the cos input's sizes were halved down to one element


def test_no_failure_is_an_error(fresh_cache):
    with pytest.raises(ValueError, match="no graph of this run fails"):
        minify(program, *inputs())
    gm = make_fx(lambda x: x.sin())(torch.randn(3))
    assert graph_failure(gm, [torch.randn(3)], "lower") is None


@pytest.mark.parametrize("when", ["aot", "lower"])
def test_repro_after_writes_a_repro_on_failure(planted, tmp_path, when):
    planted("wrong_lowering")
    folder = tmp_path / "repros"
    with kiln.config.patch(repro_after=when, repro_dir=str(folder)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kiln.compile(lambda x: x * 3 + 1)(torch.randn(4, 4))
    written = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f == "repro.py"]
    if when == "aot":
        assert not written  # a wrong value is no crash: "aot" writes on crashes only
        return
    assert len(written) == 1, caught
    assert any("repro written to" in str(w.message) for w in caught)
    assert "aten.mul.Tensor" in open(written[0]).read()


def test_repro_after_aot_catches_a_crash(fresh_cache, tmp_path, monkeypatch):
    monkeypatch.setitem(LOWERINGS, torch.ops.aten.cos.default, _crashing_cos)
    kiln.reset()
    folder = tmp_path / "repros"
    with kiln.config.patch(repro_after="aot", repro_dir=str(folder)), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        x = torch.randn(4)
        out = kiln.compile(lambda x: torch.cos(x) + 1)(x)  # falls back to eager, with a repro on disk
    assert torch.allclose(out, torch.cos(x) + 1)
    written = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f == "repro.py"]
    assert len(written) == 1
    assert "RuntimeError" in open(written[0]).read()


def test_repro_after_capture_writes_the_captured_graph(fresh_cache, tmp_path, monkeypatch):
    monkeypatch.setitem(LOWERINGS, torch.ops.aten.cos.default, _crashing_cos)
    kiln.reset()
    folder = tmp_path / "repros"
    with kiln.config.patch(repro_after="capture", repro_dir=str(folder)), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        kiln.compile(lambda x: torch.cos(x).relu() + 1)(torch.randn(4))
    (written,) = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f == "repro.py"]
    text = open(written).read()
    assert 'stage="inductor"' in text and "torch.cos" in text  # the torch-level graph, all backends to run
    module = runpy.run_path(written, run_name="loaded")  # the file as Python, here where the bug is planted
    assert check_repro(module["Repro"](), module["INPUTS"], stage="inductor", kind="exception",
                       exc_type="RuntimeError") == 1
