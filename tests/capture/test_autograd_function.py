"""Custom torch.autograd.Function inside compiled code: `Fn.apply` is one node of the graph.

Every Function here is compiled with the "eager" (runs the torch-level graph, calling apply),
"aot_eager" and "inductor" backends and must give eager's outputs and input gradients. Several
backwards use a formula autograd would not derive (straight-through estimator, scaled gradients),
so a gradient that matches eager proves the user's backward ran. Graph and break counts are
compared with torch._dynamo.explain (the oracle); forwards that cannot be traced still break.
"""
from __future__ import annotations

import pytest
import torch
from torch.autograd.function import once_differentiable

import kiln

BACKENDS = ["eager", "aot_eager", "inductor"]


class RoundSTE(torch.autograd.Function):
    """Forward rounds (derivative 0 almost everywhere); backward passes the gradient through, scaled."""

    @staticmethod
    def forward(ctx, x, scale: float, offset: int, unused):
        ctx.scale = scale
        return torch.round(x * scale) + offset

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None, None, None


class ExpSavesOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        out = torch.exp(x) * y
        ctx.save_for_backward(out, y)  # an output and an input
        return out

    @staticmethod
    def backward(ctx, g):
        out, y = ctx.saved_tensors
        return g * out * 2.0, g * out / y  # x's grad doubled: not autograd's formula


class SplitMax(torch.autograd.Function):
    """Two outputs, one of them an integer index marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, index = x.max(dim=1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x, index)
        return values * 3.0, index, x.sin()

    @staticmethod
    def backward(ctx, g_values, g_index, g_sin):
        x, index = ctx.saved_tensors
        grad = torch.zeros_like(x).scatter(1, index.unsqueeze(1), g_values.unsqueeze(1))
        return grad + g_sin * x.cos() + 0.5


class NeedsGrad(torch.autograd.Function):
    """Returns a gradient only where ctx.needs_input_grad says so (a grad for `w` would be wrong
    shape-wise if computed when `w` does not need one)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g @ w.t() if ctx.needs_input_grad[0] else None
        gw = x.t() @ g * 10.0 if ctx.needs_input_grad[1] else None
        return gx, gw


class SetupContextSquare(torch.autograd.Function):
    """The forward-without-ctx style: forward(x, k) plus setup_context(ctx, inputs, output)."""

    @staticmethod
    def forward(x, k):
        return x * x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, k = inputs
        ctx.save_for_backward(x)
        ctx.k = k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x * ctx.k * 4.0, None


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.tanh()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - x.tanh() ** 2) + 1.0


class BloomGeLU(torch.autograd.Function):
    """transformers' BLOOM GeLUFunction: saves a tuple and unpacks it in a helper."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        return _bloom_back(g, saved)


def _bloom_back(g, x):
    x = x[0]
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


class PrintsInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("forward ran")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class ItemInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x.sum().item()

    @staticmethod
    def backward(ctx, g):
        return g


def _ste(x, y):
    return RoundSTE.apply(x.sin(), 4.0, 2, None) * y


def _exp(x, y):
    return ExpSavesOutput.apply(x, y.abs() + 1.0).cos()


def _split(x, y):
    values, index, s = SplitMax.apply(x * y)
    return values.sum() + s.sum() + index.float().sum()


def _needs(x, y):
    return NeedsGrad.apply(x, y.t()).relu()


def _setup(x, y):
    return SetupContextSquare.apply(x + y, 1.5)


def _once(x, y):
    return OnceDifferentiable.apply(x) * y


def _bloom(x, y):
    return BloomGeLU.apply(x @ y.t())


CASES = {"ste": _ste, "save_output": _exp, "multiple_outputs": _split, "needs_input_grad": _needs,
         "setup_context": _setup, "once_differentiable": _once, "bloom_gelu": _bloom}


def _inputs(y_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen).requires_grad_()
    y = torch.randn(4, 6, generator=gen).requires_grad_(y_grad)
    return x, y


def _outputs_and_grads(fn, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list]:
    out = fn(x, y)
    wrt = [t for t in (x, y) if t.requires_grad]
    grads = torch.autograd.grad(out.sum(), wrt)
    return out.detach(), list(grads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_with_user_backward(name: str, backend: str) -> None:
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for y_grad in (True, False):
        x, y = _inputs(y_grad)
        expected, expected_grads = _outputs_and_grads(fn, x, y)
        x, y = _inputs(y_grad)
        got, got_grads = _outputs_and_grads(compiled, x, y)
        torch.testing.assert_close(got, expected)
        for a, b in zip(got_grads, expected_grads):
            torch.testing.assert_close(a, b)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["graphs"] >= 1, stats


def test_ste_gradient_is_not_autograds() -> None:
    """The compiled gradient is the user's (scale), not round's zero: the backward really ran."""
    x = torch.randn(8, requires_grad=True)
    out = kiln.compile(lambda t: RoundSTE.apply(t, 3.0, 0, None), backend="aot_eager")(x)
    (grad,) = torch.autograd.grad(out.sum(), [x])
    torch.testing.assert_close(grad, torch.full_like(x, 3.0))


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_counts_match_dynamo(name: str) -> None:
    import torch._dynamo

    fn = CASES[name]
    x, y = _inputs()
    torch._dynamo.reset()
    oracle = torch._dynamo.explain(fn)(x, y)
    kiln.reset()
    ours = kiln.explain(fn)(x, y)
    assert ours.graph_count == oracle.graph_count == 1
    assert ours.graph_break_count == oracle.graph_break_count == 0


def test_no_grad_call_and_inference() -> None:
    compiled = kiln.compile(_bloom, backend="inductor")
    x, y = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), _bloom(x, y))


def test_print_in_forward_still_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    def fn(x):
        return PrintsInForward.apply(x.cos()) + 1

    kiln.reset()
    report = kiln.explain(fn)(torch.randn(3))
    assert report.break_reasons
    reasons = " ".join(str(r) for r in report.break_reasons)
    assert "PrintsInForward.apply" in reasons and "autograd.Function" in reasons
    capsys.readouterr()
    x = torch.randn(3, requires_grad=True)
    compiled = kiln.compile(fn, backend="aot_eager")
    out = compiled(x)
    assert capsys.readouterr().out == "forward ran\n"  # each call prints, as in eager
    torch.testing.assert_close(out, fn(x))
    (grad,) = torch.autograd.grad(out.sum(), [x])
    torch.testing.assert_close(grad, -2 * x.sin())


def test_item_in_forward_still_breaks() -> None:
    def fn(x):
        return ItemInForward.apply(x * 2)

    kiln.reset()
    report = kiln.explain(fn)(torch.randn(3))
    assert report.break_reasons
    assert "ItemInForward.apply" in " ".join(str(r) for r in report.break_reasons)
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn, backend="inductor")(x), fn(x))


def test_redefined_function_recompiles() -> None:
    """The graph calls the class it was captured with; a new class under the same name is a new graph."""
    namespace: dict = {"torch": torch}
    source = '''
class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * {k}
    @staticmethod
    def backward(ctx, g):
        return g * {k}
def fn(x):
    return Scale.apply(x)
'''
    exec(source.format(k=2), namespace)
    compiled = kiln.compile(namespace["fn"], backend="aot_eager")
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x), x * 2)
    exec(source.format(k=5).split("def fn")[0], namespace)  # rebinds the global Scale only
    torch.testing.assert_close(compiled(x), x * 5)


CALLS: list[int] = []


class CountsCalls(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        CALLS.append(1)
        return x + 1

    @staticmethod
    def backward(ctx, g):
        return g


def test_forward_with_outside_state_still_breaks() -> None:
    """A write outside the Function would happen once (while the node is traced), not per call."""
    def fn(x):
        return CountsCalls.apply(x).relu()

    kiln.reset()
    CALLS.clear()
    compiled = kiln.compile(fn, backend="aot_eager")
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(CALLS) == 6
    assert kiln.stats()["graph_breaks"] >= 1


def test_fullgraph_accepts_traceable_function() -> None:
    x, y = _inputs()
    out = kiln.compile(_needs, backend="aot_eager", fullgraph=True)(x, y)
    torch.testing.assert_close(out, _needs(x, y))


def test_assigning_new_backward_recompiles() -> None:
    class Patched(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    holder = {"fn": Patched}

    def fn(x):
        return holder["fn"].apply(x)

    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    x = torch.ones(3, requires_grad=True)
    (grad,) = torch.autograd.grad(compiled(x).sum(), [x])
    torch.testing.assert_close(grad, torch.full_like(x, 2.0))
    Patched.backward = staticmethod(lambda ctx, g: g * 9)
    (grad,) = torch.autograd.grad(compiled(x).sum(), [x])
    torch.testing.assert_close(grad, torch.full_like(x, 9.0))
    Patched.forward = staticmethod(lambda ctx, x: x * 4)
    torch.testing.assert_close(compiled(x), x * 4)
    assert kiln.stats()["recompiles"] >= 2


class ReturnsInputView(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.view(-1)

    @staticmethod
    def backward(ctx, g):
        return g.view(ctx.shape) * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_viewing_an_input_keeps_user_backward(backend: str) -> None:
    """Returned directly, such an output would come back from AOT autograd as a plain view of the
    input (gradient 1, not 3): Kiln breaks there instead; after other ops it stays in the graph."""
    def direct(x):
        return ReturnsInputView.apply(x)

    def then_op(x):
        return ReturnsInputView.apply(x) * 2

    for fn in (direct, then_op):
        kiln.reset()
        x = torch.randn(4, 3, requires_grad=True)
        out = kiln.compile(fn, backend=backend)(x)
        (grad,) = torch.autograd.grad(out.sum(), [x])
        (expected,) = torch.autograd.grad(fn(x).sum(), [x])
        torch.testing.assert_close(out, fn(x))
        torch.testing.assert_close(grad, expected)


ALIASED_APPLY = RoundSTE.apply


class RoundSTETimesTen(RoundSTE):
    """Inherits RoundSTE's forward; its own backward."""

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale * 10, None, None, None


def test_apply_through_a_module_level_alias_is_guarded() -> None:
    global ALIASED_APPLY

    def fn(x):
        return ALIASED_APPLY(x, 2.0, 0, None)

    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    x = torch.randn(5, requires_grad=True)
    (grad,) = torch.autograd.grad(compiled(x).sum(), [x])
    torch.testing.assert_close(grad, torch.full_like(x, 2.0))
    assert kiln.stats()["graph_breaks"] == 0
    try:
        ALIASED_APPLY = RoundSTETimesTen.apply  # another Function behind the same name
        (grad,) = torch.autograd.grad(compiled(x).sum(), [x])
        torch.testing.assert_close(grad, torch.full_like(x, 20.0))
    finally:
        ALIASED_APPLY = RoundSTE.apply
