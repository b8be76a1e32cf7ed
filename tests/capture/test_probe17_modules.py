"""Probe 17 (nn.Module programs of the kind Dynamo's module, hook and repro tests cover): the wrong
answers and internal errors it found, each compared with eager.

- A pure tensor hook on a tensor the graph computes is registered by a node of the graph; when that
  tensor leaves the graph (returned, stored, live at a break), the caller's later hooks and
  retain_grad on it must see the gradient that hook returns, as in eager (under AOT autograd the
  graph's hook ran inside the compiled backward, after them).
- ParameterList / ParameterDict holding values that are not parameters (a float, a module): items
  in the container's own order, read where the container keeps them.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln

BACKENDS = ["aot_eager"]  # the eager backend registered the hook on the real output already


def _compiled(fn, backend):
    kiln.reset()
    return kiln.compile(fn, backend=backend)


# ------------------------------------------------------------------ hooked tensors that escape
def _returns_hooked(x):
    y = x * 2
    y.register_hook(lambda g: g * 10)
    return y


def _returns_hooked_and_uses_it(x):
    y = x.sin()
    y.register_hook(lambda g: g * 3)
    return y, (y * y).sum()


def _after_the_caller(fn, x, *, retain: bool):
    """Run fn, then the caller's own retain_grad / hook on the hooked output, then backward."""
    out = fn(x)
    y = out[0] if isinstance(out, tuple) else out
    seen: list = []
    if retain:
        y.retain_grad()
    else:
        y.register_hook(lambda g: seen.append(g.clone()))
    total = sum(o.sum() * (i + 1) for i, o in enumerate(out if isinstance(out, tuple) else (out,)))
    total.backward()
    return x.grad, (y.grad if retain else seen)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_returns_hooked, _returns_hooked_and_uses_it])
@pytest.mark.parametrize("retain", [True, False])
def test_caller_sees_the_gradient_the_frames_hook_returns(backend, fn, retain) -> None:
    x = torch.randn(3, requires_grad=True)
    want_x, want_y = _after_the_caller(fn, x, retain=retain)
    x2 = x.detach().clone().requires_grad_()
    got_x, got_y = _after_the_caller(_compiled(fn, backend), x2, retain=retain)
    torch.testing.assert_close(got_x, want_x)
    if retain:
        torch.testing.assert_close(got_y, want_y)
    else:
        assert len(got_y) == len(want_y) and all(torch.allclose(a, b) for a, b in zip(got_y, want_y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_hook_then_retain_grad_after_a_break(backend) -> None:
    keep: dict = {}

    def f(x):
        y = x * 3
        y.register_hook(lambda g: g * 2)
        print("", end="")  # a break: y is live at it
        y.retain_grad()
        keep["y"] = y
        return (y * y).sum()

    def run(fn):
        x = torch.arange(3.0, requires_grad=True)
        fn(x).backward()
        return x.grad, keep["y"].grad

    want = run(f)
    got = run(_compiled(f, backend))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hooked_module_output_stored_then_hooked_by_the_caller(backend) -> None:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.last = None

        def forward(self, x):
            y = self.lin(x)
            y.register_hook(lambda g: g * 0)
            self.last = y
            return y.sum() * 2

    def run(m):
        log: list = []
        out = m(torch.ones(2, 3))
        inner = m._orig_mod if hasattr(m, "_orig_mod") else m
        inner.last.register_hook(lambda g: log.append(g.clone()))
        out.backward()
        return log, inner.lin.weight.grad

    torch.manual_seed(0)
    want = run(M())
    torch.manual_seed(0)
    kiln.reset()
    got = run(kiln.compile(M(), backend=backend))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


# ------------------------------------------------------------------ Parameter containers
class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.ones(2)), 3.0, nn.Tanh()])
        self.pd = nn.ParameterDict({"s": 2.0, "w": nn.Parameter(torch.full((2,), 0.5))})

    def forward(self, x):
        out = x * self.ps[0] * self.ps[1] * self.pd["s"] * self.pd["w"]
        for v in self.ps:
            if isinstance(v, float):
                out = out + v
        for k, v in self.pd.items():
            if not isinstance(v, float):
                out = out + v
        return self.ps[2](out), len(self.ps), list(self.pd.keys())


def test_parameter_containers_with_plain_values() -> None:
    torch.manual_seed(0)
    m = _Mixed()
    kiln.reset()
    compiled = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(2)
    for change in (None, lambda: m.ps.__setitem__(1, 5.0), lambda: m.pd.__setitem__("s", -1.0),
                   lambda: m.pd.__setitem__("t", 7.0)):
        if change is not None:
            change()
        got, want = compiled(x), m(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]


def test_parameter_list_with_plain_values_gradients() -> None:
    torch.manual_seed(0)
    m = _Mixed()
    kiln.reset()
    compiled = kiln.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(2)
    compiled(x)[0].sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x)[0].sum().backward()
    for g, p in zip(got, m.parameters()):
        torch.testing.assert_close(g, p.grad)


# ------------------------------------------------------------------ global module hooks
def test_global_module_hooks_see_the_users_modules_only() -> None:
    """A global forward hook registered after the first call: the recompiled graph runs it on the
    user's modules, and the graph Kiln runs (aot_eager's ATen graphs) is none of them."""
    from torch.nn.modules import module as module_hooks

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    kiln.reset()
    compiled = kiln.compile(net, backend="aot_eager")
    x = torch.randn(3, requires_grad=True)
    compiled(x)

    def run(fn):
        seen: list = []
        handles = [module_hooks.register_module_forward_hook(
            lambda mod, args, out: (seen.append(type(mod).__name__), out + 1)[1])]
        try:
            out = fn(x)
            out.sum().backward()
        finally:
            for h in handles:
                h.remove()
        grad = x.grad.clone()
        x.grad = None
        return out, grad, seen

    got, want = run(compiled), run(net)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2] == want[2]


# ------------------------------------------------------------------ legacy backward hooks
def test_legacy_backward_hook_sees_eagers_last_node() -> None:
    """register_backward_hook (not the full kind) hooks the grad_fn of the forward's result: its
    grad_input is that node's (eager's last op), so the compiled module with one runs eagerly."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    net = lin
    seen: list = []
    lin.register_backward_hook(lambda mod, gin, gout: seen.append(
        [None if g is None else tuple(g.shape) for g in gin]))

    def run(fn):
        seen.clear()
        x = torch.linspace(-1, 1, 12).reshape(4, 3).requires_grad_()
        fn(x).sum().backward()
        return list(seen), x.grad

    want = run(net)
    kiln.reset()
    got = run(kiln.compile(net, backend="aot_eager"))
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1])



# ------------------------------------------------------------------ hooks that change the gradient's kind
def _hook_changes_dtype(x):
    y = x * 2
    y.register_hook(lambda g: g.double())
    return y.sum()


def _hook_changes_size(x):
    y = x * 2
    y.register_hook(lambda g: g.sum())
    return y.sum()


@pytest.mark.parametrize("f, message", [(_hook_changes_dtype, "changed the type"),
                                        (_hook_changes_size, "changed the size")])
def test_pure_hook_changing_the_gradient_raises_in_backward_as_eager(f, message) -> None:
    """The graph cannot hold such a hook (AOT autograd's trace of the backward raised and Kiln fell
    back with an internal error): it breaks, and eager's error comes from backward."""
    import warnings

    from kiln.log import KilnWarning

    kiln.reset()
    compiled = kiln.compile(f, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(torch.ones(3, requires_grad=True))
    assert not [w for w in caught if issubclass(w.category, KilnWarning)]
    with pytest.raises(RuntimeError, match=message):
        out.backward()
