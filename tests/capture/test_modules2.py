"""nn.Module patterns where Kiln made more graphs than torch.compile, each compared with eager over
several calls (values, the module's state after each call, later calls) under the eager and aot_eager
backends, and its graph count with the real torch.compile's (backend counting graphs):

- a container or submodule built in forward and kept (`self.layers = nn.ModuleList([...])`, a
  Sequential rebuilt on each call, one returned): the container could not be rebuilt after the
  graph, so the whole frame ran eagerly; the glue now builds it as eager does, around its children.
- torch.func.jacrev / jacfwd over a module's functional_call: each call of the transform was a
  graph break, no graph; now one node that runs the transform over the traced function.
- torch.compiler.disable on a submodule's forward: the native call of the module compiled the
  disable wrapper as a frame of its own (its callees were compiled too, 3 graphs where torch.compile
  makes 2); a disabled forward now runs as it is.
- an exception raised after a module-state mutation: Kiln compiles one graph per value of the int
  counter, as torch.compile does without the raise (torch.compile gives up on the frame for good
  after the raise, hence its lower count); the values and state must equal eager's.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

import kiln
from semantics_oracle import same


def d(t: Any) -> Any:
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def X(*s: int) -> torch.Tensor:
    return torch.randn(*s)


def _observe(program: Callable, C: Callable) -> tuple:
    torch.manual_seed(0)
    try:
        return ("ok", program(C))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc), str(exc))


# a write to a container built in the frame, or a change of its children, is not followed by the glue:
# the frame runs eagerly (eager's values, counted as a fallback)
RUN_EAGERLY: set[str] = set()


def _compare(program: Callable, backend: str) -> int:
    want = _observe(program, lambda obj, **options: obj)
    kiln.reset()
    counting = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    got = _observe(program, lambda obj, **options: kiln.compile(obj, backend=counting, **options))
    assert got[0] == want[0], (got, want)
    assert same(got, want), f"compiled {got!r}\neager {want!r}"
    if program.__name__ not in RUN_EAGERLY:
        assert kiln.stats()["fallbacks"] == 0, kiln.stats()
    return counting.frame_count


def _dynamo_count(program: Callable) -> int:
    import torch._dynamo

    counting = kiln.backends.CountingBackend()
    torch._dynamo.reset()
    try:
        _observe(program, lambda obj, **options: torch.compile(obj, backend=counting, **options))
    finally:
        torch._dynamo.reset()
    return counting.frame_count


# ------------------------------------------------------------------ 1. containers built in forward, kept
def modulelist_built_once(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "layers"):
                s.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
            for layer in s.layers:
                x = layer(x)
            return x
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [len(m.layers), sorted(k for k, _ in m.named_parameters()), d(m.layers[1].weight)]


def sequential_rebuilt_each_call(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4)

        def forward(s, x):
            s.seq = nn.Sequential(s.a, nn.ReLU())
            return s.seq(x)
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x))]
    first = m.seq
    with torch.no_grad():
        m.a.bias.fill_(0.5)  # the next call's container holds the same submodule, changed
    out.append(d(cm(x)))
    return out + [m.seq is first, m.seq[0] is m.a, type(m.seq[1]).__name__, list(m.seq._modules)]


def sequential_of_two_submodules_kept(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 2)

        def forward(s, x):
            if getattr(s, "both", None) is None:
                s.both = nn.Sequential(s.a, s.b)
            return s.both(x).sum(1)
    m = M(); cm = C(m); x = X(3, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [m.both[0] is m.a, m.both[1] is m.b, sorted(dict(m.named_modules()))]


def modulelist_returned(C):
    def f(x):
        ml = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
        for layer in ml:
            x = layer(x)
        return x, ml
    cf = C(f); x = X(2, 4)
    y, ml = cf(x)
    return [d(y), len(ml), type(ml[1]).__name__, d(ml[0](x))]


def submodules_returned_in_a_list_container(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Tanh()

        def forward(s, x):
            return s.a(x), nn.ModuleList([s.b, s.a])
    m = M(); cm = C(m); x = X(2, 4)
    y, ml = cm(x)
    y2, ml2 = cm(x)
    return [d(y), d(y2), ml[1] is m.a, ml[0] is m.b, ml is ml2]


def linear_built_once_used_later(C):
    class M(nn.Module):
        def forward(s, x):
            if getattr(s, "sub", None) is None:
                s.sub = nn.Linear(4, 3)
            return s.sub(x).relu()
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    cm(x).sum().backward()
    return out + [d(m.sub.weight), d(m.sub.weight.grad)]


def tensor_cache_dict_kept(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.lin = nn.Linear(4, 4)

        def forward(s, x):
            y = s.lin(x)
            s.cache = {"y": y, "n": x.shape[0]}
            return y * 2
    m = M(); cm = C(m); out = []
    for i in range(3):
        out += [d(cm(X(2, 4) + i)), d(m.cache["y"]), m.cache["n"]]
    return out


def tensor_list_grown_each_call(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "hist"):
                s.hist = []
            s.hist.append(x * 2)
            return x + len(s.hist)
    m = M(); cm = C(m)
    out = [d(cm(X(2, 4))) for _ in range(3)]
    return out + [len(m.hist), [d(t) for t in m.hist]]


def moduledict_built_once(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "heads"):
                s.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
            return s.heads["a"](x) + s.heads["b"](x)
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(3)]
    return out + [sorted(m.heads.keys()), d(m.heads["a"].weight)]


def built_container_switched_to_eval_kept(C):
    # a write to the built container (its training flag): not rebuilt by the glue, the call still eager's
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.drop = nn.Dropout(0.5)

        def forward(s, x):
            s.seq = nn.Sequential(s.a, s.drop)
            s.seq.training = False
            return s.seq(x)
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [m.seq.training, m.seq[1].training, m.seq[0] is m.a]


def built_modulelist_appended_then_kept(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)

        def forward(s, x):
            s.ml = nn.ModuleList([s.a])
            s.ml.append(s.b)
            for layer in s.ml:
                x = layer(x)
            return x
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [len(m.ml), m.ml[1] is m.b]


def built_container_under_no_grad(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4)

        def forward(s, x):
            s.seq = nn.Sequential(s.a, nn.GELU())
            return s.seq(x)
    m = M(); cm = C(m); x = X(2, 4)
    with torch.no_grad():
        a = cm(x)
    b = cm(x)
    b.sum().backward()
    return [d(a), d(b), a.requires_grad, b.requires_grad, d(m.a.weight.grad), m.seq[0] is m.a]


CONTAINERS = [modulelist_built_once, sequential_rebuilt_each_call, sequential_of_two_submodules_kept,
              modulelist_returned, submodules_returned_in_a_list_container, linear_built_once_used_later,
              tensor_cache_dict_kept, tensor_list_grown_each_call, moduledict_built_once,
              built_container_switched_to_eval_kept, built_modulelist_appended_then_kept,
              built_container_under_no_grad]


# ------------------------------------------------------------------ 2. jacrev / jacfwd over functional_call
def _linear_params(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in m.named_parameters()}


def jacrev_over_params(C):
    m = nn.Linear(3, 2); params = _linear_params(m)

    def f(params, x):
        return torch.func.jacrev(lambda p: torch.func.functional_call(m, p, (x,)))(params)
    cf = C(f); out = []
    for _ in range(2):
        j = cf(params, X(4, 3))
        out += [d(j["weight"]), d(j["bias"])]
    return out


def jacfwd_over_params(C):
    m = nn.Linear(3, 2); params = _linear_params(m)

    def f(params, x):
        return torch.func.jacfwd(lambda p: torch.func.functional_call(m, p, (x,)), argnums=0)(params)
    cf = C(f); j = cf(params, X(4, 3)); j2 = cf(params, X(4, 3))
    return [d(j["weight"]), d(j["bias"]), d(j2["weight"])]


def jacrev_over_input_with_aux(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    params = _linear_params(m)

    def f(x):
        def g(y):
            out = torch.func.functional_call(m, params, (y,))
            return out, out.sum()
        return torch.func.jacrev(g, has_aux=True)(x)
    cf = C(f)
    (j, aux), (j2, aux2) = cf(X(3)), cf(X(3))
    return [d(j), d(aux), d(j2), d(aux2)]


def jacfwd_two_argnums(C):
    m = nn.Linear(3, 2)

    def f(w, b, x):
        return torch.func.jacfwd(lambda w, b: torch.func.functional_call(m, {"weight": w, "bias": b}, (x,)),
                                 argnums=(0, 1))(w, b)
    cf = C(f)
    jw, jb = cf(m.weight.detach(), m.bias.detach(), X(2, 3))
    return [d(jw), d(jb)]


def jacrev_in_module_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.inner = nn.Linear(3, 3)

        def forward(s, x):
            j = torch.func.jacrev(lambda y: s.inner(y).sin())(x)
            return j.sum(0) * 2
    m = M(); cm = C(m)
    return [d(cm(X(3))) for _ in range(2)]


def jacrev_result_through_backward(C):
    w = torch.randn(3, 3, requires_grad=True)

    def f(x):
        return torch.func.jacrev(lambda y: (w @ y).tanh())(x).sum()
    cf = C(f); x = X(3)
    loss = cf(x); loss.backward()
    return [d(loss), d(w.grad)]


def jacrev_chunked(C):
    # chunk_size passed to the transform by the graph's node
    m = nn.Linear(3, 2); params = _linear_params(m)

    def f(params, x):
        return torch.func.jacrev(lambda p: torch.func.functional_call(m, p, (x,)), chunk_size=1)(params)
    j = C(f)(params, X(4, 3))
    return [d(j["weight"]), d(j["bias"])]


def jacrev_function_returned(C):
    def f(x):
        return torch.func.jacrev(torch.sin), x * 2
    jf, y = C(f)(X(3))
    return [d(y), d(jf(torch.ones(3)))]


JACOBIANS = [jacrev_over_params, jacfwd_over_params, jacrev_over_input_with_aux, jacfwd_two_argnums,
             jacrev_in_module_forward, jacrev_result_through_backward, jacrev_chunked, jacrev_function_returned]


# ------------------------------------------------------------------ 4. torch.compiler.disable on a submodule
class _Inner(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(4, 4)

    def forward(s, x):
        return s.l(x).sin()


class _DisabledForward(_Inner):
    @torch.compiler.disable
    def forward(s, x):
        return s.l(x).sin()


class _Outer(nn.Module):
    def __init__(s, inner: nn.Module):
        super().__init__(); s.a = nn.Linear(4, 4); s.inner = inner; s.b = nn.Linear(4, 4)

    def forward(s, x):
        return s.b(s.inner(s.a(x)).relu())


def disabled_forward_decorator(C):
    m = _Outer(_DisabledForward()); cm = C(m)
    return [d(cm(X(2, 4))) for _ in range(3)]


def disabled_module_instance(C):
    m = _Outer(torch.compiler.disable(_Inner())); cm = C(m)
    return [d(cm(X(2, 4))) for _ in range(3)]


def kiln_disabled_forward(C):
    class Inner(_Inner):
        @kiln.disable
        def forward(s, x):
            return s.l(x).cos()
    m = _Outer(Inner()); cm = C(m)
    return [d(cm(X(2, 4))) for _ in range(2)]


def disabled_forward_with_hook(C):
    inner = _DisabledForward(); calls = []
    inner.register_forward_hook(lambda mod, args, out: calls.append(out.shape))
    m = _Outer(inner); cm = C(m)
    out = [d(cm(X(2, 4))) for _ in range(2)]
    return out + [calls]


def disabled_forward_backward(C):
    m = _Outer(_DisabledForward()); cm = C(m); x = X(2, 4)
    cm(x).sum().backward()
    return [d(p.grad) for p in m.parameters()]


def disabled_forward_mutates_state(C):
    class Inner(_Inner):
        @torch.compiler.disable
        def forward(s, x):
            s.calls = getattr(s, "calls", 0) + 1
            return s.l(x) * s.calls
    m = _Outer(Inner()); cm = C(m)
    out = [d(cm(X(2, 4))) for _ in range(3)]
    return out + [m.inner.calls]


DISABLED = [disabled_forward_decorator, disabled_module_instance, kiln_disabled_forward,
            disabled_forward_with_hook, disabled_forward_backward, disabled_forward_mutates_state]


def test_disabled_forward_is_not_compiled() -> None:
    # the disabled forward's body (sin) must be in no graph: it ran compiled as a frame of its own
    kiln.reset()
    counting = kiln.backends.CountingBackend()
    m = _Outer(_DisabledForward())
    cm = kiln.compile(m, backend=counting)
    for _ in range(2):
        cm(X(2, 4))
    targets = [str(n.target) for g in counting.graphs for n in g.graph.nodes]
    assert not any("sin" in t for t in targets), targets
    assert counting.frame_count == 2


# ------------------------------------------------------------------ grad modes and dynamic=True
def jacfwd_of_jacrev_nested(C):
    w = torch.randn(3, 3)
    def f(x):
        return torch.func.jacfwd(torch.func.jacrev(lambda y: (w @ y).sin().sum()))(x)
    cf = C(f); return [d(cf(X(3))), d(cf(X(3)))]

def jacrev_under_no_grad(C):
    m = nn.Linear(3, 2); params = {k: v.detach() for k, v in m.named_parameters()}
    def f(p, x):
        with torch.no_grad():
            return torch.func.jacrev(lambda q: torch.func.functional_call(m, q, (x,)))(p)["weight"]
    cf = C(f); return [d(cf(params, X(4, 3)))]

def jacrev_of_inference_input(C):
    m = nn.Linear(3, 2); params = {k: v.detach() for k, v in m.named_parameters()}
    def f(p, x):
        return torch.func.jacrev(lambda q: torch.func.functional_call(m, q, (x,)))(p)["weight"]
    cf = C(f)
    with torch.inference_mode():
        x = X(4, 3)
    return [d(cf(params, x))]

def jacrev_dynamic_true(C):
    m = nn.Linear(3, 2); params = {k: v.detach() for k, v in m.named_parameters()}
    def f(p, x):
        return torch.func.jacrev(lambda q: torch.func.functional_call(m, q, (x,)))(p)["weight"]
    cf = C(f, dynamic=True); return [d(cf(params, X(4, 3))), d(cf(params, X(6, 3)))]

def built_container_dynamic_true(C):
    class M(nn.Module):
        def __init__(s): super().__init__(); s.a = nn.Linear(4, 4)
        def forward(s, x):
            s.seq = nn.Sequential(s.a, nn.ReLU())
            return s.seq(x)
    m = M(); cm = C(m, dynamic=True)
    return [d(cm(X(2, 4))), d(cm(X(5, 4))), m.seq[0] is m.a]

def built_container_under_inference_mode(C):
    class M(nn.Module):
        def __init__(s): super().__init__(); s.a = nn.Linear(4, 4)
        def forward(s, x):
            s.seq = nn.ModuleList([s.a, nn.Tanh()])
            for l in s.seq: x = l(x)
            return x
    m = M(); cm = C(m)
    with torch.inference_mode():
        a = cm(X(2, 4))
    return [d(a), d(cm(X(2, 4))), len(m.seq)]

def disabled_forward_no_grad_and_inference_mode(C):
    m = _Outer(_DisabledForward()); cm = C(m)
    with torch.no_grad():
        a = cm(X(2, 4))
    with torch.inference_mode():
        b = cm(X(2, 4))
    return [d(a), d(b), a.requires_grad]

def batchnorm_cumulative_average_dynamic_true(C):
    m = nn.BatchNorm1d(4, momentum=None); cm = C(m, dynamic=True); out = []
    for i in range(4):
        out += [d(cm(X(6 + i, 4))), d(m.running_var), int(m.num_batches_tracked)]
    return out

def batchnorm_cumulative_average_no_grad_frozen_weight(C):
    m = nn.BatchNorm1d(4, momentum=None); m.weight.requires_grad_(False); cm = C(m); out = []
    with torch.no_grad():
        for i in range(3):
            out += [d(cm(X(6, 4))), d(m.running_mean)]
    return out


MODES = [jacfwd_of_jacrev_nested, jacrev_under_no_grad, jacrev_of_inference_input, jacrev_dynamic_true, built_container_dynamic_true, built_container_under_inference_mode, disabled_forward_no_grad_and_inference_mode, batchnorm_cumulative_average_dynamic_true, batchnorm_cumulative_average_no_grad_frozen_weight]


# ------------------------------------------------------------------ 5. an exception after a state mutation
class _RaiseAfterMutate(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4); s.n = 0; s.register_buffer("b", torch.zeros(4))

    def forward(s, x):
        s.n += 1
        s.b.add_(1)
        if s.n == 2:
            raise RuntimeError("second")
        return s.lin(x) + s.b


def raise_after_counter_and_buffer(C):
    m = _RaiseAfterMutate(); cm = C(m); x = X(2, 4); out = []
    for _ in range(4):
        try:
            out.append(d(cm(x)))
        except RuntimeError as e:
            out.append(str(e))
    return out + [m.n, d(m.b)]


def raise_on_shape_after_buffer_write(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.lin = nn.Linear(4, 4); s.register_buffer("seen", torch.zeros(()))
            s.log: list[int] = []

        def forward(s, x):
            s.seen += x.shape[0]
            s.log.append(x.shape[0])
            if x.shape[0] == 3:
                raise ValueError(f"rows {x.shape[0]}")
            return s.lin(x)
    m = M(); cm = C(m); out = []
    for rows in (2, 3, 2, 3, 2):
        try:
            out.append(d(cm(X(rows, 4))))
        except ValueError as e:
            out.append(str(e))
    return out + [d(m.seen), m.log]


def raise_after_attribute_set(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.lin = nn.Linear(4, 4); s.last = None

        def forward(s, x):
            s.last = s.lin(x)
            if bool((x < -10).any()):
                raise RuntimeError("too small")
            return s.last * 2
    m = M(); cm = C(m); out = []
    for x in (X(2, 4), X(2, 4) - 20, X(2, 4)):
        try:
            out.append(d(cm(x)))
        except RuntimeError as e:
            out.append(str(e))
        out.append(d(m.last))
    return out


# ------------------------------------------------------------------ 3. BatchNorm with momentum=None
def batchnorm1d_cumulative_average(C):
    m = nn.BatchNorm1d(4, momentum=None); cm = C(m); out = []
    for i in range(4):
        out += [d(cm(X(8, 4) * (i + 1))), d(m.running_mean), d(m.running_var), int(m.num_batches_tracked)]
    return out


def batchnorm2d_cumulative_average_in_model(C):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.ReLU()); cm = C(m); out = []
    for _ in range(4):
        out += [d(cm(X(2, 3, 6, 6))), d(m[1].running_mean), d(m[1].running_var), int(m[1].num_batches_tracked)]
    m.eval()
    return out + [d(cm(X(2, 3, 6, 6)))]


def batchnorm_cumulative_average_backward(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None)); cm = C(m); out = []
    for _ in range(3):
        y = cm(X(6, 4)); y.pow(2).sum().backward()
        out += [d(y), d(m[1].running_var), d(m[0].weight.grad)]
    return out


def instance_norm_symbolic_momentum(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.register_buffer("rm", torch.zeros(3)); s.register_buffer("rv", torch.ones(3))
            s.register_buffer("steps", torch.zeros((), dtype=torch.long))

        def forward(s, x):
            s.steps += 1
            factor = 1.0 / float(s.steps)
            return torch.nn.functional.instance_norm(x, s.rm, s.rv, use_input_stats=True, momentum=factor)
    m = M(); cm = C(m); out = []
    for _ in range(4):
        out += [d(cm(X(2, 3, 5))), d(m.rm), d(m.rv)]
    return out


BATCHNORMS = [batchnorm1d_cumulative_average, batchnorm2d_cumulative_average_in_model,
              batchnorm_cumulative_average_backward, instance_norm_symbolic_momentum]


RAISES = [raise_after_counter_and_buffer, raise_on_shape_after_buffer_write, raise_after_attribute_set]

ALL = CONTAINERS + JACOBIANS + DISABLED + BATCHNORMS + MODES + RAISES


# under aot_eager in `make test`: a few programs of each class (the rest in the slow run)
AOT_FAST = {"modulelist_built_once", "sequential_rebuilt_each_call", "built_container_under_no_grad",
            "jacrev_over_params", "jacfwd_two_argnums", "jacrev_result_through_backward",
            "disabled_forward_decorator", "disabled_forward_backward", "batchnorm1d_cumulative_average",
            "batchnorm_cumulative_average_backward", "raise_after_counter_and_buffer"}


def _cases():
    for program in ALL:
        for backend in ("eager", "aot_eager"):
            slow = backend == "aot_eager" and program.__name__ not in AOT_FAST
            yield pytest.param(program, backend, id=f"{program.__name__}-{backend}",
                               marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("program, backend", list(_cases()))
def test_matches_eager(program, backend) -> None:
    _compare(program, backend)


# Kiln's graph count per program under the eager backend, as measured (a change is a regression or a
# gain to look at), and torch.compile's then: Kiln's is no higher for the programs in AT_MOST_DYNAMO,
# which the test checks against the real torch.compile. Where torch.compile's is lower it gave up the
# frame for good (an exception raised in it, float() of num_batches_tracked), or compiled a
# kiln.disable'd forward (which it does not honour), or ran chunk_size jacrev in its graph.
KILN_GRAPHS = {  # name: (Kiln, torch.compile)
    "modulelist_built_once": (2, 2), "sequential_rebuilt_each_call": (2, 2),
    "sequential_of_two_submodules_kept": (2, 2), "modulelist_returned": (1, 1),
    "submodules_returned_in_a_list_container": (1, 1), "linear_built_once_used_later": (2, 2),
    "built_container_under_no_grad": (2, 2),
    "jacrev_over_params": (1, 1), "jacfwd_over_params": (1, 1), "jacrev_over_input_with_aux": (1, 1),
    "jacfwd_two_argnums": (1, 1), "jacrev_in_module_forward": (1, 1), "jacrev_result_through_backward": (1, 1),
    "jacrev_function_returned": (1, 1), "jacrev_chunked": (1, 1),
    "disabled_forward_decorator": (2, 2), "disabled_module_instance": (2, 2), "disabled_forward_with_hook": (2, 2),
    "kiln_disabled_forward": (2, 1),
    # before: 5 graphs over 4 calls (a recompile per value of the momentum); 3 now, as much as
    # automatic dynamic allows: the graph before the break, the resume with 1.0, then a symbolic one
    "batchnorm1d_cumulative_average": (3, 0), "instance_norm_symbolic_momentum": (3, 5),
    # one graph per value of the int counter, as torch.compile compiles the same forward without the raise
    "raise_after_counter_and_buffer": (4, 1),
}
AT_MOST_DYNAMO = ["modulelist_built_once", "sequential_rebuilt_each_call", "modulelist_returned",
                  "jacrev_over_params", "jacfwd_over_params", "disabled_forward_decorator",
                  "instance_norm_symbolic_momentum"]


@pytest.mark.parametrize("name", sorted(KILN_GRAPHS))
def test_graph_count(name) -> None:
    program = next(p for p in ALL if p.__name__ == name)
    assert _compare(program, "eager") == KILN_GRAPHS[name][0]


@pytest.mark.slow  # torch.compile's runs take seconds each
@pytest.mark.parametrize("name", AT_MOST_DYNAMO)
def test_graph_count_against_torch_compile(name) -> None:
    program = next(p for p in ALL if p.__name__ == name)
    assert _compare(program, "eager") <= _dynamo_count(program) == KILN_GRAPHS[name][1]
