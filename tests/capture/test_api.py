"""The public surface of kiln: compile's forms and arguments, module wrapping, markers, backends,
reset/stats. Everything runs through the real tracer with the eager backend."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch

import kiln
import kiln.errors
from kiln.capture.options import ALLOW_IN_GRAPH_MARKER, DISABLE_MARKER
from kiln.log import KilnWarning


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def double_plus(x, y):
    return x * 2 + y


def test_public_names():
    for name in ["compile", "explain", "reset", "stats", "config", "mark_dynamic", "mark_static",
                 "maybe_mark_dynamic", "disable", "allow_in_graph", "register_backend", "list_backends",
                 "inductor_backend", "OptimizedModule"]:
        assert hasattr(kiln, name), name
    assert set(kiln.stats()) >= {"frames", "compiles", "recompiles", "graph_breaks", "cache_hits", "fallbacks"}


@pytest.mark.cpp  # the bare forms use the default backend, "inductor"
def test_function_and_decorator_forms():
    x, y = torch.randn(4), torch.randn(4)
    expected = double_plus(x, y)

    @kiln.compile
    def bare(x, y):
        return x * 2 + y

    @kiln.compile()
    def empty_call(x, y):
        return x * 2 + y

    @kiln.compile(backend="eager", fullgraph=True, dynamic=False)
    def with_args(x, y):
        return x * 2 + y

    as_function = kiln.compile(double_plus, backend="eager")
    for fn in (bare, empty_call, with_args, as_function):
        torch.testing.assert_close(fn(x, y), expected)
    assert as_function.__name__ == "double_plus" and as_function.__wrapped__ is double_plus
    assert kiln.stats()["compiles"] == 4


def test_partial_and_callable_object():
    import functools

    f = kiln.compile(functools.partial(double_plus, y=torch.ones(2)), backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(f(x), x * 2 + 1)

    class Doubler:
        def __call__(self, t):
            return t * 2

    g = kiln.compile(Doubler(), backend="eager")
    torch.testing.assert_close(g(x), x * 2)
    assert kiln.stats()["compiles"] == 2


def test_disable_argument_returns_the_model_unchanged():
    assert kiln.compile(double_plus, disable=True) is double_plus
    lin = torch.nn.Linear(2, 2)
    assert kiln.compile(lin, disable=True) is lin


def test_bound_method():
    class Affine:
        def __init__(self):
            self.w = torch.randn(3)

        def apply(self, x):
            return x * self.w + 1

    a = Affine()
    f = kiln.compile(a.apply, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), a.apply(x))
    a.w = torch.ones(3)  # a new tensor object: the guards notice
    torch.testing.assert_close(f(x), x + 1)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("scale", torch.tensor(2.0))
        self.note = "kept"

    def forward(self, x):
        return self.drop(self.fc(x)) * self.scale


def test_module_stays_a_module():
    net = Net()
    opt = kiln.compile(net, backend="eager")
    assert isinstance(opt, torch.nn.Module) and isinstance(opt, kiln.OptimizedModule)
    assert [p is q for p, q in zip(opt.parameters(), net.parameters())] == [True, True]
    assert list(opt.state_dict()) == ["_orig_mod." + k for k in net.state_dict()]
    assert opt.note == "kept" and opt.fc is net.fc  # attributes forward to the original
    opt.eval()
    assert not net.training and not net.drop.training
    x = torch.randn(2, 4)
    torch.testing.assert_close(opt(x), net(x))
    opt.train()
    assert net.training
    torch.manual_seed(0)
    out = opt(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, net(x))


def test_module_state_dict_matches_torch_compile():
    net = Net()
    ours = kiln.compile(net, backend="eager")
    theirs = torch.compile(net, backend="eager")
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_module_forward_hooks_still_run():
    net = Net().eval()
    calls = []
    net.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    net.register_forward_hook(lambda m, args, out: out + 100)
    opt = kiln.compile(net, backend="eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(opt(x), net(x))
    assert calls == ["pre", "pre"]


def test_disable_and_allow_in_graph_markers():
    def helper(x):
        return x + 1

    disabled = kiln.disable(helper)
    assert getattr(disabled, DISABLE_MARKER) and not hasattr(helper, DISABLE_MARKER)
    assert disabled(1) == 2 and disabled.__wrapped__ is helper and kiln.disable(disabled) is disabled

    def other(x):
        return x - 1

    assert kiln.allow_in_graph(other) is other and getattr(other, ALLOW_IN_GRAPH_MARKER)
    compiled = kiln.compile(helper, backend="eager")
    assert kiln.disable(compiled).__wrapped__ is helper
    wrapped = kiln.allow_in_graph(torch.Tensor.add)  # a builtin takes no attribute: it is wrapped
    assert getattr(wrapped, ALLOW_IN_GRAPH_MARKER) and torch.equal(wrapped(torch.zeros(1), 1), torch.ones(1))


def test_disabled_helper_runs_natively_inside_a_compiled_function(capsys):
    @kiln.disable
    def peek(t):
        print("peek", t.shape[0])  # would be a graph break anyway; here it is never traced
        return int(t.numpy().sum())

    def f(x):
        y = x * 2
        s = peek(y)
        return y + s

    out = kiln.explain(f)(torch.ones(3))
    assert capsys.readouterr().out == "peek 3\n"
    assert out.graph_count == 2 and len(out.break_reasons) == 1
    g = kiln.compile(f, backend="eager")
    torch.testing.assert_close(g(torch.ones(3)), f(torch.ones(3)))


def test_compiling_a_disabled_function_returns_it():
    @kiln.disable
    def never(x):
        return x

    assert kiln.compile(never, backend="eager") is never


def test_backend_registry():
    assert {"eager", "aot_eager", "inductor"} <= set(kiln.list_backends())
    seen = []

    def my_backend(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm.forward

    kiln.register_backend("test_api_mine", my_backend)
    assert "test_api_mine" in kiln.list_backends()
    f = kiln.compile(double_plus, backend="test_api_mine")
    x, y = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(f(x, y), double_plus(x, y))
    assert seen == [2]
    with pytest.raises(ValueError, match="already registered"):
        kiln.register_backend("test_api_mine", lambda gm, ex: gm)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        kiln.compile(double_plus, backend="nope")


def test_callable_backend_gets_graph_and_fake_examples():
    got = {}

    def backend(gm, example_inputs):
        got["gm"], got["ex"] = gm, example_inputs
        return gm.forward

    f = kiln.compile(double_plus, backend=backend)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(f(x, y), double_plus(x, y))
    assert isinstance(got["gm"], torch.fx.GraphModule)
    assert len(got["ex"]) == 2 and all(e.shape == (3,) for e in got["ex"])
    assert all(type(e) is not torch.Tensor for e in got["ex"])  # fake tensors, not the real inputs


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown mode"):
        kiln.compile(double_plus, mode="fastest")
    with pytest.raises(ValueError, match="either mode or options"):
        kiln.compile(double_plus, mode="max-autotune", options={"a": 1})
    with pytest.raises(TypeError, match="cannot compile"):
        kiln.compile(3)


@pytest.mark.parametrize("name,stage", [("aot_eager", "kiln.autograd"), ("inductor", "kiln.lower")])
def test_a_broken_stage_is_an_error_not_a_silent_substitute(name, stage, monkeypatch):
    # A stage that cannot be imported is a bug in Kiln: fullgraph=True raises it, otherwise the frame
    # runs eagerly with a warning that names the import error (no quiet switch to another backend).
    monkeypatch.setitem(sys.modules, stage, None)
    x = torch.randn(3)
    with pytest.raises(ImportError, match=stage):
        kiln.compile(lambda t: t.sin() + 1, backend=name, fullgraph=True)(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = kiln.compile(double_plus, backend=name)
        torch.testing.assert_close(f(x, x), double_plus(x, x))
    texts = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
    assert len(texts) == 1 and "internal error" in texts[0] and stage in texts[0]


@pytest.mark.cpp
def test_backends_use_the_stages():
    x = torch.randn(5)
    for name in ["aot_eager", "inductor"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f = kiln.compile(lambda t: torch.relu(t) * 2 + 1, backend=name)
            torch.testing.assert_close(f(x), torch.relu(x) * 2 + 1)
        assert not [w for w in caught if issubclass(w.category, KilnWarning)]


@pytest.mark.cpp
def test_inductor_backend_works_under_real_torch_compile():
    def f(x):
        return torch.relu(x) * 2 + 1

    x = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KilnWarning)
        out = torch.compile(f, backend=kiln.inductor_backend)(x)
    torch.testing.assert_close(out, f(x))
    torch._dynamo.reset()


def test_reset_and_stats():
    f = kiln.compile(double_plus, backend="eager")
    x = torch.randn(2)
    f(x, x)
    f(x, x)
    s = kiln.stats()
    assert s["frames"] == 1 and s["compiles"] == 1 and s["cache_hits"] == 1 and s["graphs"] == 1
    kiln.reset()
    assert all(v == 0 for v in kiln.stats().values())
    f(x, x)
    assert kiln.stats()["compiles"] == 1


def test_mark_dynamic_is_reexported():
    from kiln.symbolic import marks

    assert kiln.mark_dynamic is marks.mark_dynamic and kiln.mark_static is marks.mark_static
    assert kiln.maybe_mark_dynamic is marks.maybe_mark_dynamic


def prints_midway(x):
    y = x.sin()
    print("midway")
    return y.cos()


def test_fullgraph_raises_the_break_record(capsys):
    f = kiln.compile(prints_midway, backend="eager", fullgraph=True)
    with pytest.raises(kiln.errors.GraphBreakError) as info:
        f(torch.randn(2))
    line = prints_midway.__code__.co_firstlineno + 2
    assert f"{__file__}:{line}" in str(info.value) and 'print("midway")' in str(info.value)
    assert capsys.readouterr().out == ""  # nothing of the function ran


def failing_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def test_backend_error_falls_back_to_eager_with_one_warning():
    f = kiln.compile(double_plus, backend=failing_backend)
    x, y = torch.randn(2), torch.randn(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(f(x, y), double_plus(x, y))
        torch.testing.assert_close(f(y, x), double_plus(y, x))
    texts = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
    assert len(texts) == 1 and "double_plus" in texts[0] and "backend exploded" in texts[0]
    assert kiln.stats()["fallbacks"] == 2


def test_backend_error_under_fullgraph_names_the_function():
    f = kiln.compile(double_plus, backend=failing_backend, fullgraph=True)
    with pytest.raises(Exception, match="backend exploded") as info:
        f(torch.randn(2), torch.randn(2))
    notes = getattr(info.value, "__notes__", []) + [str(info.value)]
    assert any("double_plus" in n and __file__ in n for n in notes)


def test_guards_and_recompiles_logs(caplog):
    from kiln import log

    f = kiln.compile(double_plus, backend="eager")
    log.configure("guards,recompiles")
    try:
        with caplog.at_level("INFO", logger="kiln"):
            f(torch.randn(8), torch.randn(8))
            f(torch.randn(9), torch.randn(9))
    finally:
        log.configure("")
    assert "def ___check_guards(L, G, F):" in caplog.text
    assert "x.size()[0] changed from 8 to 9" in caplog.text
    assert "x dim 0: 8 -> 9, now dynamic" in caplog.text


def test_mode_and_options_reach_the_lowering(monkeypatch):
    seen = []

    def fake_compile_graph(gm, example_inputs, *, options=None):
        seen.append(options)
        return gm.forward

    def fake_aot_autograd(fw_compiler, bw_compiler=None, **kwargs):
        return lambda gm, example_inputs: fw_compiler(gm, example_inputs)

    monkeypatch.setattr("kiln.autograd.aot_autograd", fake_aot_autograd)
    monkeypatch.setattr("kiln.lower.compile_graph", fake_compile_graph)
    x = torch.randn(3)
    kiln.compile(lambda t: t * 3, mode="max-autotune")(x)
    kiln.compile(lambda t: t * 4, mode="reduce-overhead")(x)
    kiln.compile(lambda t: t * 5, options={"opt_level": "-O1"})(x)
    kiln.compile(lambda t: t * 6)(x)
    assert seen == [{"mode": "max-autotune"}, {"mode": "reduce-overhead"}, {"opt_level": "-O1"}, None]


def test_stats_count_graph_breaks_and_resume_frames(capsys):
    f = kiln.compile(prints_midway, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x.sin().cos())
    torch.testing.assert_close(f(x), x.sin().cos())
    assert capsys.readouterr().out == "midway\nmidway\n"
    s = kiln.stats()
    assert s["graph_breaks"] == 1
    assert s["compiles"] == 2 and s["graphs"] == 2  # the frame and its resume function
    assert s["cache_hits"] == 2  # the second call hits both
