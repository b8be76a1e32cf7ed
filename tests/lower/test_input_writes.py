"""Mutated inputs' new values computed in the inputs' own storage (memory.input_writes, INPUT_UPDATES).

An inference graph's AOT runtime used to copy each mutated input's new value back after the call:
a compiled optimizer step allocated a fresh buffer per parameter and state tensor, then copied it
(twice the memory traffic of eager's in-place ops, and 12x eager's peak memory). Now the wrapper
writes such a value straight into the input when nothing reads the input's old value afterwards.

Checked at both levels: the lowering on hand-made functional graphs (where it must and must not
write in place: a transposed or reduced read, a second output of the same buffer, the input also
returned), and kiln.compile on user functions against eager (reads before and after the mutation,
two mutated inputs, a partial update, an input view passed beside its base, the version counter a
backward checks).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.lower import compile_graph
from kiln.runtime.aot import INPUT_UPDATES

from .conftest import aten_graph

pytestmark = pytest.mark.cpp


def _compiled(fn, *args, updates):
    gm, examples = aten_graph(fn, *args)
    gm.meta[INPUT_UPDATES] = updates
    return compile_graph(gm, examples)


def _run(fn, args, updates):
    """(outputs of the compiled graph on copies of args, those copies, eager's outputs)."""
    compiled = _compiled(fn, *args, updates=updates)
    copies = [a.clone() for a in args]
    got = compiled(*copies)
    expected = fn(*[a.clone() for a in args])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    return compiled, got, copies


def test_a_new_value_is_computed_in_the_input_storage():
    def step(p, g, m):
        m_new = m * 0.9 + g
        return p - 0.1 * m_new, m_new

    args = [torch.randn(16, 8) for _ in range(3)]
    compiled, got, copies = _run(step, args, ((0, 0), (1, 2)))
    # p is read only where its new value is stored; m's new value may be recomputed from m by
    # p's update in the same loop body after that store, so m may keep its copy-back
    assert got[0] is copies[0]
    assert compiled.wrapper_source.count("computed in its storage") == 1 + (got[1] is copies[2])


def test_a_scalar_and_a_bias_beside_a_matrix():
    def step(w, b, s, gw, gb):
        s_new = s + 1
        return w - gw / s_new, b - gb / s_new, s_new

    args = [torch.randn(6, 4), torch.randn(4), torch.tensor(2.0), torch.randn(6, 4), torch.randn(4)]
    _, got, copies = _run(step, args, ((0, 0), (1, 1), (2, 2)))
    assert got[0] is copies[0] and got[1] is copies[1]


@pytest.mark.parametrize("why, fn, updates", [
    ("read transposed", lambda x: (x.t() + 1,), ((0, 0),)),
    ("read by a reduction in the same kernel's later block", lambda x: (x - x.sum(), ), ((0, 0),)),
    ("read after its new value", lambda x, y: (x * 2, x.sum(0) + y), ((0, 0),)),
    ("the new value also a user output", lambda x: ((x + 1),) * 2, ((0, 0),)),
    ("the input returned too", lambda x: (x + 1, x), ((0, 0),)),
])
def test_the_storage_is_not_written_when(why, fn, updates):
    args = [torch.randn(5, 5)] + ([torch.randn(5)] if fn.__code__.co_argcount == 2 else [])
    _, got, copies = _run(fn, args, updates)
    old = args[0]
    if got[0] is copies[0]:
        # written in place only where that is right: the other outputs still saw the old value
        assert why in ("read by a reduction in the same kernel's later block",), why
    else:
        torch.testing.assert_close(copies[0], old)  # untouched: the runtime copies after the call


# ------------------------------------------------------------------- through kiln.compile


def _mul_add(x, y):
    x.mul_(2).add_(y)
    return x.sum()


def _read_before_and_after(x, y):
    before = x * 2
    x.add_(1)
    return before + x, y.sum()


def _two_mutated(x, y):
    x.add_(y)
    y.mul_(x)
    return x + y


def _transposed(x, y):
    x.copy_(x.t() + y)
    return x


def _centered(x, y):
    x.sub_(x.mean()).mul_(y)
    return None


def _partial(x, y):
    x[1:].add_(y[1:])
    return x[0] * 1


def _scalar_counter(x, y):
    y[0].add_(1)
    x.addcdiv_(x, y[0:1], value=-0.5)
    return None


@pytest.mark.parametrize("fn", [_mul_add, _read_before_and_after, _two_mutated, _transposed, _centered,
                                _partial, _scalar_counter])
def test_mutating_functions_match_eager(fn):
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    torch.manual_seed(0)
    for _ in range(3):
        x, y = torch.randn(4, 4), torch.rand(4, 4) + 0.5
        x2, y2 = x.clone(), y.clone()
        got, expected = compiled(x, y), fn(x2, y2)
        torch.testing.assert_close(x, x2)
        torch.testing.assert_close(y, y2)
        if expected is not None:
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expected if isinstance(expected, tuple) else (expected,)):
                torch.testing.assert_close(g, e)
    assert kiln.stats()["fallbacks"] == 0


def _reads_a_view_then_mutates(a, b):
    c = b + 1
    a.mul_(2)
    return c


@pytest.mark.parametrize("make", [
    lambda a: (a, a[2:6]),
    lambda a: (a[2:6], a),
    lambda a: (a, a.view(2, 4)[1]),
], ids=["base_first", "view_first", "reshaped_view"])
def test_a_view_passed_beside_its_mutated_base_reads_the_old_values(make):
    """The graph reads `b` before `a` changes; `b` shares `a`'s storage: the runtime must not let the
    kernel that computes a's new value in place run before the read (it computes into a copy)."""
    kiln.reset()
    compiled = kiln.compile(_reads_a_view_then_mutates, backend="inductor")
    for _ in range(2):
        a, b = make(torch.arange(8.0))
        a2, b2 = make(torch.arange(8.0))
        torch.testing.assert_close(compiled(a, b), _reads_a_view_then_mutates(a2, b2))
        torch.testing.assert_close(a, a2)


def test_the_version_counter_moves_as_in_eager():
    """A tensor saved for a backward and then changed in place by the compiled function: backward
    refuses, as it does after eager's in-place op (the runtime bumps the version it skipped copying)."""
    def scale(p):
        p.mul_(2)

    compiled = kiln.compile(scale, backend="inductor")
    for fn in (scale, compiled):
        w = torch.ones(3, requires_grad=True)
        p = torch.ones(3)
        loss = (w * p).sum()
        before = p._version
        fn(p)
        assert p._version > before
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_compiled_optimizer_step_allocates_nothing(name):
    """Two Linear layers: after warm-up a step makes no tensor and copies none (but the foreach
    path's 0-d step counters, which the update reads again after counting), runs no foreach op as
    an ATen call, and every parameter and state tensor keeps its storage; values are eager's."""
    make = OPTIMIZERS[name]
    torch.manual_seed(0)
    params = [p for _ in range(2) for p in nn.Linear(32, 32).parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make(params)
    ref_params = [p.detach().clone() for p in params]
    ref_opt = make(ref_params)
    for p, r in zip(params, ref_params):
        r.grad = p.grad.clone()
    kiln.reset()
    step = kiln.compile(opt.step, backend="inductor")
    for _ in range(3):
        step()
        ref_opt.step()

    def tensors(o, ps):
        return [t for p in ps for t in (p, *(v for v in o.state[p].values() if torch.is_tensor(v)))]

    before = [t.data_ptr() for t in tensors(opt, params)]
    with torch.profiler.profile(record_shapes=True) as prof:
        step()
    ref_opt.step()
    made = [(e.name, e.input_shapes) for e in prof.events()
            if e.name == "aten::copy_" and e.input_shapes[0] != [] or e.name.startswith("aten::_foreach")
            or e.name.startswith("aten::empty") and e.input_shapes[0] not in ([], [0])]
    assert made == [], made
    assert [t.data_ptr() for t in tensors(opt, params)] == before
    for got, expected in zip(tensors(opt, params), tensors(ref_opt, ref_params)):
        torch.testing.assert_close(got, expected)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["recompiles"] == (1 if "sgd" in name else 0)


@pytest.mark.parametrize("method", ["add", "sub", "rsub"])
def test_a_symbolic_alpha_stays_in_the_kernel(method):
    """`p.add(buf, alpha=-lr)` with an lr that changes (a symbol): lowered as a kernel operand, not
    an ATen call beside the kernel (which also kept the parameter from being updated in place)."""
    def update(p, buf, lr):
        return getattr(torch, method)(p, buf, alpha=-lr)

    kiln.reset()
    compiled = kiln.compile(update, backend="inductor")
    p, buf = torch.randn(4, 4), torch.randn(4, 4)
    for lr in (0.1, 0.2, 0.3):
        torch.testing.assert_close(compiled(p, buf, lr), update(p, buf, lr))
    assert kiln.stats()["compiles"] == 2  # the second with lr a symbol
    with torch.profiler.profile() as prof:
        got = compiled(p, buf, 0.4)
    torch.testing.assert_close(got, update(p, buf, 0.4))
    names = [e.name for e in prof.events()]
    assert f"aten::{method}" not in names, names


def test_batch_norm_running_statistics_under_no_grad():
    """A train-mode BatchNorm run under no_grad: an inference graph whose mutated inputs are the
    module's buffers (running mean and variance, the batch count, a cumulative average too)."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4, momentum=None))
    reference = copy.deepcopy(model)
    kiln.reset()
    compiled = kiln.compile(model, backend="inductor")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 8, 8)
            torch.testing.assert_close(compiled(x), reference(x))
    for (name, got), (_, expected) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(got, expected, msg=name)
    assert kiln.stats()["fallbacks"] == 0
