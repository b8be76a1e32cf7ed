"""Float arithmetic on symbolic sizes gives eager's doubles bit for bit, in one graph where torch.compile keeps one.

Eager computes `x.shape[0] / 3 * 2` as two roundings of doubles; sympy folded it into one product
with a rounded coefficient (0.666666666666667*s0), so the lowered graph's value (a returned float, a
scalar in a kernel, a size computed from it, a guard) differed in the last bit: 5 gave
3.333333333333333, eager 3.3333333333333335. Each case runs on several sizes under dynamic=True and
automatic dynamic, compared with `==` on floats and torch.equal on tensors, and its graph count is
compared with torch.compile's (eager backend) on the same calls.
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
import torch.nn.functional as F

import kiln
from torch_oracle import torch_graph_count
from kiln import config

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]
SIZES = (5, 7, 10, 11, 14, 23, 5, 31)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln.reset()
    torch._dynamo.reset()
    yield
    kiln.reset()
    torch._dynamo.reset()


# -- the programs: values of float size arithmetic, returned, as tensor scalars and as sizes -------

def third_twice(x):
    return x * (x.shape[0] / 3 * 2), x.shape[0] / 3 * 2


def third_plus_a_tenth(x):
    return x * (x.shape[0] / 3 + 0.1), x.shape[0] / 3 + 0.1, 0.1 - x.shape[0] / 7


def chain_of_ops(x):
    n = x.shape[0]
    return x * ((n / 10 - 0.3) * 3), (n / 10 - 0.3) * 3 / 7 + n * 0.1, (n * 1.1 + 2) / (n - 1.5)


def ratio_of_sizes(x, y):
    return x * (x.shape[0] / y.shape[0]), x.shape[0] / y.shape[0], y.shape[0] / x.shape[0] * 10


def roots(x):
    d = x.shape[0]
    return x * math.sqrt(d), math.sqrt(d), d ** 0.5, x / math.sqrt(d / 3), 1 / math.sqrt(d)


def float_of_a_size(x):
    return x * (float(x.shape[0]) / 3), float(x.shape[0]) * 0.1, float(x.shape[0] * 2)


def sizes_from_floats(x):
    n = x.shape[0]
    a = math.floor(n / 3 * 2.5)
    b = math.ceil(n / 7 * 3)
    c = int(n / 3 * 3)
    return x[:a] * 2, torch.zeros(b), x.new_ones(c) * n / 7, a, b, c


def tensor_of_a_float_size(x):
    # (not through a reduction: a sum's order may differ from ATen's in the last bit)
    return (torch.full((3,), x.shape[0] / 3 * 2, dtype=torch.float64), x[0] * (x.shape[0] / 7),
            torch.arange(x.shape[0], dtype=torch.float64) * (x.shape[0] / 3))


def attention_scale(q):
    # an attention scale from a dynamic head size, as models write it (the scores' matmul and
    # softmax left out: their sums may round differently from ATen's)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return q * scale, scale, q / math.sqrt(q.shape[-1]), q * q.shape[-1] ** -0.5


def branch_on_a_float_size(x):
    if x.shape[0] / 3 > 2.5:
        return x + 1, x.shape[0] / 3
    return x - 1, x.shape[0] / 3


def branch_on_a_root(x):
    # a guard holding math.sqrt: sizes 5 and 7 take one branch, 10 and more the other
    if math.sqrt(x.shape[0]) / 3 > 1.0:
        return x * 2
    return x * (math.sqrt(x.shape[0]) / 3)


CASES = [third_twice, third_plus_a_tenth, chain_of_ops, ratio_of_sizes, roots, float_of_a_size,
         sizes_from_floats, tensor_of_a_float_size, attention_scale, branch_on_a_float_size, branch_on_a_root]


def _args(fn: Callable, n: int) -> tuple:
    g = torch.Generator().manual_seed(n)
    if fn is ratio_of_sizes:
        return torch.rand(n, dtype=torch.float64, generator=g), torch.rand(n + 4, generator=g)
    if fn is attention_scale:
        return (torch.rand(2, 3, n, dtype=torch.float64, generator=g),)
    return (torch.rand(n, dtype=torch.float64, generator=g),)


def _same(got: Any, want: Any) -> bool:
    """Bit for bit: tensors by torch.equal (dtype and shape too), numbers by type and ==."""
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    return type(got) is type(want) and got == want


def _torch_compile_graphs(fn: Callable, dynamic: bool | None) -> int:
    return torch_graph_count(fn, [_args(fn, n) for n in SIZES], dynamic)


# CI: every program under inductor with dynamic=True, each backend and automatic dynamic on the first
@pytest.mark.ci_slice({"fn": CASES[0], "backend": "inductor", "dynamic": True})
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_float_size_arithmetic_has_eagers_bits(fn: Callable, backend: str, dynamic: bool | None) -> None:
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for n in SIZES:
        args = _args(fn, n)
        got, want = compiled(*args), fn(*args)
        assert _same(got, want), (n, got, want)
    assert kiln.stats()["compiles"] == _torch_compile_graphs(fn, dynamic)


def every_kind(x):
    return third_twice(x) + chain_of_ops(x) + roots(x) + sizes_from_floats(x)


@pytest.mark.cpp
def test_on_the_native_wrapper() -> None:
    """The compiled C++ wrapper (a plan cannot hold float arithmetic and hands the graph to it)."""
    fn = every_kind
    with config.patch(cpu_wrapper="native"):
        compiled = kiln.compile(fn, dynamic=True)
        for n in SIZES[:4]:
            args = _args(fn, n)
            assert _same(compiled(*args), fn(*args)), n
    assert kiln.stats()["compiles"] == 1


@pytest.mark.triton
@pytest.mark.parametrize("fn", [third_twice, chain_of_ops, roots], ids=lambda f: f.__name__)
def test_in_triton_kernels(fn: Callable) -> None:
    with config.patch(cpu_backend="triton"):
        compiled = kiln.compile(fn, dynamic=True)
        for n in SIZES[:3]:
            args = _args(fn, n)
            assert _same(compiled(*args), fn(*args)), n


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_gradients_scaled_by_float_sizes(backend: str) -> None:
    """The backward multiplies by the same rounded values as eager's autograd does."""
    def fn(x):
        n = x.shape[0]
        return (x * (n / 3 * 2) + x / math.sqrt(n) * ((n / 10 - 0.3) * 3)).sum()

    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in SIZES[:5]:
        x = torch.rand(n, dtype=torch.float64, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        compiled(x).backward()
        fn(x2).backward()
        assert torch.equal(x.grad, x2.grad), n
    assert kiln.stats()["compiles"] == 1


# -- interpolate by scale factors on dynamic sizes ----------------------------------------------

_INTERPOLATIONS = {
    "bilinear_recomputed": lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
    "nearest_by_a_fraction": lambda x: F.interpolate(x, scale_factor=(1.5, 0.7), mode="nearest"),
    "bicubic_by_a_third": lambda x: F.interpolate(x, scale_factor=1 / 3 * 2, mode="bicubic", align_corners=False),
    "linear_computed": lambda x: F.interpolate(x.flatten(2), scale_factor=2.3, mode="linear",
                                               recompute_scale_factor=True) * (x.shape[-1] / 3),
}


# CI: every interpolation under inductor, each backend on linear_computed; the rest `-m slow`
@pytest.mark.ci_slice({"name": "linear_computed", "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(_INTERPOLATIONS))
def test_interpolate_by_scale_factors(name: str, backend: str) -> None:
    """Output sizes exactly; values within rounding (the decompositions of upsampling compute in
    another order than ATen's kernels, at static sizes too)."""
    fn = _INTERPOLATIONS[name]
    sizes = [(10, 12), (11, 14), (20, 9), (13, 7)]
    compiled = kiln.compile(fn, backend=backend)
    for h, w in sizes:
        x = torch.rand(1, 2, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(h))
        got, want = compiled(x), fn(x)
        assert got.shape == want.shape, (h, w)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    calls = [(torch.rand(1, 2, h, w, dtype=torch.float64),) for h, w in sizes]
    # at most torch.compile's: Kiln's int() of a float size is one truncation with no guard on its sign,
    # so a third of the size compiles once where torch.compile's trace compiles twice
    assert kiln.stats()["compiles"] <= torch_graph_count(fn, calls)


# -- a float argument's arithmetic, and the float of a size across a graph break ---------------

def float_argument(x, f):
    return x * ((f + 1e20) - 1e20), (f * 3 + 0.1) / 7, x * (f / 3 * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float_arguments_arithmetic_is_not_reassociated(backend: str) -> None:
    """(f + 1e20) - 1e20 is 0.0 for a small f in eager; sympy made it f."""
    compiled = kiln.compile(float_argument, backend=backend)
    x = torch.ones(3, dtype=torch.float64)
    for f in (0.5, 0.3, 0.7, 1.1, 2.9):
        got, want = compiled(x, f), float_argument(x, f)
        assert _same(got, want), f
    assert kiln.stats()["compiles"] == 2  # the first value, then the symbolic one (as torch.compile)


def across_a_break(x):
    third = x.shape[0] / 3
    print("", end="")  # a graph break: `third` crosses it as a Python float
    return x * (third * 2), third * 2 + 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float_size_across_a_graph_break(backend: str) -> None:
    compiled = kiln.compile(across_a_break, backend=backend, dynamic=True)
    for n in SIZES:
        x = torch.rand(n, dtype=torch.float64)
        assert _same(compiled(x), across_a_break(x)), n


# -- a second process reads the graphs back from the disk cache -----------------------------------

_CACHED = """
import math, torch, kiln
import torch.nn.functional as F
def f(x):
    n = x.shape[0]
    if math.sqrt(n) > 3.0:  # a guard holding math.sqrt, read back from the disk
        n = n + 1
    return (x * (n / 3 * 2), n / 3 * 2, x[:math.floor(n / 3 * 2.5)] * math.sqrt(n), (n / 10 - 0.3) * 3,
            n / 3 > 2.5)
compiled = kiln.compile(f, dynamic=True, fullgraph=True)
for n in (5, 7, 10, 14, 23):
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
    script = tmp_path / "float_sizes.py"  # a file: its frames are compiled and stored
    script.write_text(_CACHED)
    outputs = []
    for _ in range(2):  # the second process reads the first one's frame and graphs back
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
        outputs.append(done.stdout.split())
    # two graphs (the two sides of the guard on math.sqrt), both read back by the second process
    assert outputs[0][1] == "2" and outputs[1][1] == "0" and int(outputs[1][2]) >= 1, outputs


def torchs_float_functions(x):
    n = x.shape[0]
    return x * (n / 3), x / math.sqrt(n), x[: math.floor(n / 3 * 2.5)] + 1, x * float(n) ** 0.5


@pytest.mark.cpp
def test_the_real_dynamos_float_functions_through_kilns_lowering() -> None:
    """torch.compile's own sympy functions (IntTrueDiv, ToFloat, FloatPow, OpaqueUnaryFn_sqrt,
    FloorToInt) in the sizes and scalars of the graphs it hands to kiln.inductor_backend are taken as
    Kiln's own (the ATen re-tracer could not express IntTrueDiv: the backend failed)."""
    compiled = torch.compile(torchs_float_functions, backend=kiln.inductor_backend, dynamic=True)
    for n in SIZES[:4]:
        x = torch.rand(n, dtype=torch.float64)
        assert _same(compiled(x), torchs_float_functions(x)), n
