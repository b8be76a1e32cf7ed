"""Tensors whose elements share memory (an `expand`, a sliding window) where Kiln writes or re-lays out.

Three places met them and raised "more than one element of the written-to tensor refers to a single
memory location" where eager runs:
- the wrappers' `_relayout`, which copied an input into the strides its kernels were compiled for: an
  XLNet training step's backward got a saved activation that was an expand (compiled strides
  (0, 1, 0)) with another stride on its size-1 dim, (1, 1, 0); now a tensor that differs only on
  size-1 dims is taken as it is, and a copy into strides that share memory writes each address once
  (kiln.runtime.overlap), on the Python and the native wrapper;
- in-place ops on an expanded input (fill_, zero_, masked_fill_, index writes, ...): eager writes
  each shared address in turn, and a functional graph cannot say that (worse: a write through an
  expand inside the function came back summed over the expanded dim, a silent wrong answer). Such a
  write is a graph break, so the op runs eagerly, with eager's values, or eager's error where eager
  refuses (add_, copy_ of a tensor, ...), on every backend;
- incoming gradients with overlapping strides (`y.backward(torch.ones(()).expand(y.shape))`).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import config
from kiln.log import KilnWarning
from kiln.lower import compile_graph
from kiln.runtime import native
from kiln.runtime.kernel_wrapper import relayout
from kiln.runtime.overlap import copy_into, may_overlap, strided_copy
from tests.lower.conftest import aten_graph


# ------------------------------------------------------------------------------ the layout helpers

@pytest.mark.parametrize("sizes, strides, expected", [
    ((4, 3), (0, 1), True),          # expand
    ((1, 3), (0, 1), False),         # a zero stride on a size-1 dim moves nowhere
    ((4, 3), (3, 1), False),         # contiguous
    ((3, 4), (1, 3), False),         # transposed
    ((8, 3), (1, 1), True),          # unfold's sliding windows
    ((2, 3), (6, 2), False),         # a strided slice
    ((3, 2), (2, 3), True),          # interleaves without meeting: taken as overlap (the careful copy)
    ((0, 3), (0, 1), False),         # empty
    ((), (), False),
])
def test_may_overlap(sizes, strides, expected) -> None:
    assert may_overlap(sizes, strides) is expected


@pytest.mark.parametrize("make, strides", [
    (lambda: torch.tensor([1.0, 2.0, 3.0]).expand(4, 3), (0, 1)),
    (lambda: torch.arange(6.0).view(1, 2, 3)[:, :1].expand(2, 5, 3), (0, 0, 1)),
    (lambda: torch.arange(10.0).unfold(0, 3, 1), (1, 1)),
    (lambda: torch.arange(4.0).view(4, 1).expand(4, 3), (1, 0)),
    (lambda: torch.arange(12.0).view(3, 4), (1, 3)),
    (lambda: torch.ones(0, 3), (0, 1)),
])
def test_strided_copy_into_shared_layouts(make: Callable[[], torch.Tensor], strides: tuple) -> None:
    t = make()
    got = strided_copy(t.contiguous(), strides)  # the values, materialized, back into the layout
    assert got.stride() == strides and got.shape == t.shape
    torch.testing.assert_close(got, t)
    assert t.numel() == 0 or got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_copy_into_writes_only_the_layout() -> None:
    storage = torch.zeros(16)
    dest = storage[1:].as_strided((4, 3), (0, 2))  # addresses 1, 3, 5 of the storage
    copy_into(dest, torch.tensor([7.0, 8.0, 9.0]))
    assert storage.tolist() == [0, 7, 0, 8, 0, 9] + [0] * 10
    storage.zero_()
    dest = storage[2:].as_strided((4, 3), (1, 1))  # windows: addresses 2 .. 7
    copy_into(dest, torch.arange(6.0).unfold(0, 3, 1)[:4])
    assert storage.tolist() == [0, 0, 0, 1, 2, 3, 4, 5] + [0] * 8


def test_relayout_takes_a_tensor_that_differs_on_size_one_dims() -> None:
    t = torch.arange(6.0).view(6, 1).expand(6, 5)
    t = t.as_strided((1, 6, 5), (1, 1, 0))  # XLNet's saved activation, compiled for (0, 1, 0)
    assert relayout(t, (0, 1, 0)) is t
    got = relayout(t.contiguous(), (0, 1, 0))
    assert got.stride() == (0, 1, 0)
    torch.testing.assert_close(got, t)


# ------------------------------------------------------------------------------ lowered graphs

def _is_native(fn: Any) -> bool:
    fn = getattr(fn, "current", fn)  # a graph's plan (config.native_plan) runs behind a settled TieredWrapper
    return getattr(fn, "func", None) is native.boundary().call


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", ["python", "native"])
def test_compiled_graph_takes_other_strides_for_an_expanded_input(wrapper: str) -> None:
    """Kernels compiled for an expanded input ((0, 1, 0), as XLNet's saved activation) get it with
    another stride on its size-1 dim, and materialized (contiguous); the result is eager's."""
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sin() + a.sum()

    base = torch.randn(7, 1)
    a = base.view(1, 7, 1).expand(1, 7, 5)
    a = a.as_strided(a.shape, (0, 1, 0))
    b = torch.randn(1, 7, 5)
    gm, examples = aten_graph(fn, a, b)
    with config.patch(cpu_wrapper=wrapper):
        compiled = compile_graph(gm, examples)
    assert _is_native(compiled.fn) == (wrapper == "native")
    for other in (a.as_strided(a.shape, (1, 1, 0)), a.contiguous(), a.transpose(0, 2).contiguous().transpose(0, 2)):
        torch.testing.assert_close(compiled(other, b)[0], fn(a, b))


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", ["python", "native"])
def test_compiled_graph_takes_windows_materialized(wrapper: str) -> None:
    def fn(w: torch.Tensor) -> torch.Tensor:
        return w.cos() * 2

    w = torch.randn(12).unfold(0, 4, 2)  # (5, 4), strides (2, 1): windows overlap
    gm, examples = aten_graph(fn, w)
    with config.patch(cpu_wrapper=wrapper):
        compiled = compile_graph(gm, examples)
    torch.testing.assert_close(compiled(w.contiguous())[0], fn(w))


# ------------------------------------------------------------------------------ backward

class _SavesAnExpand(torch.nn.Module):
    """Two-stream-attention-like: a bias expanded over the batch, multiplied in: the backward of the
    matmul saves the expand."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(6, 1))
        self.w = torch.nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expanded = self.bias.view(1, 6, 1).expand(x.shape[0], 6, 5)
        return torch.bmm(x @ self.w.unsqueeze(0).expand(x.shape[0], 4, 6), expanded).tanh()


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper, grad_kind", [
    pytest.param(wrapper, kind, id=f"{wrapper}-{kind}",
                 marks=[pytest.mark.slow] if wrapper == "native" and kind != "expanded" else [])
    for wrapper in ("python", "native") for kind in ("expanded", "scalar_expanded", "transposed")])
def test_backward_with_overlapping_incoming_grads(wrapper: str, grad_kind: str) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = _SavesAnExpand()
    x = torch.randn(1, 3, 4, requires_grad=True)

    def grad_for(y: torch.Tensor) -> torch.Tensor:
        if grad_kind == "expanded":
            return torch.linspace(0, 1, y.shape[-1]).expand(y.shape)
        if grad_kind == "scalar_expanded":
            return torch.tensor(0.5).expand(y.shape)
        return torch.randn(y.shape[::-1], generator=torch.Generator().manual_seed(1)).permute(2, 1, 0)

    def grads(fn: Callable) -> list[torch.Tensor]:
        for p in [x, *model.parameters()]:
            p.grad = None
        for _ in range(2):
            y = fn(x)
            y.backward(grad_for(y))
        return [p.grad.clone() for p in [x, *model.parameters()]]

    expected = grads(model)
    with config.patch(cpu_wrapper=wrapper), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = grads(kiln.compile(model))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", ["python", "native"])
def test_xlnet_training_step(wrapper: str) -> None:
    """The report: an XLNet LM training step (two-stream attention with perm_mask and
    target_mapping, the model in eval mode) raised in the backward's relayout."""
    transformers = pytest.importorskip("transformers")
    kiln.reset()
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=100, d_model=32, n_layer=1, n_head=2, d_inner=64, mem_len=None)
    model = transformers.XLNetLMHeadModel(cfg).eval()
    batch, length, predict = 2, 8, 3
    ids = torch.randint(0, 100, (batch, length))
    perm_mask = torch.zeros(batch, length, length)
    perm_mask[:, :, -predict:] = 1.0
    target_mapping = torch.zeros(batch, predict, length)
    for p in range(predict):
        target_mapping[:, p, length - predict + p] = 1.0
    labels = torch.randint(0, 100, (batch, predict))

    def step(fn: Callable) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = fn(ids, perm_mask=perm_mask, target_mapping=target_mapping, labels=labels).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    expected = step(model)
    with config.patch(cpu_wrapper=wrapper), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        compiled = kiln.compile(model)
        step(compiled)
        got = step(compiled)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
    assert len(got[1]) == len(expected[1])
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-5)


# ------------------------------------------------------------------------------ in-place ops

_ROW_MASK = torch.tensor([True, False, True])
IN_PLACE: dict[str, Callable[[torch.Tensor], Any]] = {
    # eager writes each shared address (one value everywhere, or a write that is the same along the
    # expanded dim)
    "fill_": lambda a: a.fill_(3.0),
    "zero_": lambda a: a.zero_(),
    "masked_fill_": lambda a: a.masked_fill_(_ROW_MASK, 5.0),
    "masked_fill_all_rows": lambda a: a.masked_fill_(torch.ones(4, 3, dtype=torch.bool), 5.0),
    "index_fill_": lambda a: a.index_fill_(1, torch.tensor([0]), 9.0),
    "index_put_one_row": lambda a: a.index_put_((torch.tensor([0]),), torch.tensor(1.0)),
    "setitem_row": lambda a: a.__setitem__(0, 4.0),
    "select_fill_": lambda a: a[2].fill_(-1.0),
    "fill_diagonal_": lambda a: a.fill_diagonal_(1.0),
    "copy_self": lambda a: a.copy_(a),
    "detach_zero_": lambda a: a.detach().zero_(),
    # eager refuses: its error, and what ran before it
    "add_": lambda a: a.add_(1),
    "mul_": lambda a: a.mul_(2),
    "clamp_": lambda a: a.clamp_(0, 0.5),
    "relu_": lambda a: torch.relu_(a),
    "iadd": lambda a: a.__iadd__(1.0),
    "copy_row": lambda a: a.copy_(torch.tensor([1.0, 2.0, 3.0])),
    "copy_full": lambda a: a.copy_(torch.ones(4, 3)),
    "setitem_all": lambda a: a.__setitem__(slice(None), 4.0),
    "scatter_": lambda a: a.scatter_(1, torch.zeros(4, 1, dtype=torch.long), 1.0),
    "out_add": lambda a: torch.add(torch.ones(4, 3), 1, out=a),
    "inplace_relu": lambda a: torch.nn.functional.relu(a, inplace=True),
}


def _expanded() -> torch.Tensor:
    return torch.tensor([0.1, -0.2, 0.7]).expand(4, 3)


def _outcome(fn: Callable, a: torch.Tensor) -> tuple:
    try:
        out = fn(a)
    except Exception as exc:  # the test compares what eager and compiled code raise
        return ("raised", type(exc), str(exc).splitlines()[0], a.tolist())
    return ("returned", out.tolist(), a.tolist(), a.stride())


def _program(op: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(a: torch.Tensor) -> torch.Tensor:
        b = a * 2  # work before and after the write, in the graphs around the break
        op(a)
        return a + b
    return f


# the break happens in capture, before any backend: CI runs every op on eager and aot_eager, and a
# few through the whole lowering
_INDUCTOR_IN_CI = ("fill_", "masked_fill_", "setitem_row", "add_", "copy_full", "out_add")


@pytest.mark.cpp
@pytest.mark.parametrize("name, backend", [
    pytest.param(name, backend, id=f"{name}-{backend}",
                 marks=[pytest.mark.slow] if backend == "inductor" and name not in _INDUCTOR_IN_CI else [])
    for name in IN_PLACE for backend in ("eager", "aot_eager", "inductor")])
def test_in_place_on_an_expanded_input_is_eager(name: str, backend: str) -> None:
    kiln.reset()
    fn = _program(IN_PLACE[name])
    expected = _outcome(fn, _expanded())
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error: the frame runs eagerly, with one
        got = _outcome(kiln.compile(fn, backend=backend), _expanded())
    assert got == expected
    assert kiln.stats()["graph_breaks"] >= 1


WRITES_THROUGH_VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "expand_fill_": lambda a: (a.expand(4, 3).fill_(1.0), a + 0)[1],
    "expand_zero_": lambda a: (a.expand(4, 3).zero_(), a * 1)[1],
    "expand_masked_fill_": lambda a: (a.expand(4, 3).masked_fill_(_ROW_MASK, 5.0), a + 0)[1],
    "expand_add_": lambda a: (a.expand(4, 3).add_(1.0), a + 0)[1],
    "unsqueeze_expand_fill_": lambda a: (a.unsqueeze(0).expand(2, 3).fill_(1.0), a.sum())[1],
    "expand_fill_then_read_it": lambda a: (lambda b: (b.fill_(1.0), b * 2)[1])(a.expand(4, 3)),
    "expand_row_fill_": lambda a: (a.expand(4, 3)[0].fill_(2.0), a + 0)[1],
    "expand_setitem": lambda a: (a.expand(4, 3).__setitem__((0, 1), 7.0), a + 0)[1],
}


@pytest.mark.cpp
@pytest.mark.parametrize("name, backend", [
    pytest.param(name, backend, id=f"{name}-{backend}",
                 marks=[pytest.mark.slow] if backend == "inductor" and name not in ("expand_fill_", "expand_add_") else [])
    for name in WRITES_THROUGH_VIEWS for backend in ("aot_eager", "inductor")])
def test_write_through_an_expand_of_an_input(name: str, backend: str) -> None:
    """Before: the write came back into the input summed over the expanded dim (fill_ of 1.0 gave
    the input 4.0 plus ...), or add_ returned where eager raises."""
    kiln.reset()
    fn = WRITES_THROUGH_VIEWS[name]
    expected = _outcome(fn, torch.tensor([0.1, -0.2, 0.7]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = _outcome(kiln.compile(fn, backend=backend), torch.tensor([0.1, -0.2, 0.7]))
    assert got == expected


def test_fullgraph_names_the_write() -> None:
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="share memory"):
        kiln.compile(_program(IN_PLACE["fill_"]), fullgraph=True, backend="aot_eager")(_expanded())


def test_writes_into_plain_views_stay_in_the_graph() -> None:
    """Column slices, strided rows, transposes: no shared memory, no break."""
    kiln.reset()

    def fn(a: torch.Tensor) -> torch.Tensor:
        a[:, ::2].fill_(1.0)
        a.t()[1].mul_(3.0)
        torch.relu_(a[1:])
        return a * 2

    x = torch.randn(4, 3)
    expected = fn(x.clone())
    got = kiln.compile(fn, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, expected)
    assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_in_place_dunder_spelled_out_is_kept(backend: str) -> None:
    """`a.__iadd__(1)` written as a call was dropped from the graph as dead code (its name starts
    with "__"): the input stayed unchanged, a silent wrong answer."""
    kiln.reset()

    def fn(a: torch.Tensor) -> torch.Tensor:
        a.__iadd__(1.0)
        a.__imul__(3.0)
        return a * 2

    x, y = torch.arange(3.0), torch.arange(3.0)
    expected = fn(x)
    got = kiln.compile(fn, fullgraph=True, backend=backend)(y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(y, x)


@pytest.mark.cpp
@pytest.mark.parametrize("name", ["fill_", "zero_", "masked_fill_", "setitem_row"])
def test_kiln_as_torch_compile_backend_writes_back_into_an_expanded_input(name: str) -> None:
    """Dynamo (the real torch.compile) puts the write into the graph, so Kiln's AOT runtime copies
    the new value back into the caller's expanded tensor: one value per shared address, as eager's
    in-place op left it (a plain copy_ raised "more than one element ... single memory location")."""
    import torch._dynamo  # a test may drive Kiln's backend from the real torch.compile

    fn = _program(IN_PLACE[name])
    expected = _outcome(fn, _expanded())
    torch._dynamo.reset()
    try:
        got = _outcome(torch.compile(fn, backend=kiln.inductor_backend), _expanded())
    finally:
        torch._dynamo.reset()
    assert got == expected
