"""The Triton code generator on CPU, under Triton's interpreter: kernel shapes, reductions, random,
index checks, symbolic sizes and half types, each against eager; plus the choice of generator.

Every test sets kiln.config.cpu_backend = "triton"; tests/conftest.py sets TRITON_INTERPRET=1 before
anything imports triton when there is no GPU. One test compiles generated kernels for sm_80 with
Triton's real compiler (no GPU needed to compile), so what the interpreter accepts also type-checks.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kiln import config
from kiln.lower.codegen.triton import RENDER
from kiln.lower.codegen.triton_wrapper import choose_codegen

from .conftest import check, compile_fn

pytest.importorskip("triton")
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              # Triton interprets or compiles for the whole process: with a GPU, tests/gpu runs it compiled
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")]


@pytest.fixture(autouse=True)
def _triton_backend():
    with config.patch(cpu_backend="triton"):
        yield


def test_every_loop_op_has_a_triton_rendering() -> None:
    assert RENDER.missing() == set()


def test_device_picks_the_code_generator() -> None:
    assert choose_codegen(torch.device("cuda"), "cpp") == "triton"
    assert choose_codegen(torch.device("cpu"), "cpp") == "cpp"
    assert choose_codegen(torch.device("cpu"), "triton") == "triton"
    with pytest.raises(ValueError, match="cpu_backend"):
        choose_codegen(torch.device("cpu"), "cuda")


def test_a_cuda_input_makes_the_graph_a_cuda_graph() -> None:
    from kiln.fake import FakeTensorMode
    from kiln.lower.codegen.triton_wrapper import graph_device

    with FakeTensorMode():
        on_gpu = torch.randn(2, device="cuda")
    assert graph_device([torch.tensor(1.0), on_gpu, 3]).type == "cuda"  # a 0-d CPU scalar rides along
    assert graph_device([torch.tensor(1.0)]).type == "cpu" and graph_device([2]).type == "cpu"


def test_pointwise_kernel_is_flat_and_masks_its_tail() -> None:
    c = check(lambda x, y: ((x.sin() + y.cos()) * x).relu() + 1, torch.randn(64, 33), torch.randn(64, 33))
    assert c.codegen == "triton" and c.kernel_count == 1
    assert "xmask = xindex < xnumel" in c.triton_source and "RBLOCK" not in c.triton_source.split("kernel0")[1]
    assert "sin, cos, add, mul, relu, add_1" in c.triton_source  # kernels name their FX nodes
    assert "kernel0[(3,)]" in c.wrapper_source  # 2112 elements in blocks of 1024: a masked tail


def test_short_rows_reduce_persistently_and_long_rows_in_a_loop() -> None:
    short = check(lambda x: torch.softmax(x, -1), torch.randn(37, 129))
    assert "for roffset" not in short.triton_source and "RBLOCK=256" in short.wrapper_source
    long = check(lambda x: torch.softmax(x, -1), torch.randn(5, 3000), atol=1e-6)
    assert "for roffset in range(0, rnumel, RBLOCK)" in long.triton_source
    assert long.kernel_count == 1


def test_layer_norm_then_gelu_is_one_kernel() -> None:
    x, w, b = torch.randn(16, 48), torch.randn(48), torch.randn(48)
    c = check(lambda x, w, b: F.gelu(F.layer_norm(x, (48,), w, b)), x, w, b, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 1 and c.triton_source.count("@triton.jit\ndef kernel") == 1


@pytest.mark.parametrize("cols", [7, 2500])  # persistent and looped
def test_reductions_of_every_kind(cols: int) -> None:
    x = torch.randn(6, cols)
    x[1, 3] = float("nan")
    x[2, :] = float("-inf")
    x[4, 5] = x[4, 2] = 9.0  # a tie: the first index wins

    def f(x: torch.Tensor) -> tuple:
        return (x.sum(-1), x.amax(-1), x.amin(-1), x.argmax(-1), x.argmin(-1), (x > 0).any(-1), (x > -5).all(-1),
                (x[:, :5] * 0.5).prod(-1), x.nan_to_num().mean(0))
    check(f, x, atol=1e-4, rtol=1e-4)
    check(lambda i: (i.sum(-1), i.amax(-1), i.argmin(-1)), torch.randint(-50, 50, (6, cols)))


def test_column_and_full_reductions() -> None:
    check(lambda x: (x.sum(0), x.sum(), x.amax()), torch.randn(300, 17), atol=1e-4, rtol=1e-5)


def test_cumulative_ops_carry_across_chunks() -> None:
    check(lambda x: (x.cumsum(1), x.cumsum(0), (x * 0.01 + 1).cumprod(1)), torch.randn(9, 700), atol=1e-4, rtol=1e-4)


def test_scatters_store_serially_and_add_atomically() -> None:
    x, src = torch.zeros(10), torch.arange(6.0)
    index = torch.tensor([1, 3, 3, 0, 9, 1])
    check(lambda x, i, s: (x.index_put((i,), s), x.index_put((i,), s, accumulate=True)), x, index, src)
    check(lambda x, i, s: x.scatter_add(0, i, s), x, index, src)


def test_symbolic_sizes_are_kernel_arguments() -> None:
    c = check(lambda x: torch.softmax(x, -1) * 2, torch.randn(12, 40), dynamic=True)
    head = c.triton_source.split("def kernel0(")[1].split(")")[0]
    assert "s" in head and "xnumel = " in c.triton_source
    out = c(torch.randn(5, 40))  # other sizes through the same kernels
    assert out[0].shape == (5, 40)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32(dtype: torch.dtype) -> None:
    x = torch.randn(8, 50).to(dtype)
    c = check(lambda x: (torch.softmax(x, -1), x * 3 + 1, x.sum(-1)), x, atol=2e-2, rtol=2e-2)
    assert ".to(tl.float32)" in c.triton_source


def test_out_of_range_index_raises_and_reads_nothing() -> None:
    x = torch.randn(5, 4)
    c = compile_fn(lambda x, i: x[i] * 2, x, torch.tensor([0, 4]))
    torch.testing.assert_close(c(x, torch.tensor([-5, 1]))[0], x[torch.tensor([-5, 1])] * 2)
    for bad in (torch.tensor([0, 5]), torch.tensor([-6, 0]), torch.tensor([0, 10 ** 12])):
        with pytest.raises(IndexError, match="out of (bounds|range)"):
            c(x, bad)
    emb = compile_fn(lambda w, i: F.embedding(i, w), x, torch.tensor([[0, 1]]))
    with pytest.raises(IndexError):
        emb(x, torch.tensor([[0, 7]]))


def test_random_draws_are_masks_of_the_right_rate_and_differ_per_call() -> None:
    x = torch.ones(64, 64)
    c = compile_fn(lambda x: torch.ops.aten.native_dropout(x, 0.25, True), x)
    out, mask = c(x)
    assert "tl.rand(seed" in c.triton_source
    torch.testing.assert_close(out, mask.float() / 0.75)  # output and mask come from one draw
    assert 0.70 < mask.float().mean().item() < 0.80
    assert not torch.equal(mask, c(x)[1])


def test_pads_and_cats_do_not_read_outside_their_inputs() -> None:
    check(lambda x, y: (torch.cat([x, y], 1), F.pad(x, (2, 3, 1, 0), value=-1.0)), torch.randn(4, 3), torch.randn(4, 5))


def test_empty_ranges_launch_nothing() -> None:
    check(lambda x: (x + 1, x.sum(0), x.amax(1)), torch.randn(0, 3))  # sums over nothing are 0
    c = check(lambda x: x.exp(), torch.randn(0, 3))
    assert "has nothing to do" in c.wrapper_source


def test_generated_kernels_compile_for_a_gpu_without_one(tmp_path) -> None:
    """Triton's real compiler, not the interpreter: a fused softmax kernel down to PTX for sm_80.
    It runs in a fresh process, since this one has Triton in interpreter mode."""
    import os
    import subprocess
    import sys
    import textwrap

    c = compile_fn(lambda x: torch.softmax(x, -1) * 2, torch.randn(37, 129), dynamic=True)  # 64-bit indices too
    kernels = tmp_path / "kernels.py"
    kernels.write_text(c.triton_source)
    params = c.triton_source.split("def kernel0(")[1].split(")")[0].split(", ")
    signature = {p.split(":")[0]: "constexpr" if "constexpr" in p else "*fp32" if p.startswith(("arg", "buf"))
                 else "i32" for p in params}
    assert "i32" in signature.values()  # a size symbol is a kernel argument
    script = textwrap.dedent(f"""
        import importlib.util, sys
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        source = ASTSource(module.kernel0, signature={signature!r}, constexprs={{"XBLOCK": 1, "RBLOCK": 256}})
        compiled = triton.compile(source, target=GPUTarget("cuda", 80, 32))
        print(".entry kernel0" in compiled.asm["ptx"])
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script, str(kernels)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.stdout.strip().endswith("True"), out.stderr[-3000:]


def test_max_autotune_wrapper_launches_through_the_tuner() -> None:
    """On CUDA mode="max-autotune" makes each kernel an AutotunedKernel called with its range size;
    under the interpreter (timing means nothing) the plain launches stay."""
    from kiln.lower.codegen.triton_kernel import generate
    from kiln.lower.codegen.triton_wrapper import TritonWrapperWriter

    c = check(lambda x: torch.softmax(x, -1) + 1, torch.randn(12, 40), dynamic=True)
    _, launches = generate(c.program)
    source = TritonWrapperWriter(c.program, launches, torch.device("cpu"), autotune=True).write()
    assert "kernel0.launch(" in source and "XBLOCK=" not in source
    assert "kernel0[(" in c.wrapper_source
