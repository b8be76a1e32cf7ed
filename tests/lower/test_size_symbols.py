"""Size symbols that reach a kernel: every one must be bound by the wrapper and passed to the kernel.

The class (found on XLNet under dynamic=True, whose backward's kernel looped over `s10*s9` with
neither symbol defined: a C++ build error and the frame run eagerly): a size symbol in a kernel's
index or range that no input of the graph carries as a size, stride or SymInt of its own. Three
places close it: the partitioner hands the backward every symbol its saved values' sizes use
(kiln.autograd.partition), the lowering solves a symbol from an input size linear in it
(kiln.lower.graph.solve_symbols, for the C++ and Triton wrappers alike), and the IR's verifier
names any symbol still unbound before a compiler runs. Also here: a slice counted from the end
of a symbolic size (x[-512:] of fewer rows, XLNet's memory) starts where the trace said, not before
the buffer's first element.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import kiln
from kiln import config
from kiln.errors import VerificationError
from kiln.log import KilnWarning
from kiln.lower import compile_graph
from kiln.lower.ir import InputBuffer, Layout, LoopIR, Pointwise, verify_ir, Load
from kiln.runtime import native

aten = torch.ops.aten


def _flat_input_graph() -> tuple[torch.fx.GraphModule, list[Any]]:
    """A graph whose first input is [s0*s1] (a flattened matrix), whose second is s0 as a SymInt and
    whose third is [s1 + 2]: s1 is no input's size of its own, yet the kernels loop over it."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    matrix = mode.from_tensor(torch.randn(3, 4), static_shapes=False)
    rows, cols = matrix.shape
    with mode:
        flat = matrix.reshape(-1)
        longer = torch.empty(cols + 2)
        doubled = aten.mul.Tensor(flat, 2.0)
        square = aten.view.default(doubled, [rows, -1])
        column_sums = aten.sum.dim_IntList(square, [0])
        tail = aten.slice.Tensor(longer, 0, 2, 9223372036854775807)
        total = aten.add.Tensor(column_sums, tail)
    graph = torch.fx.Graph()
    x, n, y = graph.placeholder("x"), graph.placeholder("n"), graph.placeholder("y")
    for node, value in ((x, flat), (n, rows), (y, longer)):
        node.meta["val"] = value
    steps = [(aten.mul.Tensor, (x, 2.0), doubled), (aten.view.default, (None, [n, -1]), square),
             (aten.sum.dim_IntList, (None, [0]), column_sums)]
    last = None
    for op, args, value in steps:
        last = graph.call_function(op, tuple(last if a is None else a for a in args))
        last.meta["val"] = value
    sums = last
    sliced = graph.call_function(aten.slice.Tensor, (y, 0, 2, 9223372036854775807))
    sliced.meta["val"] = tail
    out = graph.call_function(aten.add.Tensor, (sums, sliced))
    out.meta["val"] = total
    doubled_node = next(node for node in graph.nodes if node.target is aten.mul.Tensor)
    graph.output((out, doubled_node))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [flat, rows, longer]


def _check_flat_input_graph(compiled: Any) -> None:
    for rows, cols in ((3, 4), (5, 2), (1, 7)):
        a, y = torch.randn(rows, cols), torch.randn(cols + 2)
        total, doubled = compiled(a.reshape(-1), rows, y)
        torch.testing.assert_close(total, (a * 2).sum(0) + y[2:])
        torch.testing.assert_close(doubled, a.reshape(-1) * 2)


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", ["python", "native"])
def test_symbol_solved_from_a_flattened_input_cpp(wrapper: str) -> None:
    gm, examples = _flat_input_graph()
    with config.patch(cpu_wrapper=wrapper):
        compiled = compile_graph(gm, examples)
    fn = getattr(compiled.fn, "current", compiled.fn)  # a plan runs behind a settled TieredWrapper
    assert (wrapper == "native") == (getattr(fn, "func", None) is native.boundary().call)
    assert compiled.program.ir.derived, "the column count should be solved from the flat input's size"
    _check_flat_input_graph(compiled)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_symbol_solved_from_a_flattened_input_triton() -> None:
    pytest.importorskip("triton")
    gm, examples = _flat_input_graph()
    with config.patch(cpu_backend="triton"):
        compiled = compile_graph(gm, examples)
    assert compiled.codegen == "triton"
    _check_flat_input_graph(compiled)


def test_verifier_names_a_symbol_no_input_binds() -> None:
    """[s0*s1] alone gives neither symbol: a kernel over it could not be built, so the IR is refused
    with the symbols named (before any compiler runs)."""
    s0, s1, i0 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1", "i0"))
    flat = Layout(torch.float32, (s0 * s1,), (sympy.Integer(1),))
    doubled = Pointwise("buf0", flat, (), Load("arg0", i0, torch.float32))
    with pytest.raises(VerificationError, match=r"buf0 has sizes in the symbols \['s0', 's1'\]"):
        verify_ir(LoopIR((InputBuffer("arg0", flat, (), 0), doubled), (), {}))


def _cross_entropy(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(x.view(-1, x.shape[-1]), labels.view(-1))


@pytest.mark.cpp
def test_backward_gets_the_symbols_of_a_saved_product() -> None:
    """The labels' two dims are symbols of their own; the backward reads them only through the
    flattened labels it saves, [s2*s3]: the forward hands both over as SymInts."""
    kiln.reset()
    compiled = kiln.compile(_cross_entropy, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # no build error, no eager fallback
        for batch, positions in ((2, 3), (3, 5), (4, 2)):
            x = torch.randn(batch, positions, 7, requires_grad=True)
            labels = torch.randint(0, 7, (batch, positions))
            loss = compiled(x, labels)
            loss.backward()
            got = x.grad
            x.grad = None
            expected = _cross_entropy(x, labels)
            expected.backward()
            torch.testing.assert_close(loss, expected)
            torch.testing.assert_close(got, x.grad)
    assert kiln.stats()["fallbacks"] == 0
    kiln.reset()


def _slices(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x[-512:] * 2, x[-3:] + 1, x[:-2] * 3, x[2:-1:2] * 4, x[-7:-2] * 5


def _slice_scatters(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.slice_scatter(x, y * 2, 0, -512), torch.slice_scatter(x, y[:3] + 1, 0, -3)


@pytest.mark.cpp
@pytest.mark.parametrize("fn", [_slices, _slice_scatters])
def test_slice_from_the_end_of_a_symbolic_size(fn: Any) -> None:
    """x[-512:] of s0 < 512 rows starts at row 0; the lowering took s0 - 512, a read before the
    buffer (XLNet's memory `curr_out[-mem_len:]`: garbage and an out-of-range embedding index)."""
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows in (8, 11, 5, 600):
        x = torch.arange(rows * 2.0).reshape(rows, 2)
        args = (x,) if fn is _slices else (x, torch.ones(min(rows, 512), 2))
        for got, want in zip(compiled(*args), fn(*args)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    kiln.reset()


@pytest.mark.slow
@pytest.mark.cpp
def test_xlnet_two_stream_training_with_dynamic_sizes() -> None:
    """The report: XLNet's LM head with perm_mask and target_mapping under dynamic=True."""
    transformers = pytest.importorskip("transformers")
    kiln.reset()
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=100, d_model=32, n_layer=1, n_head=2, d_inner=64, mem_len=None)
    model = transformers.XLNetLMHeadModel(cfg).eval()
    compiled = kiln.compile(model, dynamic=True)
    for batch, length, predict in ((2, 8, 3), (3, 11, 4), (2, 6, 2)):
        ids = torch.randint(0, 100, (batch, length))
        perm_mask = torch.zeros(batch, length, length)
        perm_mask[:, :, -predict:] = 1.0
        target_mapping = torch.zeros(batch, predict, length)
        for p in range(predict):
            target_mapping[:, p, length - predict + p] = 1.0
        labels = torch.randint(0, 100, (batch, predict))
        results = []
        for fn in (compiled, model):
            model.zero_grad(set_to_none=True)
            with warnings.catch_warnings():
                warnings.simplefilter("error", KilnWarning)
                loss = fn(ids, perm_mask=perm_mask, target_mapping=target_mapping, labels=labels).loss
                loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-5)
        for got, want in zip(results[0][1], results[1][1]):
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    assert kiln.stats()["fallbacks"] == 0
    kiln.reset()
