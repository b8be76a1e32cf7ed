"""round() and math.log2 of symbolic sizes stay symbolic, with eager's values, in one graph where torch.compile keeps one.

`round(x.shape[0] / 4)` and `int(math.log2(x.shape[0]))` fixed the size to its value: each new size
compiled a new graph (torch.compile keeps RoundToInt and OpaqueUnaryFn_log2 symbolic). Now round()
of a float is RoundHalfEven (Python's ties-to-even, C's nearbyint, Triton's nearbyint) and math.log2 is
FloatLog2 (C's log2, which Python calls), each printed for the guards, the Python and C++ wrappers
and the kernels. `round(f, n)` has no exact C form and stays a guard on the value. Each case runs on
several sizes (ties of round among them) and is compared bit for bit with eager and, for its graph
count, with torch.compile (eager backend) on the same calls.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any, Callable, Iterator

import pytest
import torch
import torch._dynamo

import kiln
from torch_oracle import torch_graph_count
from kiln import config

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]
# 6 -> 1.5, 10 -> 2.5, 14 -> 3.5: round's ties; 16 and 32: exact powers of two for log2
SIZES = (5, 6, 10, 14, 16, 23, 32, 7)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


def rounded_quarter(x):
    n = x.shape[0]
    r = round(n / 4)
    return x * r, r, x[:r] + 1, round(n / 3 * 2), round(n * 0.5), torch.zeros(round(n / 2.5))


def depth_of_a_pyramid(x):
    n = x.shape[0]
    levels = int(math.log2(n))
    return x * levels, levels, x[:levels] * 2, 2 ** levels, math.floor(math.log2(n)), math.ceil(math.log2(n))


def log2_as_a_float(x):
    n = x.shape[0]
    return x * math.log2(n), math.log2(n), x / math.log2(n * 3), math.log2(float(n)) / 3


def branch_on_a_rounded_size(x):
    if round(x.shape[0] / 4) > 2:  # a guard holding round(): sizes 5..10 one side, 14.. the other
        return x + 1
    return x - math.log2(x.shape[0])


CASES = [rounded_quarter, depth_of_a_pyramid, log2_as_a_float, branch_on_a_rounded_size]


def _x(n: int) -> torch.Tensor:
    return torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))


def _same(got: Any, want: Any) -> bool:
    """Bit for bit: tensors by torch.equal (dtype and shape too), numbers by type and ==."""
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    return type(got) is type(want) and got == want


def _torch_compile_graphs(fn: Callable, dynamic: bool | None, sizes: tuple[int, ...] = SIZES) -> int:
    return torch_graph_count(fn, [(_x(n),) for n in sizes], dynamic)


# CI: every program under inductor with dynamic=True, each backend and automatic dynamic on the first
@pytest.mark.ci_slice({"fn": CASES[0], "backend": "inductor", "dynamic": True})
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_round_and_log2_of_sizes_have_eagers_values_in_torchs_graphs(fn: Callable, backend: str,
                                                                    dynamic: bool | None) -> None:
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for n in SIZES:
        got, want = compiled(_x(n)), fn(_x(n))
        assert _same(got, want), (n, got, want)
    assert kiln.stats()["compiles"] == _torch_compile_graphs(fn, dynamic)


def round_to_decimals(x):
    return x * round(x.shape[0] / 3, 2), round(x.shape[0] / 7, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_to_decimals_is_a_guard_on_the_value(backend: str) -> None:
    """round(f, n) rounds f's exact decimal expansion: no C form computes it bit for bit, so the
    value is specialized (one graph per size, values still eager's)."""
    compiled = kiln.compile(round_to_decimals, backend=backend, dynamic=True)
    for n in SIZES[:4]:
        assert _same(compiled(_x(n)), round_to_decimals(_x(n))), n
    assert kiln.stats()["compiles"] == 4


def every_kind(x):
    return rounded_quarter(x) + depth_of_a_pyramid(x) + log2_as_a_float(x)


@pytest.mark.cpp
def test_on_the_native_wrapper() -> None:
    """The compiled C++ wrapper computes round and log2 with std::nearbyint and std::log2."""
    with config.patch(cpu_wrapper="native"):
        compiled = kiln.compile(every_kind, dynamic=True)
        for n in SIZES:
            assert _same(compiled(_x(n)), every_kind(_x(n))), n
    assert kiln.stats()["compiles"] == _torch_compile_graphs(every_kind, True)  # 2: x[:r] at r == 1 is its own


@pytest.mark.triton
@pytest.mark.parametrize("fn", [rounded_quarter, depth_of_a_pyramid, log2_as_a_float], ids=lambda f: f.__name__)
def test_in_triton_kernels(fn: Callable) -> None:
    with config.patch(cpu_backend="triton"):
        compiled = kiln.compile(fn, dynamic=True)
        for n in SIZES[:4]:
            assert _same(compiled(_x(n)), fn(_x(n))), n


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_gradients_scaled_by_round_and_log2(backend: str) -> None:
    def fn(x):
        n = x.shape[0]
        return (x * round(n / 4) + x / math.log2(n)).sum()

    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in SIZES[:5]:
        x = torch.rand(n, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        compiled(x).backward()
        fn(x2).backward()
        assert torch.equal(x.grad, x2.grad), n
    assert kiln.stats()["compiles"] == 1


_CACHED = """
import math, torch, kiln
def f(x):
    n = x.shape[0]
    if round(n / 4) > 2 and math.log2(n) < 4.5:  # guards holding round() and math.log2, read back from the disk
        n = n + 1
    return x * round(n / 4), x[:int(math.log2(n))] * 2, math.log2(n)
compiled = kiln.compile(f, dynamic=True, fullgraph=True)
for n in (5, 6, 10, 14, 23, 32):
    x = torch.rand(n, dtype=torch.float64)
    got, want = compiled(x), f(x)
    for g, w in zip(got, want):
        same = torch.equal(g, w) if isinstance(w, torch.Tensor) else (type(g) is type(w) and g == w)
        assert same, (n, g, w)
print("ok", kiln.stats()["compiles"], kiln.stats()["disk_hits"])
"""


@pytest.mark.cpp
def test_from_the_disk_cache_in_a_second_process(tmp_path) -> None:
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.getcwd()}
    script = tmp_path / "round_log2_sizes.py"  # a file: its frames are compiled and stored
    script.write_text(_CACHED)
    outputs = []
    for _ in range(2):  # the second process reads the first one's frame and graphs back
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
        outputs.append(done.stdout.split())
    # three graphs (round <= 2; round > 2 below log2 4.5; above it), all read back by the second process
    assert outputs[0][1] == "3" and outputs[1][1] == "0" and outputs[1][2] == "3", outputs


def torchs_round_and_log2(x):
    n = x.shape[0]
    # (math.floor: torch's int() of a float is TruncToInt, which Kiln does not take yet)
    return x * round(n / 4), x[: math.floor(math.log2(n))] + 1, x * math.log2(n)


@pytest.mark.cpp
def test_the_real_dynamos_round_and_log2_through_kilns_lowering() -> None:
    """torch.compile's RoundToInt and OpaqueUnaryFn_log2 in the graphs it hands to
    kiln.inductor_backend are taken as Kiln's own."""
    compiled = torch.compile(torchs_round_and_log2, backend=kiln.inductor_backend, dynamic=True)
    for n in SIZES[:4]:
        assert _same(compiled(_x(n)), torchs_round_and_log2(_x(n))), n


def test_printed_for_every_target_and_bounded() -> None:
    import sympy

    from kiln.symbolic.expr import bounds
    from kiln.symbolic.floats import FloatLog2, FloatTrueDiv, RoundHalfEven, is_float_valued
    from kiln.symbolic.render import render_c, render_python, render_triton

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    r, lg = RoundHalfEven(FloatTrueDiv(s0, 4)), FloatLog2(s0)
    assert render_python(r) == "round(s0 / 4)" and render_python(lg) == "math.log2(s0)"
    assert render_c(r) == "static_cast<int64_t>(std::nearbyint((static_cast<double>(s0) / 4.0)))"
    assert render_c(lg) == "std::log2(static_cast<double>(s0))"
    assert "libdevice.nearbyint(" in render_triton(r) and "libdevice.log2(" in render_triton(lg)
    assert [RoundHalfEven(FloatTrueDiv(n, 4)) for n in (2, 6, 10, 14)] == [0, 2, 2, 4]  # ties to even
    assert r.is_integer and not is_float_valued(r) and is_float_valued(lg)
    assert not is_float_valued(2 ** sympy.floor(lg))  # an int to an int power: an int
    assert bounds(r, lambda s: (2, 10), {}) == (0, 2) and bounds(lg, lambda s: (2, 8), {}) == (1.0, 3.0)
