"""KILN_DEBUG=1 writes each lowering pass's output, named after the pass, into the dump's run folder."""
from __future__ import annotations

import os

import pytest
import torch

from kiln import config
from kiln.debug import dump

from .conftest import compile_fn

pytestmark = pytest.mark.cpp

PASS_FILES = ("aten_graph.py", "decompose.py", "lower_to_loop_ir.txt", "schedule.txt", "codegen_cpp.cpp",
              "codegen_wrapper.py", "build.txt", "timings.txt")


def _dump_of_one_compile(tmp_path, monkeypatch) -> str:
    """Compile one graph under KILN_DEBUG into a fresh run folder; returns its lower_* folder."""
    monkeypatch.setattr(config, "debug", True)
    monkeypatch.setattr(config, "debug_dir", str(tmp_path / "debug"))
    dump.reset()  # a fresh run folder
    try:
        compile_fn(lambda x: torch.softmax(x, -1) * 2, torch.randn(8, 16))
        run = dump.run_dir()
    finally:
        dump.reset()
    folders = sorted(f for f in os.listdir(run) if f.startswith("lower_"))
    assert len(folders) == 1, os.listdir(run)
    return os.path.join(run, folders[0])


def test_debug_dump_writes_one_file_per_pass(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))  # a real compile, not a cache hit
    folder = _dump_of_one_compile(tmp_path, monkeypatch)
    files = os.listdir(folder)
    assert set(PASS_FILES) <= set(files), files

    def read(name: str) -> str:
        with open(os.path.join(folder, name)) as f:
            return f.read()

    assert "softmax" in read("aten_graph.py")
    assert "= sum over" in read("lower_to_loop_ir.txt")
    assert read("schedule.txt").startswith("kernel0: outer [8] inner [16]")
    assert 'extern "C" void kernel0' in read("codegen_cpp.cpp")
    assert read("codegen_wrapper.py").startswith("def call(args):")


def test_debug_dump_of_a_cached_graph_has_its_ir_and_code(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))
    _dump_of_one_compile(tmp_path / "first", monkeypatch)
    folder = _dump_of_one_compile(tmp_path / "second", monkeypatch)  # loaded from the disk cache
    with open(os.path.join(folder, "timings.txt")) as f:
        assert "disk cache" in f.read()
    assert {"lower_to_loop_ir.txt", "schedule.txt", "codegen_cpp.cpp", "codegen_wrapper.py"} <= set(os.listdir(folder))


def test_no_dump_without_kiln_debug(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(config, "debug", False)
    monkeypatch.setattr(config, "debug_dir", str(tmp_path))
    compile_fn(lambda x: x.cos() + 3, torch.randn(5, 7))
    assert os.listdir(tmp_path) == []
