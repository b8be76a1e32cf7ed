"""Kernels run on torch.get_num_threads() threads, and adapt to the machine's load only when asked.

The runtime hands each kernel library torch's thread count (`kiln_set_num_threads`, codegen/cpp.py's
prelude) when it binds a wrapper and again in the first call after torch.set_num_threads changed it.
The team a parallel loop really gets is observed with a probe compiled into the same translation
unit as real generated kernels, under the exact `num_threads(...)` clause the codegen wrote.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess
import sys
import time
from typing import Iterator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import config
from kiln.lower import CompiledGraph, compile_graph
from kiln.lower.codegen.cpp_kernel import ADAPTIVE_THREADS_MAX
from kiln.runtime import build, kernel_wrapper

pytestmark = pytest.mark.cpp


def _fn(x: torch.Tensor) -> torch.Tensor:
    return x.exp() + 1


def _compile(fn, *args: torch.Tensor) -> CompiledGraph:
    return compile_graph(make_fx(fn)(*args), list(args))


@pytest.fixture
def torch_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _reported(graph: CompiledGraph) -> int:
    query = graph._lib.kiln_get_num_threads
    query.restype = ctypes.c_int
    return query()


def _team_probe(clause: str) -> str:
    """A function that runs one parallel region under `clause` and returns its team's size."""
    return ('extern "C" int kiln_test_team() {\n  int team = 0;\n'
            f"#pragma omp parallel {clause}\n"
            "  { if (omp_get_thread_num() == 0) team = omp_get_num_threads(); }\n  return team;\n}\n")


def _clauses(cpp_source: str) -> set[str]:
    return set(re.findall(r"#pragma omp parallel.*?(num_threads\(\w+\(\)\))", cpp_source))


def _probe_library(graph: CompiledGraph, clause: str) -> ctypes.CDLL:
    """The graph's own translation unit plus a team probe under `clause`, bound as the runtime binds."""
    lib = build.load(graph.cpp_source + _team_probe(clause))
    lib.kiln_test_team.restype = ctypes.c_int
    return lib


@pytest.mark.skipif(os.cpu_count() == 1, reason="needs two CPUs for a team of two")
def test_kernels_follow_torch_set_num_threads(torch_threads) -> None:
    x = torch.randn(256, 1024)  # large enough that the kernel's loop is parallel
    torch.set_num_threads(2)
    graph = _compile(_fn, x)
    assert _clauses(graph.cpp_source) == {"num_threads(kiln_threads())"}
    assert _reported(graph) == 2
    torch.set_num_threads(1)
    assert _reported(graph) == 2  # the library learns the new count at the next call ...
    torch.testing.assert_close(graph(x)[0], _fn(x))
    assert _reported(graph) == 1  # ... not 100 ms later, and not from OpenMP's own setting
    torch.set_num_threads(2)
    torch.testing.assert_close(graph(x)[0], _fn(x))
    assert _reported(graph) == 2


@pytest.mark.skipif(os.cpu_count() == 1, reason="needs two CPUs for a team of two")
def test_the_generated_clause_gives_a_team_of_torch_threads(torch_threads) -> None:
    x = torch.randn(256, 1024)
    graph = _compile(_fn, x)
    (clause,) = _clauses(graph.cpp_source)
    lib = _probe_library(graph, clause)
    for n in (1, 2, 1):
        torch.set_num_threads(n)
        env: dict = {}
        kernel_wrapper.bind_threads(env, lib)
        assert lib.kiln_test_team() == n
        assert env["_threads_applied"][0] == n


def test_a_wrapper_without_the_thread_check_is_not_written(torch_threads) -> None:
    x = torch.randn(64)
    graph = _compile(_fn, x)
    first = graph.wrapper_source.split("def call(", 1)[1].splitlines()[1].strip()
    assert first == "if _torch_threads() != _threads_applied[0]: _follow_threads()"
    views_only = _compile(lambda x: x.t(), torch.randn(3, 4))  # no kernels: nothing to hand threads to
    assert views_only.kernel_count == 0 and "_torch_threads" not in views_only.wrapper_source


def test_a_wrapper_rebuilt_from_its_recipe_follows_threads(torch_threads, tmp_path) -> None:
    x = torch.randn(256, 1024)
    with config.patch(cache_dir=str(tmp_path)):
        torch.set_num_threads(2)
        graph = _compile(_fn, x)
        recipe = graph.artifact_recipe()
        assert recipe is not None
        if recipe.kind == "tiered":  # a one-kernel graph on its plan: the Python wrapper's recipe is inside
            recipe = recipe.fields["python"]
        rebuilt = kernel_wrapper.load_wrapper(recipe.fields["wrapper"])
        torch.set_num_threads(1)
        torch.testing.assert_close(rebuilt(x)[0], _fn(x))
        assert _reported(graph) == 1  # the same library: the rebuilt wrapper handed it the count


def _config_in_a_fresh_interpreter(env: dict[str, str]) -> str:
    """kiln.config.adaptive_threads as a new process with `env` sees it (config.py alone, no torch)."""
    path = importlib.util.find_spec("kiln.config").origin
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('c', {path!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.adaptive_threads)")
    clean = {k: v for k, v in os.environ.items() if k != "KILN_ADAPTIVE_THREADS"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_adaptive_threads_is_off_unless_asked() -> None:
    assert _config_in_a_fresh_interpreter({}) == "False"
    assert _config_in_a_fresh_interpreter({"KILN_ADAPTIVE_THREADS": "0"}) == "False"
    assert _config_in_a_fresh_interpreter({"KILN_ADAPTIVE_THREADS": "1"}) == "True"


def _runnable() -> int:
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Every CPU kept busy by other processes (spinning shells), as the adaptive check sees it."""
    cpus = os.cpu_count() or 1
    if cpus > 16:
        pytest.skip("too many CPUs to keep busy for a test")
    spinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(cpus + 3)]
    try:
        deadline = time.monotonic() + 3
        while _runnable() - 2 < cpus and time.monotonic() < deadline:
            time.sleep(0.02)
        if _runnable() - 2 < cpus:
            pytest.skip("could not make the machine look busy")
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="the adaptive check reads /proc/loadavg")
@pytest.mark.skipif(os.cpu_count() == 1, reason="needs two CPUs for a team of two")
def test_busy_machine_changes_threads_only_when_adaptive(torch_threads, busy_machine) -> None:
    x = torch.randn(256, 1024)
    torch.set_num_threads(2)
    small = _compile(_fn, x)
    (clause,) = _clauses(small.cpp_source)
    lib = _probe_library(small, clause)
    for adaptive, expected in ((False, 2), (True, 1), (False, 2)):
        with config.patch(adaptive_threads=adaptive):
            kernel_wrapper.bind_threads({}, lib)  # what a compile does: reads the setting again
            assert lib.kiln_test_team() == expected, adaptive
            graph = _compile(_fn, x)  # shares its library with `small`: the same source
            torch.testing.assert_close(graph(x)[0], _fn(x))
            assert _reported(graph) == expected


def test_loops_of_4m_elements_never_adapt() -> None:
    x = torch.randn(ADAPTIVE_THREADS_MAX)
    graph = _compile(_fn, x)
    assert _clauses(graph.cpp_source) == {"num_threads(kiln_all_threads())"}
    torch.testing.assert_close(graph(x)[0], _fn(x))


def test_results_equal_eager_at_each_thread_count(torch_threads) -> None:
    def f(x, w):
        return torch.softmax(x @ w, -1).sum(0) + x.relu().mean()

    x, w = torch.randn(512, 128), torch.randn(128, 256)
    compiled = kiln.compile(f)
    for n in (1, 2, 1):
        torch.set_num_threads(n)
        torch.testing.assert_close(compiled(x, w), f(x, w), atol=1e-5, rtol=1e-5)


# One thread enters no OpenMP region (codegen/cpp_loops.serial_at_one_thread): libgomp pays a futex
# syscall to leave even a team of one. A probe kernel records omp_get_level() (1 inside any region,
# a team of one included) from inside its loops, in each of the region shapes the codegen writes.
_LEVEL_BODY = [
    "#pragma omp parallel for if((n) * (2) >= 64)",  # a row kernel's outer loop, a size test in parens
    "for (int64_t x0 = 0; x0 < n; x0++) {",
    "level[x0] = omp_get_level();",
    "}",
    "int64_t total = 0;",
    "#pragma omp parallel for simd reduction(+:total) if(n >= 64)",  # an inner-only reduction
    "for (int64_t y0 = 0; y0 < n; y0++) {",
    "total += y0;",
    "}",
    "out[0] = total;",
    "#pragma omp parallel if(n >= 64)",  # a tiled kernel: a region, then its shared loop
    "{",
    "#pragma omp for",
    "for (int64_t x1 = 0; x1 < n; x1++) {",
    "level[n + x1] = omp_get_level() + 10 * omp_get_thread_num();",
    "}",
    "}",
]


def _level_probe() -> ctypes.CDLL:
    from kiln.lower.codegen.cpp import prelude
    from kiln.lower.codegen.cpp_loops import serial_at_one_thread

    body = serial_at_one_thread([line + " num_threads(kiln_threads())" if line.startswith("#pragma omp parallel")
                                 else line for line in _LEVEL_BODY])
    source = prelude("") + ('extern "C" void kiln_test_levels(int64_t n, int64_t* level, int64_t* out) {\n'
                          + "\n".join(body) + "\n}\n")
    lib = build.load(source)
    lib.kiln_test_levels.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _levels(lib: ctypes.CDLL, n: int) -> tuple[set[int], int]:
    level = torch.full((2 * n,), -1, dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    lib.kiln_test_levels(n, level.data_ptr(), out.data_ptr())
    return set(level.tolist()), int(out)


def test_one_thread_runs_every_region_shape_outside_openmp(torch_threads) -> None:
    lib = _level_probe()
    env: dict = {}
    for n in (16, 4096):  # below and above the regions' size tests
        torch.set_num_threads(1)
        kernel_wrapper.bind_threads(env, lib)
        assert _levels(lib, n) == ({0}, n * (n - 1) // 2)  # no region entered, not even a team of one
    if (os.cpu_count() or 1) > 1:
        torch.set_num_threads(2)  # followed at the next bind: the regions open again, with two threads
        kernel_wrapper.bind_threads(env, lib)
        levels, total = _levels(lib, 4096)
        assert levels == {1, 11} and total == 4096 * 4095 // 2
        assert _levels(lib, 16) == ({0}, 16 * 15 // 2)  # too small to share out: no region either


def test_every_generated_region_has_a_one_thread_branch() -> None:
    def kernels(x: torch.Tensor, w: torch.Tensor, i: torch.Tensor) -> tuple:
        return (x.exp() + 1, torch.softmax(x, -1), x.sum(0), torch.softmax(x, 0), x.cumsum(1),
                torch.zeros(64, 8).index_add(0, i, w))

    torch.manual_seed(0)
    x, w, i = torch.randn(256, 1024), torch.randn(4096, 8), torch.randint(0, 64, (4096,))
    graph = _compile(kernels, x, w, i)
    lines = [line.strip() for line in graph.cpp_source.splitlines()]
    regions = [k for k, line in enumerate(lines) if line.startswith("#pragma omp parallel")]
    assert len(regions) >= 5
    for k in regions:
        assert re.match(r"if \(.*(kiln_threads\(\)|kiln_all_threads\(\)|kiln_nt) > 1", lines[k - 1]), lines[k - 1]
    for got, want in zip(graph(x, w, i), kernels(x, w, i)):
        # the column sum (256 terms) and index_add (about 64 per row) add in another order than eager's
        # vector code: their rounding differs by ~sqrt(n) * eps * |terms|, above assert_close's 1e-5
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("threads", [(1, 2, 1), (2, 1, 2)])
def test_dynamic_sizes_follow_threads_changed_between_calls(torch_threads, threads) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) * x.sum(0) + x.cumsum(1)

    compiled = kiln.compile(f, dynamic=True)
    for n in threads:
        torch.set_num_threads(n)
        for rows in (4, 300):  # one kernel call below the parallel size, one above
            x = torch.randn(rows, 256)
            torch.testing.assert_close(compiled(x), f(x), atol=1e-5, rtol=1e-5)


# A reduction over the whole of a tensor of several dims (no outer loop) is one `parallel for simd
# collapse(n)`; its one-thread copy ran it as `omp simd collapse(n)`, which GCC does not vectorize
# (relu(x).abs().max() over 256x512 at one thread: 0.8 ms, eager 0.07 ms). The serial copy puts the
# simd on the innermost loop instead (cpp_loops._simd_innermost).
def _whole_reductions(x: torch.Tensor, y: torch.Tensor) -> tuple:
    return (torch.relu(x).abs().max(), x.amin(), (x > 0.5).any(), (x > -9).all(), y.max(), y.abs().amax())


@pytest.mark.parametrize("nan", [False, True])
def test_whole_tensor_reductions_at_one_thread_put_simd_on_the_innermost_loop(torch_threads, nan: bool) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(256, 512), torch.randn(8, 16, 64)
    if nan:
        x[17, 300] = float("nan")
        y[3, 5, 7] = float("nan")
    graph = _compile(_whole_reductions, x, y)
    lines = [line.strip() for line in graph.cpp_source.splitlines()]
    assert any(line.startswith("#pragma omp parallel for simd collapse(") for line in lines)
    serial = [k for k, line in enumerate(lines) if line.startswith("#pragma omp simd")]
    assert serial
    for k in serial:
        assert "collapse(" not in lines[k], lines[k]
    # every whole reduction's serial loop nest: the outer loops bare, the simd pragma on the last one
    nests = [k for k, line in enumerate(lines) if line.startswith("} else {") and lines[k + 1].startswith("for (")]
    assert nests
    for k in nests:
        assert lines[k + 2].startswith(("for (", "#pragma omp simd")), lines[k:k + 4]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for got, want in zip(graph(x, y), _whole_reductions(x, y)):
            torch.testing.assert_close(got, want, equal_nan=True)


def test_serial_copy_moves_a_collapsed_simd_to_the_innermost_loop() -> None:
    from kiln.lower.codegen.cpp_loops import serial_at_one_thread

    body = ["float acc = 0;",
            "#pragma omp parallel for simd collapse(3) reduction(max:acc) num_threads(kiln_threads())",
            "for (int64_t y0 = 0; y0 < 4; y0++) {", "for (int64_t y1 = 0; y1 < 8; y1++) {",
            "for (int64_t y2 = 0; y2 < 16; y2++) {", "acc = a[y2] > acc ? a[y2] : acc;", "}", "}", "}"]
    out = serial_at_one_thread(body)
    serial = out[out.index("} else {") + 1:]
    assert serial[:4] == ["for (int64_t y0 = 0; y0 < 4; y0++) {", "for (int64_t y1 = 0; y1 < 8; y1++) {",
                          "#pragma omp simd reduction(max:acc)", "for (int64_t y2 = 0; y2 < 16; y2++) {"]
    assert out[out.index("} else {") - 8] == body[1]  # the parallel branch keeps its collapse
