"""`python -m kiln lint|report|bisect|minify` (kiln/__main__.py), run in-process on small scripts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.__main__ import main
from kiln.debug.minify import minify_graph
from kiln.lower.lowerings import LOWERINGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = '''
import torch, kiln

def step(x, w):
    return torch.softmax(x * w, dim=-1) + x

compiled = kiln.compile(step)
print("result", float(compiled(torch.randn(8, 16), torch.randn(16)).sum()))
'''


def test_lint_command(tmp_path, capsys):
    path = tmp_path / "model.py"
    path.write_text("import torch\ndef f(x: torch.Tensor):\n    print(x)\n    return x.item()\n")
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:3: print() inside compiled code" in out and f"{path}:4: .item()" in out
    assert "kiln lint: 2 findings (2 graph breaks, 0 advice) in 1 files" in out
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\ndef f(x: torch.Tensor):\n    return torch.where(x > 0, x, -x)\n")
    assert main(["lint", str(clean)]) == 0


@pytest.mark.slow
def test_lint_command_in_a_fresh_process(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch\ndef f(x: torch.Tensor):\n    if x.sum() > 0:\n        return x\n    return -x\n")
    done = subprocess.run([sys.executable, "-m", "kiln", "lint", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Python `if` on a tensor value" in done.stdout, done.stderr


@pytest.mark.cpp
@pytest.mark.slow
def test_bisect_command_names_the_planted_lowering(planted, tmp_path, capsys):
    planted("wrong_lowering")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    assert main(["bisect", str(script)]) == 1
    out = capsys.readouterr().out
    assert "== step" in out and "culprit (lowering): aten.mul.Tensor" in out and "kernel source:" in out


@pytest.mark.cpp
def test_report_command(fresh_cache, tmp_path, capsys):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    assert main(["report", "--out", str(tmp_path / "out"), str(script)]) == 0
    out = capsys.readouterr().out
    path = out.strip().splitlines()[-1].split("report written to ")[1]
    assert path.startswith(str(tmp_path / "out")) and "Frame 0: step" in open(path).read()


def _crashing_cos(ctx, *args, **kwargs):
    raise RuntimeError("planted: the cos lowering crashes")


@pytest.mark.cpp
def test_minify_command_shrinks_a_repro_further(fresh_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(LOWERINGS, torch.ops.aten.cos.default, _crashing_cos)
    x = torch.randn(4, 8)
    gm = make_fx(lambda x: (torch.cos(x.relu() + 1) * 2).sum(-1))(x)
    result = minify_graph(gm, [x], "lower", max_trials=0)  # no shrinking: a repro of the whole graph
    first = result.write(str(tmp_path / "first"))
    assert result.nodes == 5
    assert main(["minify", "--out", str(tmp_path / "second"), first]) == 1
    out = capsys.readouterr().out
    assert "5 -> 1 nodes" in out
    assert "torch.ops.aten.cos.default" in open(tmp_path / "second" / "repro.py").read()
