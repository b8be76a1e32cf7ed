"""The build and the on-disk cache: keys, errors, and a second process loading without compiling."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kiln import config
from kiln.runtime import build, cache

pytestmark = pytest.mark.cpp

SOURCE = 'extern "C" long kiln_test_add(long a, long b) { return a + b; }\n'


def test_key_depends_on_source_and_flags() -> None:
    k = cache.cache_key(SOURCE, build.DEFAULT_FLAGS, build.COMPILER)
    assert k == cache.cache_key(SOURCE, build.DEFAULT_FLAGS, build.COMPILER)
    assert k != cache.cache_key(SOURCE + "\n", build.DEFAULT_FLAGS, build.COMPILER)
    assert k != cache.cache_key(SOURCE, ("-O1", "-shared", "-fPIC"), build.COMPILER)


def test_load_builds_once_then_hits(tmp_path) -> None:
    flags = ("-O1", "-shared", "-fPIC")
    with config.patch(cache_dir=str(tmp_path)):
        assert not build.is_cached(SOURCE, flags)
        lib = build.load(SOURCE, flags)
        assert lib.kiln_test_add(2, 3) == 5
        assert build.is_cached(SOURCE, flags)
        assert build.load(SOURCE, flags) is lib
        files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
        # the library and the sealed record of its size and hash; no temporary left behind
        assert sorted(f.rsplit(".", 1)[-1] for f in files) == ["so", "sum"]


def test_compiler_errors_are_reported(tmp_path) -> None:
    with config.patch(cache_dir=str(tmp_path)), pytest.raises(build.BuildError, match="error"):
        build.load("this is not C++", ("-O1", "-shared", "-fPIC"))


SCRIPT = textwrap.dedent("""
    import time, torch
    from torch.fx.experimental.proxy_tensor import make_fx
    start = time.perf_counter()
    from kiln.lower import compile_graph
    x = torch.randn(32, 16)
    gm = make_fx(lambda x: torch.softmax(x.sin() * 2, -1))(x)
    c = compile_graph(gm, [x])
    torch.testing.assert_close(c(x)[0], torch.softmax(x.sin() * 2, -1))
    print("COMPILE", sum(c.timings.values()), sorted(c.timings))
""")


def test_second_process_loads_from_disk_without_compiling(tmp_path) -> None:
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_LOGS="cache")
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "cache miss" in runs[0].stderr and "graph cache hit" in runs[1].stderr
    assert "cache_load" in runs[1].stdout and "build" not in runs[1].stdout  # no lowering, no compiler
    second = float(runs[1].stdout.split("COMPILE")[1].split()[0])
    assert second < 1.0, second  # unpickling the program and loading the .so: milliseconds when idle


def test_graph_cache_keeps_graphs_traced_under_another_default_dtype_apart(tmp_path) -> None:
    # The ATen code of `x * torch.ones(3)` is the same text under any default dtype (the factory
    # has no dtype=); a compiled graph cached under float32 must not answer a float64 trace.
    import torch

    import kiln

    def f(x):
        return x * torch.ones(3) + torch.arange(3) / 7

    x = torch.randn(3)
    with config.patch(cache_dir=str(tmp_path)):
        kiln.reset()
        assert kiln.compile(f)(x).dtype == torch.float32
        kiln.reset()
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            out = kiln.compile(f)(x)
            assert out.dtype == torch.float64
            torch.testing.assert_close(out, f(x))
        finally:
            torch.set_default_dtype(old)
            kiln.reset()


def test_key_depends_on_the_cpu_feature_flags(monkeypatch) -> None:
    # kernels build with -march=native: two CPUs of one model name with other flags must not share
    features = cache.cpu_features()
    assert "|" in features and (features.split("|")[2] or not os.path.exists("/proc/cpuinfo"))
    before = cache.cache_key(SOURCE, build.DEFAULT_FLAGS, build.COMPILER)
    monkeypatch.setattr(cache, "cpu_features", lambda: features.replace("avx", "no-avx") + " extra")
    assert cache.cache_key(SOURCE, build.DEFAULT_FLAGS, build.COMPILER) != before


def test_source_digest_reads_files_not_modules() -> None:
    import sys

    assert cache.source_digest("lower") != cache.source_digest("runtime")
    code = "import sys; from kiln.runtime import cache; cache.code_version(); print('kiln.lower' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_staging_sweeps_temporaries_that_dead_processes_left(tmp_path) -> None:
    # a native wrapper built on a daemon thread is cut off when the interpreter exits: its staging
    # folder stays; the next build in that folder removes it once it is old enough to be dead
    import time

    from kiln.runtime import store

    old_dir, old_file, fresh = tmp_path / ".tmp-olddir", tmp_path / ".tmp-oldfile", tmp_path / ".tmp-fresh"
    old_dir.mkdir()
    (old_dir / "partial.o").write_bytes(b"x")
    old_file.write_bytes(b"x")
    fresh.mkdir()
    keep = tmp_path / "abcdef.so"
    keep.write_bytes(b"x")
    past = time.time() - store.STALE_TEMP_SECONDS - 60
    for p in (old_dir, old_file, keep):
        os.utime(p, (past, past))
    with store.staging(str(tmp_path / "target.so")) as folder:
        assert os.path.isdir(folder)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".tmp-fresh", "abcdef.so"], names  # a fresh temporary may be another process's
