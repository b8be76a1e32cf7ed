"""The native wrapper (kiln.lower.codegen.native_wrapper + kiln.runtime.native) against the Python
wrapper: the same outputs on graphs of each kind, eager's exceptions from a kernel's failed check,
the whole of mode="reduce-overhead" training on CPU, a second process that loads the built wrapper
from the cache without compiling, and a tampered library refused."""
from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.lower import compile_graph
from kiln.lower.codegen import native_wrapper
from kiln.runtime import build, native
from tests.lower.conftest import aten_graph
from tests.reliability.cache_harness import seed as seed_cache


@pytest.fixture(autouse=True)
def _compiled_native_wrappers(monkeypatch: pytest.MonkeyPatch) -> Any:
    """These tests are about each graph's own compiled C++ wrapper; plans (config.native_plan) have
    theirs in tests/runtime/test_native_plan.py. Subprocesses get the setting through the environment."""
    monkeypatch.setenv("KILN_NATIVE_PLAN", "0")
    with config.patch(native_plan=False):
        yield

pytestmark = pytest.mark.cpp


def is_native(fn: Any) -> bool:
    return isinstance(fn, functools.partial) and fn.func is native.boundary().call


def both(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> tuple[Any, Any]:
    gm, examples = aten_graph(fn, *args, dynamic=dynamic)
    with config.patch(cpu_wrapper="python"):
        python = compile_graph(gm, examples)
    with config.patch(cpu_wrapper="native"):
        made = compile_graph(gm, examples)
    assert not is_native(python.fn)
    assert is_native(made.fn), "the graph fell back to the Python wrapper"
    return python, made


def same(a: Any, b: Any) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
        else:
            assert x == y


def _pointwise(x, y):
    return torch.sigmoid(x) * y + 1, (x - y).abs()


def _reduction(x):
    return x.sum(1), x.amax(0), torch.softmax(x, -1)


def _mm_epilogue(x, w, b):
    return (torch.relu(torch.addmm(b, x, w)) * 2,)


def _bmm_transposed(a, b):
    return (torch.bmm(a, b.transpose(1, 2)).tanh(),)


def _matmul_chain(x, w, b):
    h = torch.addmm(b, x, w).relu()  # each matmul writes into a buffer a dead one hands over
    h = (h @ w.t()).tanh() @ w
    return (torch.bmm(h.view(2, 4, 5), h.view(2, 5, 4)).sin(),)


def _conv(x, w, b):
    return (F.relu(F.conv2d(x, w, b, padding=1)),)


def _split_views(x):
    a, b = x.split([3, 5], dim=1)
    return a * 2, b.t(), x[:, 1:]


def _int_output(x):
    return x.cos(), x.shape[0] * 2


def _max_pool(x):
    return (F.max_pool2d(x, 2),)


CASES = {
    "pointwise": (_pointwise, lambda: (torch.randn(6, 7), torch.randn(6, 7))),
    "reduction": (_reduction, lambda: (torch.randn(9, 13),)),
    "mm_epilogue": (_mm_epilogue, lambda: (torch.randn(8, 16), torch.randn(16, 5), torch.randn(5))),
    "bmm_transposed": (_bmm_transposed, lambda: (torch.randn(2, 3, 4), torch.randn(2, 5, 4))),
    "matmul_chain": (_matmul_chain, lambda: (torch.randn(8, 16), torch.randn(16, 5), torch.randn(5))),
    "conv": (_conv, lambda: (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4))),
    "split_views": (_split_views, lambda: (torch.randn(4, 8),)),
    "max_pool": (_max_pool, lambda: (torch.randn(1, 2, 6, 6),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_matches_python(name: str) -> None:
    fn, make = CASES[name]
    args = make()
    python, made = both(fn, *args)
    same(made(*args), python(*args))
    same(made.fn.steal(list(args)), python(*args))  # the stealing entry the backward uses


def test_matmuls_write_into_planned_buffers() -> None:
    """Both wrappers call a matmul's out= overload on a buffer they allocate or reuse."""
    args = CASES["matmul_chain"][1]()
    python, made = both(_matmul_chain, *args)
    assert "extern_aten_addmm_out(" in python.wrapper_source and "out=buf" in python.wrapper_source
    assert "# reuse" in python.wrapper_source  # a dead buffer's storage taken by a matmul's result
    writer = native_wrapper.write_native(made.program, made._signatures)
    assert writer is not None
    assert "at::_ops::addmm_out::call(" in writer.source and "at::_ops::mm_out::call(" in writer.source
    assert "at::_ops::mm::call(" not in writer.source and "// reuse" in writer.source


def _random_and_scatter(x, i, v):
    noise = x + torch.rand_like(x)
    dropped = F.dropout(x, 0.5, True)  # bernoulli_ runs as an extern: its in-place header
    return noise, dropped, x.index_put((i,), v, accumulate=True), x.scatter_add(0, i, v)


def _unbacked_and_tuples(x):
    return torch.nonzero(x[0] > 0) * 2, torch.sort(x, 1)[0], torch.topk(x, 2)[1]


def _conv_backward(x, w, g):  # bool[3], SymInt[]? and a tuple of three results
    return torch.ops.aten.convolution_backward(g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                               [True, True, True])


MORE_CASES = {
    "random_and_scatter": (_random_and_scatter, lambda: (torch.randn(6), torch.tensor([1, 1, 3]), torch.ones(3))),
    "unbacked_and_tuples": (_unbacked_and_tuples, lambda: (torch.randn(4, 7),)),
    "conv_backward": (_conv_backward, lambda: (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3),
                                               torch.randn(2, 4, 8, 8))),
}


@pytest.mark.parametrize("name", sorted(MORE_CASES))
def test_native_matches_python_externs(name: str) -> None:
    fn, make = MORE_CASES[name]
    args = make()
    python, made = both(fn, *args)
    torch.manual_seed(3)  # the same draws: both take their seed from torch's generator
    expected = python(*args)
    torch.manual_seed(3)
    same(made(*args), expected)


def _batch_norm_train(x, w, b, mean, var):  # the functional op: declared in _native_batch_norm_legit's header
    out, save_mean, save_invstd, new_mean, new_var = torch.ops.aten._native_batch_norm_legit_functional(
        x, w, b, mean, var, True, 0.1, 1e-5)
    return out.relu(), save_mean, save_invstd, new_mean, new_var


def _batch_norm_backward(x, w, mean, var, g):
    _, save_mean, save_invstd = torch.ops.aten._native_batch_norm_legit(x, w, None, mean.clone(), var.clone(), True,
                                                                        0.1, 1e-5)
    return torch.ops.aten.native_batch_norm_backward(g, x, w, mean, var, save_mean, save_invstd, True, 1e-5,
                                                     [True, True, True])


def _batch_norm_no_stats(x, w, b):  # track_running_stats=False
    out, save_mean, save_invstd = torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    return out * 2, save_mean, save_invstd


def _channel_stats(c, dtype=torch.float32):
    return lambda: (torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype),
                    torch.rand(c, dtype=dtype) + 0.5)


def _bn_args(shape, dtype=torch.float32, channels_last=False):
    def make():
        x = torch.randn(shape, dtype=dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        w, b, mean, var = _channel_stats(shape[1], dtype)()
        return x, w, b, mean, var
    return make


def _bn_backward_args(shape):
    def make():
        x, w, _, mean, var = _bn_args(shape)()
        return x, w, mean, var, torch.randn(shape)
    return make


# The operator families of CNN training graphs that kept a graph on the Python wrapper (KILN_LOGS=perf_hints:
# "native wrapper not used: no C++ header for aten::_native_batch_norm_legit_functional"): each graph here
# must tier up and give the Python wrapper's outputs bit for bit.
BATCH_NORM_CASES = {
    "train_2d": (_batch_norm_train, _bn_args((4, 3, 5, 5))),
    "train_1d_nc": (_batch_norm_train, _bn_args((6, 3))),
    "train_1d_ncl": (_batch_norm_train, _bn_args((4, 3, 7))),
    "train_3d": (_batch_norm_train, _bn_args((2, 3, 2, 4, 4))),
    "train_channels_last": (_batch_norm_train, _bn_args((4, 3, 5, 5), channels_last=True)),
    "train_bfloat16": (_batch_norm_train, _bn_args((4, 3, 5, 5), dtype=torch.bfloat16)),
    "backward": (_batch_norm_backward, _bn_backward_args((4, 3, 5, 5))),
    "no_stats": (_batch_norm_no_stats, lambda: _bn_args((4, 3, 6))()[:3]),
}


# the other ranks of the same training op (one header, one wrapper path; a g++ build each): `-m slow`;
# CI keeps 4-d, channels-last, bfloat16, the backward and the no-statistics form
_BATCH_NORM_SLOW = {"train_1d_nc", "train_1d_ncl", "train_3d"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in _BATCH_NORM_SLOW else [])
                                  for name in sorted(BATCH_NORM_CASES)])
def test_batch_norm_training_graphs_are_native(name: str) -> None:
    fn, make = BATCH_NORM_CASES[name]
    args = make()
    python, made = both(fn, *args)
    same(made(*args), python(*args))
    expected = fn(*args)
    for got, want in zip(made(*args), expected):
        torch.testing.assert_close(got, want)


def test_header_of_each_operator_variant() -> None:
    """The header that declares an operator's C++ struct: its own, its out-of-place op's (an in-place
    variant), the op it was made from (a functional variant), or none (then the dispatcher)."""
    find = native_wrapper._header_declaring
    assert find("add", "add_Tensor") == "add"
    assert find("bernoulli_", "bernoulli__float") == "bernoulli"
    assert find("_native_batch_norm_legit_functional", "_native_batch_norm_legit_functional") == \
        "_native_batch_norm_legit"
    assert find("_foreach_add_", "_foreach_add__Scalar") == "_foreach_add"
    assert find("kiln_no_such_op", "kiln_no_such_op") is None


def test_float_arguments_reach_kernels_as_doubles() -> None:
    """A float argument kept symbolic (automatic dynamic after a second value: BatchNorm's
    momentum=None factor, a learning rate) is read as a double and handed to the kernels so."""
    def fn(x, s):
        return (x * s + 1.0 / s).sin(), torch.full((3,), s) * x[:3], x.clamp(max=s) * math.sqrt(s)

    results = {}
    x = torch.randn(8)
    for wrapper in ("python", "native"):
        kiln.reset()
        made: list[Any] = []
        original = native.make_native

        def spy(*a: Any, **k: Any) -> Any:
            made.append(original(*a, **k))
            return made[-1]

        native.make_native = spy  # type: ignore[assignment]
        try:
            with config.patch(cpu_wrapper=wrapper):
                compiled = kiln.compile(fn)
                results[wrapper] = [compiled(x, s) for s in (0.5, 0.25, 0.75, 3.5)]
        finally:
            native.make_native = original  # type: ignore[assignment]
            kiln.reset()
        assert len(made) == (2 if wrapper == "native" else 0)  # the constant first value, then the symbol
    for got, expected in zip(results["native"], results["python"]):
        same(got, expected)
    for s, got in zip((0.5, 0.25, 0.75, 3.5), results["native"]):
        for g, w in zip(got, fn(x, s)):
            torch.testing.assert_close(g, w)


_TEST_LIBRARY = torch.library.Library("kiln_test_native", "DEF")
_TEST_LIBRARY.define("pair(Tensor x, float k) -> (Tensor, Tensor)")
_TEST_LIBRARY.define("chunks(Tensor x, int n) -> Tensor[]")
_TEST_LIBRARY.define("checked(Tensor x) -> Tensor")


def _pair(x: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x * k, x.flip(0)


def _checked(x: torch.Tensor) -> torch.Tensor:
    if bool((x < 0).any()):
        raise ValueError("kiln_test_native.checked: a negative input")
    return x.sqrt()


_TEST_LIBRARY.impl("pair", _pair, "CompositeExplicitAutograd")
_TEST_LIBRARY.impl("chunks", lambda x, n: [c.clone() for c in x.chunk(n)], "CompositeExplicitAutograd")
_TEST_LIBRARY.impl("checked", _checked, "CompositeExplicitAutograd")


def _onednn_linear(x, w, b):
    return (torch.ops.mkldnn._linear_pointwise(x, w, b, "relu", [], "") + 1,)


def _onednn_conv(x, w, b):
    return (torch.ops.mkldnn._convolution_pointwise(x, w, b, [1, 1], [1, 1], [1, 1], 1, "none", [], "").relu(),)


def _python_ops(x):  # operators with Python kernels, called from C++ through the dispatcher
    a, b = torch.ops.kiln_test_native.pair(x, 3.0)
    first, second = torch.ops.kiln_test_native.chunks(a + b, 2)
    return first.exp(), second, torch.ops.kiln_test_native.checked(x.abs())


BOXED_CASES = {
    "onednn_linear": (_onednn_linear, lambda: (torch.randn(4, 8), torch.randn(6, 8), torch.randn(6))),
    "onednn_conv": (_onednn_conv, lambda: (torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4))),
    "python_ops": (_python_ops, lambda: (torch.randn(6, 3),)),
}


@pytest.mark.parametrize("name", sorted(BOXED_CASES))
def test_operators_outside_aten_go_through_the_dispatcher(name: str) -> None:
    fn, make = BOXED_CASES[name]
    args = make()
    python, made = both(fn, *args)
    writer = native_wrapper.write_native(made.program, made._signatures)
    assert writer is not None and ".callBoxed(stack)" in writer.source
    same(made(*args), python(*args))
    expected = fn(*args)
    for got, want in zip(made(*args), expected):
        torch.testing.assert_close(got, want)


def test_python_operator_error_reaches_the_caller() -> None:
    def f(x):
        return (torch.ops.kiln_test_native.checked(x) + 1,)

    x = torch.rand(5)
    python, made = both(f, x)
    same(made(x), python(x))
    with pytest.raises(ValueError, match="a negative input"):  # the op's own exception, as eager raises it
        made(-x)
    same(made(x + 1), python(x + 1))  # the graph still runs after the error


def test_constant_tensor() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c = graph.get_attr("c")
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (x, c)),))
    root = torch.nn.Module()
    root.c = torch.arange(4.0)
    gm = torch.fx.GraphModule(root, graph)
    example = torch.randn(4)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            node.meta["val"] = example if node.op == "placeholder" else root.c
    with config.patch(cpu_wrapper="native"):
        made = compile_graph(gm, [example])
    assert is_native(made.fn)
    torch.testing.assert_close(made(example)[0], example + root.c)


def test_kernels_follow_torch_set_num_threads() -> None:
    saved = torch.get_num_threads()
    x = torch.randn(64)
    python, made = both(lambda t: (t.exp() + 1,), x)
    query = made._lib.kiln_get_num_threads
    query.restype = ctypes.c_int
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            made(x)  # the call itself hands the new count to the kernel library
            assert query() == threads
    finally:
        torch.set_num_threads(saved)


def test_dynamic_shapes_and_int_inputs() -> None:
    python, made = both(_pointwise, torch.randn(4, 6), torch.randn(4, 6), dynamic=True)
    for rows, cols in ((4, 6), (3, 11), (1, 1)):
        args = (torch.randn(rows, cols), torch.randn(rows, cols))
        same(made(*args), python(*args))
    python, made = both(_int_output, torch.randn(5), dynamic=True)
    x = torch.randn(7)
    got = made(x)
    assert got[1] == 14 and isinstance(got[1], int)
    same(got, python(x))


def test_non_contiguous_input_is_relaid_out() -> None:
    python, made = both(_mm_epilogue, torch.randn(8, 16), torch.randn(16, 5), torch.randn(5))
    x, w, b = torch.randn(16, 8).t(), torch.randn(16, 5), torch.randn(5)
    same(made(x, w, b), python(x, w, b))
    torch.testing.assert_close(made(x, w, b)[0], _mm_epilogue(x, w, b)[0])


def test_index_out_of_range_raises_eagers_error() -> None:
    def gather_rows(table, idx):
        return (table[idx] * 2,)

    table, idx = torch.randn(5, 3), torch.tensor([0, 4, 2])
    python, made = both(gather_rows, table, idx)
    same(made(table, idx), python(table, idx))
    bad = torch.tensor([0, 7])
    with pytest.raises(IndexError) as eager:
        table[bad]
    with pytest.raises(IndexError) as got:
        made(table, bad)
    assert "7" in str(got.value) and "5" in str(got.value), (str(got.value), str(eager.value))
    with pytest.raises(IndexError):
        python(table, bad)


def test_extern_error_is_a_python_exception() -> None:
    python, made = both(_mm_epilogue, torch.randn(8, 16), torch.randn(16, 5), torch.randn(5))
    with pytest.raises(RuntimeError):
        made(torch.randn(8, 16), torch.randn(15, 5), torch.randn(5))
    with pytest.raises(ValueError):
        made(torch.randn(8, 16))  # a wrong argument count is refused, not read past


def test_reduce_overhead_training_uses_native() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, mode="reduce-overhead")
    seen: list[Any] = []
    original = native.make_native

    def spy(*a: Any, **k: Any) -> Any:
        out = original(*a, **k)
        seen.append(out)
        return out

    native.make_native = spy  # type: ignore[assignment]
    try:
        for _ in range(2):
            x = torch.randn(5, 8)
            loss = compiled(x).square().mean()
            loss.backward()
            expected = reference(x).square().mean()
            expected.backward()
            torch.testing.assert_close(loss, expected)
    finally:
        native.make_native = original  # type: ignore[assignment]
    assert len(seen) >= 2, "forward and backward should each get a native wrapper"
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


_CHILD = textwrap.dedent("""
    import json, sys, torch
    from kiln import config
    from kiln.lower import compile_graph
    from kiln.runtime import artifact, build, native
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        return (torch.relu(x @ w) + 1,)

    mode = sys.argv[1]
    torch.manual_seed(0)
    args = [torch.randn(4, 6), torch.randn(6, 3)]
    if mode == "no_build":  # everything must come from the cache
        def refuse(*a, **k):
            raise AssertionError("compiled in the second process")
        build.compile_shared = refuse
    if mode == "recipe":  # the recorded identity, checked before loading; then a build when asked
        recipe = native.NativeRecipe(*json.loads(sys.argv[2]))
        recipe = native.NativeRecipe(tuple(recipe.graph_library), tuple(recipe.kernel_library), tuple(recipe.kernels),
                                     recipe.output_spec)
        try:
            native.load_native(recipe)
        except build.LibraryError as exc:
            print("REFUSED", exc)  # nothing was loaded: the build below meets the cache as a new process
        else:
            print("LOADED")
        if sys.argv[3:] != ["build"]:
            sys.exit(0)
    gm = make_fx(f)(*args)
    with config.patch(cpu_wrapper="native"):
        cg = compile_graph(gm, args)
    out = cg(*args)[0]
    torch.testing.assert_close(out, f(*args)[0])
    recipe = artifact.describe(cg.fn).fields["native"]
    print(json.dumps([recipe.graph_library, recipe.kernel_library, recipe.kernels, recipe.output_spec]))
""")


def _child(cache_dir: str, *argv: str) -> str:
    env = dict(os.environ, KILN_CACHE_DIR=str(seed_cache(Path(cache_dir))), KILN_LOGS="cache")
    proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_second_process_loads_from_cache_and_refuses_tampered(tmp_path: Any) -> None:
    cache_dir = str(tmp_path / "cache")
    first = _child(cache_dir, "build")
    recipe_line = [line for line in first.splitlines() if line.startswith("[[") or line.startswith('["')][-1]
    second = _child(cache_dir, "no_build")  # a second process builds nothing: all from the cache
    assert "cache hit" in second
    loaded = _child(cache_dir, "recipe", recipe_line)
    assert "LOADED" in loaded and "REFUSED" not in loaded
    relative = json.loads(recipe_line)[0][0]
    path = os.path.join(cache_dir, relative)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    refused = _child(cache_dir, "recipe", recipe_line, "build")  # one process: refused, then compiled again
    assert "REFUSED" in refused and "LOADED" not in refused
    assert "does not match" in refused  # the build replaced the bad library and still computes right


def test_precompiled_header_checked_against_its_record(tmp_path: Any) -> None:
    """A .gch that is not the recorded one is not handed to the compiler (it would be parsed as the
    headers' content: code of someone else's in the graph's library). Checked on a small stand-in."""
    from kiln.runtime import store

    with config.patch(cache_dir=str(tmp_path / "cache")):
        header = native.precompiled_header_path()
        assert header is not None
        gch = header + ".gch"
        with open(header, "w") as f:
            f.write(native.PCH_HEADER)
        with open(gch, "wb") as f:
            f.write(b"stand-in for a precompiled header")
        digest = store.file_digest(gch)
        assert digest is not None
        store.write_sealed(gch + ".sum", json.dumps({"size": digest[0], "sha256": digest[1]}).encode())
        assert native._pch_ok(header)
        with open(gch, "wb") as f:
            f.write(b"stand-in for a precompiled headeR")  # same size, other bytes
        os.utime(gch, ns=(1, 1))  # a new stat signature, as any rewrite gives
        assert not native._pch_ok(header)
        with open(header, "w") as f:
            f.write(native.PCH_HEADER + "#include <evil.h>\n")
        assert not native._pch_ok(header)
