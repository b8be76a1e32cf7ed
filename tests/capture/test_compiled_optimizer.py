"""A compiled optimizer step: `kiln.compile(opt.step)` as torch.compile's users write it.

Each torch optimizer (single-tensor, foreach and fused paths, parameter groups, parameters without
a gradient, tensor and float learning rates under a scheduler) gives eager's parameters and state
after several steps, in one graph per step with no more compiles than torch.compile makes (the real
one, backend="eager", as the oracle). Also the pieces the step is made of: `_init_group` run for
real, `.grad` read and written, foreach ops kept in the graph, profiler ranges left out, torch's
own disable marks honoured, typing subscripts, tensor-valued `alpha`/`value` arguments.
"""
from __future__ import annotations

import collections
import typing
import warnings

import pytest
import torch
import torch.nn as nn

import kiln

O = torch.optim


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Linear(4, 3))


def _train(make_opt, compile_step=None, steps: int = 3, scheduler=None, frozen: int | None = 3):
    """Run `steps` optimizer steps on fresh copies of one model and data; returns (params, opt).
    Parameter `frozen` gets no gradient (the optimizer must skip it)."""
    model = _model()
    params = list(model.parameters())
    if frozen is not None:
        params[frozen].requires_grad_(False)
    opt = make_opt(params)
    sched = scheduler(opt) if scheduler is not None else None
    step = compile_step(opt.step) if compile_step is not None else opt.step
    torch.manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = None
        model(torch.randn(3, 6)).square().sum().backward()
        step()
        if sched is not None:
            sched.step()
    return params, opt


def _assert_same(expected, got, atol: float = 1e-5) -> None:
    (p_ref, opt_ref), (p_got, opt_got) = expected, got
    for a, b in zip(p_ref, p_got):
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-4)
    assert len(opt_ref.state) == len(opt_got.state)
    for (key_ref, s_ref), (key_got, s_got) in zip(opt_ref.state.items(), opt_got.state.items()):
        assert sorted(s_ref) == sorted(s_got)
        for name in s_ref:
            if isinstance(s_ref[name], torch.Tensor):
                assert s_ref[name].dtype == s_got[name].dtype and s_ref[name].device == s_got[name].device
                torch.testing.assert_close(s_got[name], s_ref[name], atol=atol, rtol=1e-4)
            else:
                assert s_got[name] == s_ref[name]


def _kiln(backend: str = "eager"):
    def compile_step(step):
        return kiln.compile(step, backend=backend)
    return compile_step


def _torch_compile_frames(make_opt, steps: int = 3, scheduler=None) -> int:
    """How many graphs the real torch.compile (backend="eager") compiles over the same steps."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler function ... will be ignored"
        _train(make_opt, lambda step: torch.compile(step, backend=counter), steps, scheduler)
    torch._dynamo.reset()
    return counter.frame_count


OPTIMIZERS = {
    "adam": lambda p: O.Adam(p, lr=0.01),
    "adamw": lambda p: O.AdamW(p, lr=0.01, weight_decay=0.1),
    "adam_amsgrad_maximize": lambda p: O.Adam(p, lr=0.01, amsgrad=True, maximize=True, weight_decay=0.05),
    "adam_foreach": lambda p: O.Adam(p, lr=0.01, foreach=True),
    "adamw_foreach_amsgrad": lambda p: O.AdamW(p, lr=0.01, foreach=True, amsgrad=True),
    "adam_fused": lambda p: O.Adam(p, lr=0.01, fused=True),
    "adamw_fused": lambda p: O.AdamW(p, lr=0.01, fused=True),
    "sgd": lambda p: O.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: O.SGD(p, lr=0.05, momentum=0.9),
    "sgd_nesterov": lambda p: O.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_momentum_foreach": lambda p: O.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, foreach=True),
    "sgd_fused": lambda p: O.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "adagrad": lambda p: O.Adagrad(p, lr=0.05, lr_decay=0.01),
    "adagrad_foreach": lambda p: O.Adagrad(p, lr=0.05, foreach=True),
    "rmsprop": lambda p: O.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "rmsprop_foreach": lambda p: O.RMSprop(p, lr=0.01, foreach=True),
    "adam_tensor_lr": lambda p: O.Adam(p, lr=torch.tensor(0.01)),
    "adamw_groups": lambda p: O.AdamW([{"params": p[:2], "lr": 0.1, "weight_decay": 0.0},
                                       {"params": p[2:], "betas": (0.8, 0.9)}], lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_matches_eager(name):
    make = OPTIMIZERS[name]
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        got = _train(make, _kiln())
    _assert_same(_train(make), got)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0
    if "fused" not in name:
        # one graph per step: the first compile, and for SGD with momentum a second one once the
        # momentum buffers exist (torch.compile recompiles there too); no break anywhere
        assert stats["graph_breaks"] == 0
        assert stats["compiles"] == (2 if name.startswith("sgd_") else 1)
        assert stats["graphs"] == stats["compiles"]


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd_momentum", "sgd_momentum_foreach", "adam_foreach",
                                  "adamw_foreach_amsgrad", "rmsprop"])
def test_no_more_compiles_than_torch_compile(name):
    make = OPTIMIZERS[name]
    expected = _torch_compile_frames(make)
    kiln.reset()
    _train(make, _kiln())
    assert kiln.stats()["compiles"] <= expected
    # and after torch.compile patched the optimizer classes (its disable wrapper on _init_group)
    assert getattr(type(make([nn.Parameter(torch.ones(1))]))._init_group, "_torchdynamo_disable", False)
    kiln.reset()
    _train(make, _kiln())
    assert kiln.stats()["compiles"] <= expected and kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("name", ["adamw", "adam_foreach", "sgd_nesterov"])
def test_compiled_step_through_aot(name, backend):
    make = OPTIMIZERS[name]
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        got = _train(make, _kiln(backend))
    _assert_same(_train(make), got)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0


def test_float_lr_scheduler_recompiles_once_as_torch_compile():
    def make(p):
        return O.Adam(p, lr=0.01)

    def scheduler(opt):
        return O.lr_scheduler.StepLR(opt, 1, 0.5)

    expected = _torch_compile_frames(make, steps=5, scheduler=scheduler)
    kiln.reset()
    got = _train(make, _kiln(), steps=5, scheduler=scheduler)
    _assert_same(_train(make, steps=5, scheduler=scheduler), got)
    # the lr changes every step: recompiled once with the lr as a symbol, then reused
    assert kiln.stats()["compiles"] == 2 <= expected and kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_tensor_lr_scheduler_never_recompiles(backend):
    def make(p):
        return O.AdamW(p, lr=torch.tensor(0.01))

    def scheduler(opt):
        return O.lr_scheduler.ExponentialLR(opt, 0.5)

    kiln.reset()
    got = _train(make, _kiln(backend), steps=4, scheduler=scheduler)
    _assert_same(_train(make, steps=4, scheduler=scheduler), got)
    assert kiln.stats()["compiles"] == 1 and kiln.stats()["recompiles"] == 0


def test_state_initialised_by_the_first_compiled_call():
    """`_init_group` runs for real while tracing: the state exists after the first call, holds
    eager's tensors (the step counter a float32 CPU scalar) and the second call reuses the graph."""
    kiln.reset()
    model = _model()
    opt = O.Adam(model.parameters(), lr=0.01)
    step = kiln.compile(opt.step, backend="eager")
    model(torch.randn(2, 6)).sum().backward()
    step()
    state = opt.state[model[0].weight]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
    assert state["step"].dtype == torch.float32 and state["step"].device.type == "cpu"
    assert float(state["step"]) == 1.0
    step()
    assert float(state["step"]) == 2.0 and kiln.stats()["compiles"] == 1


def test_gradient_appearing_or_vanishing_recompiles():
    kiln.reset()
    model = _model()
    params = list(model.parameters())
    opt = O.SGD(params, lr=0.1)
    step = kiln.compile(opt.step, backend="eager")
    model(torch.randn(2, 6)).sum().backward()
    params[0].grad = None  # skipped by this step
    before = params[0].detach().clone()
    step()
    assert torch.equal(params[0], before)
    model(torch.randn(2, 6)).sum().backward()
    expected = params[0].detach() - 0.1 * params[0].grad
    step()
    torch.testing.assert_close(params[0].detach(), expected)
    assert kiln.stats()["recompiles"] == 1


def test_state_cleared_between_steps_is_seen():
    """The guards read each parameter's state entry: a cleared state (load_state_dict of a fresh
    optimizer) makes the next call initialise it again, as eager does."""
    make = OPTIMIZERS["adam"]
    kiln.reset()
    params, opt = _train(make, _kiln(), steps=2)
    ref_params, ref_opt = _train(make, steps=2)
    for o in (opt, ref_opt):
        o.state.clear()
    for ps, o in ((params, opt), (ref_params, ref_opt)):
        for p in ps:
            if p.requires_grad:
                p.grad = torch.ones_like(p)
    kiln.compile(opt.step, backend="eager")()
    ref_opt.step()
    _assert_same((ref_params, ref_opt), (params, opt))


def test_step_and_zero_grad_in_one_compiled_function():
    """zero_grad is one of the functions torch marks with its own disable: a graph break, run
    natively, as torch.compile does; the step before it stays one graph."""
    model = _model()
    opt = O.AdamW(model.parameters(), lr=0.01)

    def train_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    kiln.reset()
    compiled = kiln.compile(train_step, backend="eager")
    for _ in range(3):
        model(torch.randn(2, 6)).sum().backward()
        compiled()
        assert all(p.grad is None for p in model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    explained = kiln.explain(train_step)()
    assert explained.graph_count == 1
    assert [r.reason for r in explained.break_reasons] == \
        ["Optimizer.zero_grad is marked kiln.disable (or torch's disable)"]
    assert kiln.compile(opt.zero_grad) == opt.zero_grad  # compiling it gives it back, as torch does


# ------------------------------------------------------------------------------- the pieces


def test_grad_read_is_a_graph_input():
    def f(w):
        if w.grad is None:
            return w * 0
        return w - 0.1 * w.grad

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    w = torch.ones(3, requires_grad=True)
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(compiled(w), w * 0)
        w.grad = torch.full((3,), 2.0)
        torch.testing.assert_close(compiled(w), w - 0.2)  # the None guard fails: recompiled
        w.grad = torch.full((3,), 4.0)
        torch.testing.assert_close(compiled(w), w - 0.4)  # the new grad is read, not baked in
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["compiles"] == 2


def test_grad_assignment_is_replayed_after_the_graph():
    def f(w, g):
        w.grad = g * 2
        seen = w.grad  # the trace sees its own assignment
        return seen + 1

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    w, g = torch.zeros(3, requires_grad=True), torch.arange(3.0)
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(compiled(w, g), g * 2 + 1)
    torch.testing.assert_close(w.grad, g * 2)

    def clear(w):
        w.grad = None
        return w + 1

    compiled = kiln.compile(clear, backend="eager")
    compiled(w)
    assert w.grad is None and kiln.stats()["graph_breaks"] == 0


def test_grad_assignment_that_eager_refuses_raises_as_eager():
    def f(w):
        w.grad = torch.zeros(5)  # wrong size: eager raises at the assignment
        return w

    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(RuntimeError, match="grad"):
        f(torch.zeros(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="grad"):
        compiled(torch.zeros(3, requires_grad=True))


def test_foreach_in_place_ops_are_kept_in_the_graph():
    """An in-place foreach op returns None: it must not be dropped as dead code."""
    def f(xs, ys):
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_add_(xs, ys, alpha=0.5)
        torch._foreach_zero_(ys)
        return None

    for backend in ("eager", "aot_eager"):
        kiln.reset()
        xs, ys = [torch.ones(3), torch.ones(2, 2)], [torch.arange(3.0), torch.ones(2, 2)]
        with kiln.config.patch(suppress_errors=False):
            kiln.compile(f, backend=backend)(xs, ys)
        torch.testing.assert_close(xs, [2 + 0.5 * torch.arange(3.0), torch.full((2, 2), 2.5)])
        assert all(not y.any() for y in ys)
        assert kiln.stats()["graphs"] == 1


def test_foreach_with_tensor_scalars_traced_per_tensor():
    def f(ps, ts, us, scalars, other):
        torch._foreach_addcdiv_(ps, ts, us, scalars)
        out = torch._foreach_mul(ts, other)
        torch._foreach_add_(ps, out, alpha=2)
        return out

    def args():
        torch.manual_seed(0)
        return ([torch.randn(3), torch.randn(2, 2)], [torch.randn(3), torch.randn(2, 2)],
                [torch.rand(3) + 1, torch.rand(2, 2) + 1], torch.tensor([0.5, -2.0]), torch.tensor(3.0))

    expected_args = args()
    expected = f(*expected_args)
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        got_args = args()
        with kiln.config.patch(suppress_errors=False):
            got = kiln.compile(f, backend=backend)(*got_args)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(got_args[0], expected_args[0])
        assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("method", ["addcdiv_", "addcmul_", "add_", "sub"])
def test_tensor_valued_scalar_arguments_stay_in_the_graph(method):
    def f(p, a, b, scale):
        key = "alpha" if method in ("add_", "sub") else "value"
        args = (a,) if key == "alpha" else (a, b)
        return getattr(p, method)(*args, **{key: -scale * 2})

    def args():
        torch.manual_seed(0)
        return torch.randn(4), torch.randn(4), torch.rand(4) + 1, torch.tensor(0.25)

    expected = f(*args())
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        got = kiln.compile(f, backend="eager")(*args())
    torch.testing.assert_close(got, expected)
    assert kiln.stats()["graph_breaks"] == 0


def test_profiler_range_is_left_out_of_the_graph():
    def f(x):
        with torch.profiler.record_function("my_range"):
            y = x.sin()
        with torch.autograd.profiler.record_function("other"):
            return y.cos()

    kiln.reset()
    x = torch.randn(4)
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["graphs"] == 1


def test_graph_break_inside_a_profiler_range():
    log = []

    def f(x):
        with torch.profiler.record_function("r"):
            y = x + 1
            log.append(y.sum().item())  # a break inside the range
            z = y * 2
        return z

    kiln.reset()
    x = torch.ones(3)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
    assert log == [6.0, 6.0] and kiln.stats()["fallbacks"] == 0


def test_torch_disable_marks_are_graph_breaks():
    calls = []

    @torch.compiler.disable
    def native(x):
        calls.append(torch.compiler.is_compiling())
        return x + 1

    @torch._disable_dynamo
    def lazily_disabled(x):
        calls.append(torch.compiler.is_compiling())
        return x * 2

    def f(x):
        return lazily_disabled(native(x.sin())).cos()

    kiln.reset()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
    assert calls == [False, False, False, False]  # both ran natively, never traced
    assert kiln.stats()["graph_breaks"] == 2
    assert kiln.compile(native) is native


def test_typing_subscripts_are_constants():
    def f(xs, flag):
        ys = typing.cast(list[torch.Tensor], xs)
        table = typing.cast(typing.Dict[str, typing.Optional[int]], {"a": 1})
        kind = collections.OrderedDict[str, int]
        return ys[0] * table["a"] + (1 if flag else 0), kind.__origin__ is collections.OrderedDict

    kiln.reset()
    xs = [torch.ones(2)]
    with kiln.config.patch(suppress_errors=False):
        got = kiln.compile(f, backend="eager")(xs, True)
    assert got[1] is True
    torch.testing.assert_close(got[0], torch.full((2,), 2.0))
    assert kiln.stats()["graph_breaks"] == 0


def test_weakref_call_reads_the_referent():
    import weakref

    class Holder:
        def __init__(self, scale):
            self.scale = scale

    holder = Holder(3.0)
    ref = weakref.ref(holder)

    def f(x):
        return x * ref().scale

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), x * 3)
    holder.scale = 5.0
    torch.testing.assert_close(compiled(x), x * 5)  # read through its source, guarded
    assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.cpp
@pytest.mark.parametrize("name", ["adam_fused", "sgd_fused"])
def test_fused_step_makes_no_graph_as_torch_compile(name):
    """The fused CPU kernels (torch._fused_adam_ ...) run natively: torch.compile makes no graph of
    such a step, nor does Kiln (its frames break around the fused call, none falls back)."""
    make = OPTIMIZERS[name]
    expected = _torch_compile_frames(make)
    kiln.reset()
    got = _train(make, _kiln("inductor"))
    _assert_same(_train(make), got)
    assert kiln.stats()["graphs"] <= expected and kiln.stats()["fallbacks"] == 0
