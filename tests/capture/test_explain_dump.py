"""KILN_DEBUG=1 dump: one folder per capture with bytecode, glue, graphs and guards, and an index."""
from __future__ import annotations

import os

import pytest
import torch

import kiln
from kiln.debug import dump


@pytest.fixture
def debug_dir(tmp_path):
    kiln.reset()
    dump.reset()
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        yield tmp_path
    dump.reset()
    kiln.reset()


def body(x, n):
    return x.sin() * n


def test_dump_writes_each_capture_and_an_index(debug_dir):
    f = kiln.compile(body, backend="eager")
    f(torch.randn(3), 2)
    f(torch.randn(3), 2.5)  # a float where an int was: a recompile
    (run,) = os.listdir(debug_dir)
    run_dir = debug_dir / run
    folders = sorted(p for p in os.listdir(run_dir) if p != "index.html")
    assert len(folders) == 2 and all(p.endswith("_body") for p in folders)
    first = run_dir / folders[0]
    assert {"bytecode_before.txt", "glue.py", "guards.py", "graph_0.py"} <= set(os.listdir(first))
    assert "def ___check_guards(L, G, F):" in (first / "guards.py").read_text()
    assert "sin" in (first / "graph_0.py").read_text()
    index = (run_dir / "index.html").read_text()
    assert folders[0] in index and "recompiled because n changed from 2" in index


def test_no_dump_without_debug(tmp_path):
    kiln.reset()
    dump.reset()
    with kiln.config.patch(debug=False, debug_dir=str(tmp_path)):
        kiln.compile(body, backend="eager")(torch.randn(3), 2)
    assert os.listdir(tmp_path) == []
