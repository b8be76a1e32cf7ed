"""The frame entry on its own: a stand-in capture (guards on every argument, glue that runs the
function) drives the cache, recompiles, the cache limit, fallbacks and the counters."""
from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass, field

import pytest
import torch

import kiln
from kiln.api import compile_with
from kiln.capture import binding, entry
from kiln.capture.guards import Guard, tensor_guard
from kiln.capture.options import CompileOptions
from kiln.log import KilnWarning
from kiln.errors import GraphBreakError, Unsupported


ONE_GRAPH = torch.fx.symbolic_trace(lambda x: (x + 1,))


@dataclass(frozen=True)
class StandInResult:
    glue: object
    glue_source: str
    guards: list
    graphs: list = field(default_factory=lambda: [ONE_GRAPH])
    breaks: list = field(default_factory=list)
    traced_tensor_ops: bool = False  # as kiln.capture.glue.CaptureResult: tensor ops traced, all unused


class StandInCapture:
    """Guards every argument like the tracer would (tensor metadata, constants by value, modules by
    id plus their training flag); its glue calls the function itself."""

    def __init__(self, fail_with: BaseException | None = None, breaks: list | None = None, graphs: int = 1):
        self.graphs = [ONE_GRAPH] * graphs
        self.calls = 0
        self.fail_with = fail_with
        self.breaks = breaks or []
        self.policies = []

    def __call__(self, fn, L, options, wrap_frame, *, policy=None):
        self.calls += 1
        self.policies.append(policy)
        if self.fail_with is not None:
            raise self.fail_with
        guards = [Guard("", "check_grad_mode", torch.is_grad_enabled())]
        for name, value in L.items():
            src = f"L[{name!r}]"
            if isinstance(value, torch.Tensor):
                guards.append(tensor_guard(src, value))
            elif isinstance(value, torch.nn.Module):
                guards += [Guard(src, "check_id", value), Guard(f"{src}.training", "check_value", value.training)]
            elif value is None or isinstance(value, (int, float, str)):
                guards.append(Guard(src, "check_value", value))
            else:
                guards.append(Guard(src, "check_type", type(value)))
        return StandInResult(call_from_locals, "F(**L)", guards, graphs=list(self.graphs), breaks=list(self.breaks))


def call_from_locals(L, G, F):
    """Call F with the arguments that `L` holds (what a glue does with the frame's inputs)."""
    args, kwargs = [], {}
    for p in inspect.signature(F).parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            args.extend(L[p.name])
        elif p.kind == p.VAR_KEYWORD:
            kwargs.update(L[p.name])
        elif p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = L[p.name]
        else:
            args.append(L[p.name])
    return F(*args, **kwargs)


def compiled(fn, capture, **option_kwargs):
    return compile_with(fn, CompileOptions(backend="eager", compiler=lambda gm, ex: gm.forward, **option_kwargs),
                        capture)


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def add(x, y):
    return x + y


def test_hit_miss_and_stats():
    cap = StandInCapture()
    f = compiled(add, cap)
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(3):
        assert torch.equal(f(x, y), x + y)
    assert cap.calls == 1
    s = kiln.stats()
    assert (s["frames"], s["compiles"], s["recompiles"], s["cache_hits"], s["fallbacks"]) == (1, 1, 0, 2, 0)
    f(torch.randn(4), y.new_ones(4))
    f(x.double(), y.double())
    assert cap.calls == 3 and kiln.stats()["recompiles"] == 2
    assert len(entry.frames_of(f).entries) == 3
    f(torch.randn(4), torch.randn(4))  # an older entry still serves its inputs
    assert cap.calls == 3


def test_keyword_default_and_varargs_binding():
    def g(a, b=2, *rest, scale=1.0, **extra):
        return a * b * scale + sum(rest) + len(extra)

    cap = StandInCapture()
    f = compiled(g, cap)
    assert f(1) == g(1)
    assert f(1, 3, 4, 5, scale=2.0, k=1) == g(1, 3, 4, 5, scale=2.0, k=1)
    assert f(a=2, b=3) == g(a=2, b=3)
    with pytest.raises(TypeError):
        f()


def test_bound_method_and_closure():
    class Scaler:
        def __init__(self, k):
            self.k = k

        def apply(self, x):
            return x * self.k

    cap = StandInCapture()
    s = Scaler(3)
    f = compiled(s.apply, cap)
    assert f(2) == 6
    assert f(2) == 6 and cap.calls == 1


def test_recompile_log_names_the_failing_guard(caplog):
    from kiln import log

    log.configure("recompiles")
    try:
        f = compiled(add, StandInCapture())
        f(torch.randn(8), torch.randn(8))
        with caplog.at_level("INFO", logger="kiln"):
            f(torch.randn(16), torch.randn(16))
    finally:
        log.configure("")
    assert "x.size()[0] changed from 8 to 16" in caplog.text
    assert "Recompiling add" in caplog.text
    assert "x dim 0: 8 -> 16, now dynamic" in caplog.text  # the policy's decision, from explain_change


def test_entry_shows_the_policy_what_each_capture_saw():
    cap = StandInCapture()
    f = compiled(add, cap)
    f(torch.randn(8, 2), torch.randn(8, 2))
    policy = cap.policies[0]
    x = torch.randn(9, 2)
    assert policy.dynamic_dims("L['x']", x, None) == (0,)  # automatic dynamic: dim 0 changed
    assert policy.dynamic_dims("L['y']", torch.randn(8, 2), None) == ()
    g = compiled(lambda t, n: t * n, cap)
    g(torch.ones(1), 3)
    assert cap.policies[-1].int_is_dynamic("L['n']", 4, None)


def test_cache_size_limit_warns_once_then_runs_eagerly():
    cap = StandInCapture()
    f = compiled(add, cap)
    with kiln.config.patch(cache_size_limit=3), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(2, 9):
            x = torch.randn(n)
            assert torch.equal(f(x, x), x + x)
    limit_warnings = [w for w in caught if issubclass(w.category, KilnWarning)]
    assert cap.calls == 3
    assert len(limit_warnings) == 1
    text = str(limit_warnings[0].message)
    assert "add" in text and "cache_size_limit (3)" in text and "x.size()[0] changed from 4 to 5" in text
    assert kiln.stats()["fallbacks"] == 4
    f(torch.randn(2), torch.randn(2))  # cached entries still serve the calls they match
    assert kiln.stats()["fallbacks"] == 4


def test_unsupported_frame_runs_eagerly_and_is_not_retried():
    cap = StandInCapture(fail_with=Unsupported("generators are not supported", kind="unsupported"))
    f = compiled(add, cap)
    assert f(1, 2) == 3 and f(3, 4) == 7
    assert cap.calls == 1
    assert kiln.stats()["fallbacks"] == 2


def test_unsupported_under_fullgraph_raises_with_location():
    cap = StandInCapture(fail_with=Unsupported("generators are not supported"))
    f = compiled(add, cap, fullgraph=True)
    with pytest.raises(GraphBreakError, match=r"test_entry.py:\d+: add: generators are not supported"):
        f(1, 2)


def test_breaks_under_fullgraph_raise_the_record():
    class Record:
        def __str__(self):
            return "Graph break at here.py:3\n  reason: print"

    f = compiled(add, StandInCapture(breaks=[Record()]), fullgraph=True)
    with pytest.raises(GraphBreakError, match="reason: print"):
        f(1, 2)


def test_internal_error_falls_back_with_one_warning():
    cap = StandInCapture(fail_with=RuntimeError("boom"))
    f = compiled(add, cap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(1, 2) == 3 and f(2, 2) == 4
    messages = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
    assert len(messages) == 1 and "internal error while compiling add" in messages[0] and "boom" in messages[0]
    assert cap.calls == 1


def test_internal_error_raises_without_suppress_errors():
    f = compiled(add, StandInCapture(fail_with=RuntimeError("boom")))
    with kiln.config.patch(suppress_errors=False), pytest.raises(RuntimeError, match="boom") as info:
        f(1, 2)
    assert any("while kiln compiled add" in note for note in info.value.__notes__)


def test_guards_that_fail_on_their_own_inputs_are_an_internal_error():
    class BadGuards(StandInCapture):
        def __call__(self, fn, L, options, wrap_frame, *, policy=None):
            result = super().__call__(fn, L, options, wrap_frame, policy=policy)
            return StandInResult(result.glue, "", [Guard("L['x']", "check_value", -1)])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = compiled(add, BadGuards())
        assert f(1, 2) == 3
    assert "fail on its own inputs: x changed from -1 to 1" in str(caught[-1].message)


def test_frame_without_ops_runs_eagerly_from_then_on():
    cap = StandInCapture(graphs=0)
    f = compiled(add, cap)
    assert f(1, 2) == 3 and f(torch.ones(1), 2) == 3
    assert cap.calls == 1 and kiln.stats()["fallbacks"] == 2 and kiln.stats()["compiles"] == 0
    g = compiled(add, StandInCapture(graphs=0), fullgraph=True)  # fullgraph keeps its (empty) entry
    assert g(1, 2) == 3 and kiln.stats()["compiles"] == 1


def test_reset_clears_entries_and_counters():
    cap = StandInCapture()
    f = compiled(add, cap)
    f(1, 2)
    kiln.reset()
    assert kiln.stats()["compiles"] == 0
    f(1, 2)
    assert cap.calls == 2


def test_policy_is_kept_across_recompiles():
    cap = StandInCapture()
    f = compiled(add, cap)
    f(torch.randn(2), torch.randn(2))
    f(torch.randn(3), torch.randn(3))
    assert cap.policies[0] is cap.policies[1]


def test_module_flag_recompiles():
    lin = torch.nn.Linear(2, 2)
    cap = StandInCapture()
    f = compiled(lin.forward, cap)
    x = torch.randn(1, 2)
    f(x)
    lin.eval()
    f(x)
    f(x)
    assert cap.calls == 2
    assert entry.frames_of(f).last_failure == "self.training changed from True to False"


def test_wrap_frame_compiles_resume_functions_with_same_options():
    seen = []

    class Resuming(StandInCapture):
        def __call__(self, fn, L, options, wrap_frame, *, policy=None):
            seen.append((fn.__name__, options))
            if fn.__name__ == "outer":
                inner = wrap_frame(helper)
                return StandInResult(lambda L, G, F: inner(L["x"]) + 1, "", [Guard("L['x']", "check_value", L["x"])])
            return super().__call__(fn, L, options, wrap_frame, policy=policy)

    def helper(x):
        return x * 10

    def outer(x):
        return helper(x) + 1

    f = compiled(outer, Resuming())
    assert f(2) == 21
    assert [name for name, _ in seen] == ["outer", "helper"]
    assert seen[0][1] is seen[1][1]


@pytest.mark.parametrize("call", [((1,), {}), ((1, 2), {}), ((1,), {"b": 5}), ((), {"a": 1, "c": 3}),
                                  ((1, 2, 3), {}), ((1,), {"c": 4, "b": 0})])
@pytest.mark.parametrize("method", [False, True])
def test_binder_agrees_with_signature_bind(call, method):
    class Holder:
        def m(self, a, b=2, c=None):
            return a

    def plain(a, b=2, c=None):
        return a

    args, kwargs = call
    target = Holder().m if method else plain
    fn = target.__func__ if method else target
    binder = binding.make_binder(fn, getattr(target, "__self__", None), method)
    expected = inspect.signature(target).bind(*args, **kwargs)
    expected.apply_defaults()
    L = binder(args, kwargs)
    if method:
        assert L.pop("self") is target.__self__
    assert L == dict(expected.arguments)


@pytest.mark.parametrize("call", [((1, 2, 3, 4), {}), ((1,), {"a": 2}), ((), {"b": 1}), ((1,), {"zz": 1})])
def test_binder_raises_like_python(call):
    def plain(a, b=2, c=None):
        return a

    args, kwargs = call
    binder = binding.make_binder(plain, None, False)
    with pytest.raises(TypeError):
        binder(args, kwargs)


def _star_signatures():
    def varkw(a, b=2, **kwargs):
        return a

    def varargs(a, *rest, key=1, **kw):
        return a

    def kwonly(a, *, b, c=3):
        return a

    def everything(self_like, x=None, *args, flag=False, other, **kwargs):
        return x

    def posonly(a, /, b=2, **kwargs):
        return a

    def bare(*args, **kwargs):
        return args
    return [varkw, varargs, kwonly, everything, posonly, bare]


_STAR_CALLS = [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3, 4), {}), ((1,), {"b": 5}), ((1,), {"zz": 9, "b": 0}),
               ((), {"a": 1, "c": 3}), ((1,), {"other": 4}), ((1, 2), {"other": 4, "flag": True, "q": 1}),
               ((1,), {"a": 2}), ((1,), {"kwargs": 1, "args": 2, "rest": 3}), ((1,), {"b": 1, "key": 5}),
               ((1,), {"self_like": 0}), ((0, 1), {"other": 2, "x": 3})]


@pytest.mark.parametrize("call", _STAR_CALLS)
@pytest.mark.parametrize("index", range(6))
def test_binder_with_star_and_keyword_only_parameters(call, index, monkeypatch):
    # a transformers forward takes **kwargs: bound without inspect, as Signature.bind +
    # apply_defaults bind it (the same keys in the same order, the **kwargs dict in call order),
    # or Python's own TypeError
    fn = _star_signatures()[index]
    args, kwargs = call
    binder = binding.make_binder(fn, None, False)
    try:
        expected = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            binder(args, dict(kwargs))
        return
    expected.apply_defaults()
    real_bind, slow_binds = inspect.Signature.bind, []
    monkeypatch.setattr(inspect.Signature, "bind", lambda *a, **k: slow_binds.append(a) or real_bind(*a, **k))
    got = binder(args, dict(kwargs))
    monkeypatch.undo()
    assert slow_binds == [] or fn.__name__ == "posonly"  # the fast path, also for *args/**kwargs
    assert list(got.items()) == list(expected.arguments.items())
    for name, value in got.items():
        if isinstance(value, dict):
            assert list(value) == list(expected.arguments[name])
    fn.__defaults__ = None if fn.__defaults__ is None else tuple(d if d is None else 7 for d in fn.__defaults__)
    if fn.__kwdefaults__:
        fn.__kwdefaults__ = {k: 8 for k in fn.__kwdefaults__}
    try:
        expected = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return
    expected.apply_defaults()
    assert binder(args, dict(kwargs)) == dict(expected.arguments)  # defaults replaced after compile


def _two(x, y):
    return x * 2 + y


def _with_default(x, y=3.0):
    return x - y


def _own_names(L, args, kwargs, fn, entry):  # noqa: N803  # the names the entry's own code uses
    return L + args * kwargs - fn + entry


def _none():
    return torch.ones(2)


_EXACT_CALLS = [
    (_two, (torch.ones(2), torch.ones(2)), {}), (_two, (torch.ones(2),), {"y": torch.ones(2)}),
    (_two, (), {"y": torch.ones(2), "x": torch.ones(2)}), (_two, (torch.ones(2),), {}),
    (_two, (), {"y": torch.ones(2)}), (_two, (torch.ones(2),) * 3, {}), (_two, (torch.ones(2),) * 2, {"x": 1}),
    (_two, (torch.ones(2),), {"z": 1}), (_with_default, (torch.ones(2),), {}),
    (_with_default, (torch.ones(2), 1.0), {}), (_with_default, (), {"x": torch.ones(2), "y": 2.0}),
    (_with_default, (torch.ones(2),) * 3, {}), (_own_names, (torch.ones(2),) * 5, {}),
    (_own_names, (), {k: torch.full((2,), 2.0) for k in ("L", "args", "kwargs", "fn", "entry")}),
    (_none, (), {}), (_none, (1,), {}),
]


@pytest.mark.parametrize("fn, args, kwargs", _EXACT_CALLS)
def test_an_all_positional_function_is_entered_with_its_own_parameters(fn, args, kwargs) -> None:
    # The compiled callable of an all-positional function takes the function's parameters (no
    # **kwargs dict, no binder call per call; more positional arguments land in an *extra tuple,
    # empty in a good call), and every call binds, computes or raises as eager's, message included:
    # keywords, defaults, missing, repeated, unknown and too many arguments
    kiln.reset()
    compiled = kiln.compile(fn)
    code = compiled.__code__
    assert not code.co_flags & inspect.CO_VARKEYWORDS
    assert code.co_varnames[:code.co_argcount] == fn.__code__.co_varnames[:fn.__code__.co_argcount]
    for _ in range(3):
        try:
            want = fn(*args, **kwargs)
        except TypeError as exc:
            with pytest.raises(TypeError, match=f"^{re.escape(str(exc))}$"):
                compiled(*args, **kwargs)
            continue
        torch.testing.assert_close(compiled(*args, **kwargs), want)
    kiln.reset()


def test_an_exact_entry_follows_defaults_and_code_replaced_after_compile() -> None:
    kiln.reset()

    def f(x, y):
        return x + y

    compiled = kiln.compile(f)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x, x), x + x)
    f.__defaults__ = (torch.full((3,), 5.0),)  # a default given after compile: the call binds it
    torch.testing.assert_close(compiled(x), x + 5)
    torch.testing.assert_close(compiled(y=x, x=x), x + x)

    def g(x, y=torch.full((3,), 7.0)):
        return x * y

    f.__code__, f.__defaults__ = g.__code__, g.__defaults__  # new code: its own compiled callable
    torch.testing.assert_close(compiled(x), x * 7)
    torch.testing.assert_close(compiled(x, x), x)
    kiln.reset()
