"""kiln.runtime.plan: the mode and kiln.config's wrapper settings resolved once into a frozen plan.

The expected values are the behaviour the lowering and the runtime had when each read the mode
string and the settings themselves: the native wrapper up front under cpu_wrapper="native", and
under "auto" with mode="reduce-overhead"; a tier-up after native_wrapper_after calls under "auto"
outside that mode; a graph read back from the frame cache tiers up (or loads a native wrapper built
before) under every setting but "python". The last tests compile graphs and check that the lowering
obeys the plan.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from kiln import config
from kiln.lower import compile_graph
from kiln.lower.pipeline import LoweringOptions, Switches
from kiln.runtime import native, plan
from kiln.runtime.plan import WrapperPlan
from tests.lower.conftest import aten_graph

RO = "reduce-overhead"

# (cpu_wrapper, native_wrapper_after, mode) -> (native_allowed, native_up_front, tier_up_after)
WRAPPER_TABLE = [
    ("auto", 100, None, (True, False, 100)),
    ("auto", 100, RO, (True, True, 100)),  # built up front; a graph it cannot express is not tiered
    ("auto", 100, "max-autotune", (True, False, 100)),
    ("auto", 0, None, (True, False, 0)),  # no tier-up, but a stored graph's native library still loads
    ("auto", -3, None, (True, False, 0)),
    ("auto", 0, RO, (True, True, 0)),
    ("python", 100, None, (False, False, 0)),
    ("python", 100, RO, (False, False, 0)),  # "python" wins over the mode
    ("native", 100, None, (True, True, 100)),  # a stored graph (no mode) still tiers up
    ("native", 0, "max-autotune", (True, True, 0)),
]


@pytest.mark.parametrize("cpu_wrapper, after, mode, expected", WRAPPER_TABLE)
def test_wrapper_settings_resolve_as_the_lowering_read_them(cpu_wrapper, after, mode, expected):
    with config.patch(cpu_wrapper=cpu_wrapper, native_wrapper_after=after):
        got = plan.resolve(mode).wrapper
    assert (got.native_allowed, got.native_up_front, got.tier_up_after) == expected
    # a graph compiled now tiers up only where it starts on its Python wrapper with a count to wait for
    assert got.tiers_up() == (cpu_wrapper == "auto" and after > 0 and mode != RO)


@pytest.mark.parametrize("mode, cuda_graphs, autotune", [
    (None, False, False), ("default", False, False), (RO, True, False), ("max-autotune", False, True),
    ("max-autotune-no-cudagraphs", False, False),
])
def test_the_mode_resolves_to_cuda_graphs_and_autotuning(mode, cuda_graphs, autotune):
    resolved = plan.resolve(mode)
    assert (resolved.cuda_graphs, resolved.autotune) == (cuda_graphs, autotune)
    assert resolved.mode == (None if mode == "default" else mode)


def test_the_plan_is_frozen_and_reads_config_when_resolved():
    with config.patch(cpu_backend="triton"):
        resolved = plan.resolve(None)
    assert resolved.cpu_backend == "triton" and plan.resolve(None).cpu_backend == config.cpu_backend
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.mode = RO  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.wrapper.tier_up_after = 1  # type: ignore[misc]


def test_an_unknown_cpu_wrapper_is_an_error_naming_the_setting():
    with config.patch(cpu_wrapper="fast"), pytest.raises(ValueError, match="KILN_CPU_WRAPPER.*'fast'"):
        plan.resolve(None)


def test_lowering_options_keep_user_bisector_and_internal_keys_apart():
    options = {"mode": "max-autotune", "verify": False, "opt_level": "-O1", "no_fusion": ("buf1", "buf0"),
               "aten_fallback": ["aten.add.Tensor"], "cpu_variant": "linear_onednn", "unknown": 1}
    got = LoweringOptions.of(options)
    assert got.plan == plan.resolve("max-autotune") and got.plan.autotune
    assert (got.verify, got.opt_level, got.cpu_variant) == (False, "-O1", "linear_onednn")
    assert got.switches == Switches(aten_fallback=frozenset({"aten.add.Tensor"}), no_fusion=frozenset({"buf0", "buf1"}))
    default = LoweringOptions.of(None)
    assert (default.verify, default.opt_level, default.cpu_variant, default.switches) == (True, None, None, Switches())
    assert default.plan == plan.resolve(None)
    # the variants the CPU autotuner compiles differ from the graph's own options in cpu_variant only
    assert default.variant("default") == dataclasses.replace(default, cpu_variant="default")
    assert len({default.cache_text(), default.variant("default").cache_text(), got.cache_text()}) == 3


def _block(x, w, b):
    return (torch.softmax(torch.addmm(b, x, w).relu() @ w.t(), -1) * 2,)


def _compiled(options=None, **settings):
    torch.manual_seed(0)
    args = [torch.randn(6, 5), torch.randn(5, 5), torch.randn(5)]
    gm, examples = aten_graph(_block, *args)
    with config.patch(**settings):
        made = compile_graph(gm, examples, options=options)
    torch.testing.assert_close(made(*args)[0], _block(*args)[0])
    return made.fn


def _is_native(fn) -> bool:
    return isinstance(fn, functools.partial) and fn.func is native.boundary().call


@pytest.mark.cpp
@pytest.mark.parametrize("options, settings, wrapper", [
    ({"mode": RO}, {"cpu_wrapper": "auto"}, "native"),  # reduce-overhead on CPU: the native wrapper
    ({"mode": RO}, {"cpu_wrapper": "python"}, "python"),  # cpu_wrapper="python" wins
    (None, {"cpu_wrapper": "native"}, "native"),
    (None, {"cpu_wrapper": "auto", "native_wrapper_after": 5, "native_plan": False}, "tiered"),
    (None, {"cpu_wrapper": "auto", "native_wrapper_after": 0}, "python"),
    ({"mode": "max-autotune", "cpu_variant": "default"},
     {"cpu_wrapper": "auto", "native_wrapper_after": 5, "native_plan": False}, "tiered"),
    # a plan needs no build: a graph that would tier up runs its plan from the first call
    (None, {"cpu_wrapper": "auto", "native_wrapper_after": 5, "native_plan": True}, "native"),
    ({"mode": RO}, {"cpu_wrapper": "auto", "native_plan": False}, "native"),
])
def test_the_lowering_builds_the_wrapper_the_plan_says(options, settings, wrapper):
    fn = _compiled(options, **settings)
    if isinstance(fn, native.TieredWrapper) and fn.current is not fn.python:
        fn = fn.current  # a native wrapper bound up front (a plan), behind a settled TieredWrapper
        kind = "native"
    else:
        kind = "tiered" if isinstance(fn, native.TieredWrapper) else "native" if _is_native(fn) else "python"
    assert kind == wrapper, type(fn)


def test_a_stored_graph_loads_under_the_wrapper_plan_it_is_given():
    def python(*args):
        return args

    ref = native.NativeRef(("nowhere", "0" * 64), (), None, (), None)
    never = WrapperPlan(native_allowed=False, native_up_front=False, tier_up_after=5)
    assert native.load_tiered(python, ref, never) is python
    cold = WrapperPlan(native_allowed=True, native_up_front=False, tier_up_after=0)
    assert native.load_tiered(python, ref, cold) is python
    hot = native.load_tiered(python, ref, WrapperPlan(native_allowed=True, native_up_front=True, tier_up_after=3,
                                                      native_plan=False))
    assert isinstance(hot, native.TieredWrapper) and hot.after == 3
    planned = native.load_tiered(python, ref, WrapperPlan(native_allowed=True, native_up_front=False, tier_up_after=3))
    assert isinstance(planned, native.TieredWrapper) and planned is not hot  # the plan's wrapper (no build)
