"""A module whose hooks cannot be traced is called natively at a graph break, with its forward compiled.

This is how FSDP2 modules run under Kiln (their all-gather and reshard hooks live in torch.distributed
and are never traced); here the hooks are plain functions marked kiln.disable, so no process group is
needed. Checks outputs, hook order and that the wrapped module's own ops were captured in a graph.
"""
from __future__ import annotations

import torch

import kiln


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * 2


class Outer(torch.nn.Module):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.inner = Inner()
        self.head = torch.nn.Linear(4, 4)
        self.inner.register_forward_pre_hook(kiln.disable(lambda m, args: log.append("pre") or (args[0] + 1,)))
        self.inner.register_forward_hook(kiln.disable(lambda m, args, out: log.append("post") or out - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x)).sum(-1)


def test_hooks_run_natively_around_a_compiled_forward() -> None:
    log: list[str] = []
    model = Outer(log)
    x = torch.randn(3, 4, requires_grad=True)
    expected = model(x)
    log.clear()
    graphs: list[list[str]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        out = compiled(x)
        torch.testing.assert_close(out, expected)
    assert log == ["pre", "post", "pre", "post"]
    assert model.inner.__dict__.get("forward") is None  # the swap left nothing behind
    # the inner forward (linear, relu, mul) is a graph of its own, not run eagerly with the hooks
    assert any(any("relu" in t for t in g) and any("linear" in t for t in g) for g in graphs), graphs
    out.sum().backward()
    assert x.grad is not None
