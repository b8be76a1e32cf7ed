"""Warm start across graph breaks: a second process runs broken functions with zero captures.

A frame with a graph break stores its glue with its resume functions as data (the offset they
continue at, the stack depth, NULL slots and live locals there: kiln.capture.persist.StoredResume)
and its break callees by name; the later process checks that data against the frame's own
bytecode, makes the resume code again (kiln.capture.code) and compiles the callees, whose own
entries come from disk too. The two-process test counts captures (kiln.stats()["frames"]) and
compares with eager; the in-process tests forge the break parts of a stored entry and expect each
forgery refused with a cache log line and the frame captured again.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import log
from kiln.capture import code as code_mod
from kiln.capture import persist
from kiln.runtime import store
from tests.reliability import cache_harness as harness

pytestmark = pytest.mark.cpp

_BREAKS_SCRIPT = textwrap.dedent("""
    import functools, json, torch, kiln

    def noisy(t):
        u = t * 3
        print("noisy", u.shape[0])
        return u + 1

    def f(x, n):
        y = x.sin() * n
        print("mid", y.shape[0])          # a print: resume after it
        z = y.cos()
        s = z.sum().item()                # .item(): called natively on a graph output
        w = noisy(z)                      # a callee that breaks: compiled as its own frame
        if w.sum() > 0:                   # a data-dependent branch: two resume functions
            return w + s
        return w - s

    def make(scale):
        def inner(x):                     # a closure: resume functions made per closure
            y = x * scale
            print("closure")
            return y.exp()
        return inner

    def deco(func):
        @functools.wraps(func)            # the inner function stays reachable: decorated.__wrapped__
        def wrapper(*args, **kwargs):     # a decorator's wrapper: its callee is the function in its cell
            out = func(*args, **kwargs)
            return out * 2
        return wrapper

    @deco
    def decorated(x):
        y = x.sin()
        print("decorated", y.shape[0])
        return y.cos()

    def loop(x):
        for i in range(3):                # a break in a loop: the iterator is a resume argument
            x = x.sin()
            print("it", i)
        return x

    def indices(x):
        n = (x > 0).sum()
        idx = torch.arange(n, device=x.device)  # a size the graph computed: arange runs at the break
        return idx.float() * 2 + n

    def risky(t, fail):
        print("risky")
        if fail:
            raise ValueError("no")
        return t + 1

    def guarded(x, fail):
        y = x.sin()
        try:                              # a break inside try: the call runs under the frame's handlers
            z = risky(y, fail)
        except ValueError:
            z = y * 3
        return z.cos()

    def grad_off(x):
        y = x.sin()
        with torch.no_grad():             # a break inside with: the glue enters no_grad, the resume exits
            z = noisy(y)
        return z.cos()

    class Doubler(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            print("doubler")              # apply breaks: the glue calls the forward compiled on its own
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def applied(x):
        return Doubler.apply(x.sin()).cos()

    class Box:
        def __init__(self):
            self.items = []

    def use(box, t):
        print("use")
        return t * len(box.items)

    def boxed(x):
        box = Box()                       # built in the frame: the glue rebuilds it for the callee
        box.items.append(2)
        return use(box, x.sin())

    class Store:
        def __init__(self):
            self.states = [torch.ones(4, 4)]

    def keep(x, store):
        y = x.sin()
        store.states.append(y)            # replayed by the glue as store.states[:] = [old, new]
        print("kept")
        out = y.cos() + store.states[0]
        store.states.pop()                # the list as it was, for the eager call
        return out

    def reseeded(x):
        torch.manual_seed(0)              # a reseed: called natively at the break
        return x.sin()

    def compare(x, n):
        y = x.sin()
        assert list(y.size()) == [4, n, 4], "size"  # sizes against a 0-d tensor: compared at the break
        return y.cos() * n

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            print("net")
            return self.fc(h).relu()

    torch.manual_seed(0)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    cases = {"f": (f, (x, 2)), "closure": (make(2.0), (x,)), "loop": (loop, (x,)), "net": (Net(), (x,)),
             "decorated": (decorated, (x,)), "indices": (indices, (x,)),
             "compare": (compare, (x.reshape(4, 1, 4), torch.tensor(1))), "reseeded": (reseeded, (x,)),
             "guarded": (guarded, (x, False)), "guarded_raises": (guarded, (x, True)), "grad_off": (grad_off, (x,)),
             "applied": (applied, (x,)), "boxed": (boxed, (x,)), "keep": (keep, (x, Store()))}
    report = {}
    for name, (fn, args) in cases.items():
        before = kiln.stats()
        out = kiln.compile(fn, options={"opt_level": "-O1"})(*args)
        after = kiln.stats()
        report[name] = {"frames": after["frames"] - before["frames"],
                        "disk_hits": after["disk_hits"] - before["disk_hits"],
                        "err": (out - fn(*args)).abs().max().item()}
    print(json.dumps(report))
""")


def test_second_process_runs_broken_functions_without_capturing(tmp_path: Path) -> None:
    code = harness.snapshot(tmp_path)
    cache = tmp_path / "cache"
    first, _ = harness.run(code, cache, _BREAKS_SCRIPT)
    assert first["f"]["frames"] >= 6 and first["closure"]["frames"] == 2 and first["net"]["frames"] == 2, first
    second, stderr = harness.run(code, cache, _BREAKS_SCRIPT)
    for name, got in second.items():
        assert got["err"] < 1e-5, (name, got)
        # guarded_raises: the frame's try glue and `risky` come from disk and the exception reaches
        # the frame's handler; risky's own resume raises ValueError from its glue (an exception
        # class in a glue is not stored), so it alone is captured again
        assert got["frames"] == (1 if name == "guarded_raises" else 0), (name, got, stderr[-3000:])
        # the parent, its resumes and callees; guarded_raises finds `risky` already in memory (loaded
        # for guarded: compiles with the same arguments share their caches), its resume on disk
        assert got["disk_hits"] >= (1 if name == "guarded_raises" else 2), (name, got)


# ---------------------------------------------------------------------------------------------------
# Forged break parts, in this process


def _helper(t):
    return t * 2


def _broken(x):
    y = x.sin()
    print("mid", y.shape[0])
    n = y.sum().item()
    return _helper(y.cos()) + n


def _call(cache: Path) -> dict[str, int]:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
        kiln.reset()
        out = kiln.compile(_broken, options={"opt_level": "-O1"})(x)
    torch.testing.assert_close(out, _broken(x))
    return kiln.stats()


@pytest.fixture(scope="module")
def _genuine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A filled cache, the path of `_broken`'s own entry (its glue breaks twice) and that entry."""
    cache = tmp_path_factory.mktemp("breaks") / "cache"
    store.forget_verdicts()
    first = _call(cache)
    assert first["frames"] == 3 and first["graph_breaks"] == 2, first
    second = _call(cache)
    assert second["frames"] == 0 and second["disk_hits"] == 3, second
    for path in harness.files(cache, ".entry"):
        frame = persist.loads(store.read_sealed(str(path)))
        if frame.glue_name == "__glue__broken":
            return cache, path, frame
    raise AssertionError("no entry of _broken")


@pytest.fixture(autouse=True)
def _cache_log(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(store, "_warned_damage", True)
    log.configure("cache")
    yield
    log.configure("")
    kiln.reset()


def _resume(frame: Any, **change: Any) -> Any:
    (name, resume), *_ = sorted(frame.resumes.items())
    values = {"offset": resume.offset, "nstack": resume.nstack, "live": resume.live,
              "null_slots": resume.null_slots, **change}
    return _replace(frame, resumes={**frame.resumes, name: persist.StoredResume(**values)})


def _replace(frame: Any, **fields: Any) -> Any:
    values = {f: getattr(frame, f) for f in ("format", "guards", "glue_name", "glue_source", "graphs", "constants",
                                             "resumes", "callees")}
    return persist.StoredFrame(**{**values, **fields})


def _glue(old: str, new: str) -> Callable[[Any], Any]:
    def change(frame: Any) -> Any:
        assert old in frame.glue_source, frame.glue_source
        return _replace(frame, glue_source=frame.glue_source.replace(old, new, 1))
    return change


def _first_offset_with_other_depth(frame: Any) -> int:
    (_, resume), *_ = sorted(frame.resumes.items())
    for ins in code_mod.instructions(_broken.__code__)[0]:
        shape = code_mod.stack_shape_at(_broken.__code__, ins.offset)
        if shape is not None and shape.depth != resume.nstack and ins.offset > resume.offset:
            return ins.offset
    raise AssertionError("no such offset")


FORGERIES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "resume offset inside an instruction": (lambda fr: _resume(fr, offset=fr.resumes[min(fr.resumes)].offset + 1),
                                            "no instruction starts at offset"),
    "resume offset with another stack depth": (lambda fr: _resume(fr, offset=_first_offset_with_other_depth(fr)),
                                               "deep"),
    "resume stack depth": (lambda fr: _resume(fr, nstack=fr.resumes[min(fr.resumes)].nstack + 2), "deep"),
    "resume NULL slot where the bytecode holds an object": (lambda fr: _resume(fr, null_slots=(0,)), "NULL slots"),
    "resume local that is not live": (lambda fr: _resume(fr, live=("x", "y", "n")), "not live"),
    "callee the code does not name": (lambda fr: _replace(fr, callees={"__callee9": shutil.rmtree}),
                                      "is not a function _broken names"),
    "print swapped for exec": (lambda fr: _replace(fr, constants={k: exec for k in fr.constants}),
                               "capture does not bind"),
    "resume rebound to a global": (_glue("    return __resume1", "    __resume1 = G['os']\n    return __resume1"),
                                   "glue rebinds"),
    "resume argument read off a global": (_glue("(__result0, ", "(G['torch'].save, "), "takes an object read off"),
    "print argument read off a frame object": (_glue("('mid', 4)", "(L['x'].grad_fn)"), "takes an object read off"),
    "method the code does not name": (_glue("__const_print_0('mid', 4)", "__out[0].apply_(__const_print_0)"),
                                      "stored code calls"),
    "method of a frame object": (_glue("__const_print_0('mid', 4)", "L['x'].sin()"), "stored code calls"),
}


@pytest.mark.parametrize("label", list(FORGERIES))
def test_forged_break_parts_are_refused_and_the_frame_captured_again(
        _genuine: tuple[Path, Path, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture, label: str) -> None:
    pristine, genuine_path, frame = _genuine
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    target = cache / genuine_path.relative_to(pristine)
    target.unlink()
    forgery, why = FORGERIES[label]
    body = persist.dumps(forgery(frame))
    planted = target.parent / (target.name.split("-")[0] + "-" + persist._content_name(body))
    planted.write_bytes(store.seal(body))
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        stats = _call(cache)
    assert not planted.exists(), f"{label}: the forged entry was kept"
    assert stats["frames"] == 1 and stats["disk_hits"] == 2, stats  # _broken captured; its resumes from disk
    lines = [r.getMessage() for r in caplog.records if str(planted) in r.getMessage()]
    assert lines and "not a frame entry" in lines[0] and why in lines[0], (label, lines)


def test_stack_shapes_agree_with_what_capture_passes() -> None:
    # Every resume request capture made for this file's functions matches the bytecode's own shape.
    for fn in (_broken,):
        for ins in code_mod.instructions(fn.__code__)[0]:
            shape = code_mod.stack_shape_at(fn.__code__, ins.offset)
            assert shape is not None and shape.depth >= 0
    # after `print(...)` returns: its result on the stack, no NULL (the CALL took it)
    offsets = [i.offset for i in code_mod.instructions(_broken.__code__)[0] if i.opname == "CALL"]
    after_print = code_mod.next_offset(_broken.__code__, offsets[1])
    assert code_mod.stack_shape_at(_broken.__code__, after_print) == code_mod.StackShape(1, frozenset())
    # before `print`'s CALL: NULL, print, then its two arguments (3.11 counts them off at PRECALL)
    before_args = [i for i in code_mod.instructions(_broken.__code__)[0] if i.opname == "LOAD_CONST"][0]
    assert 0 in code_mod.stack_shape_at(_broken.__code__, before_args.offset).maybe_null


def test_loop_iterators_at_a_break_are_the_frame_s_own() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = "def __glue_loop(L, G, F):\n    __out = __graph_loop_0(L['x'])\n"
    admitted = [
        "    __v0 = iter((1, 2, ))\n",
        "    __v0 = iter(L['___stack0'].__reduce__()[1][0][1:])\n",
        "    __v0 = iter((__out[1], ) + L['___stack0'].__reduce__()[1][0][2:])\n",
        # enumerate over a module's layers: (index, the frame's own layer) pairs
        "    __v9 = L['self']._modules['layer']._modules['1']\n    __v0 = iter(((1, __v9), ))\n",
    ]
    tail = "    __result1 = __const_print_0('it', L['___stack0'].__reduce__()[1][0][0])\n" \
           "    return __resume2(__v0, __result1, __out[0])\n"
    for body in admitted:
        check_glue_source(head + body + tail, "__glue_loop", ["__graph_loop_0"], [],
                          ["__const_print_0", "__resume2"], ["print"])
    refused = [
        "    __v0 = iter(G['hooks'][0:])\n",  # a global's items would be called by the user's loop
        "    __v0 = iter(L['self'].hooks[0:])\n",
        "    __v0 = iter((G['os'].system, ))\n",
        "    __v9 = L['self'].hooks\n    __v0 = iter(((1, __v9), ))\n",
        "    __v0 = iter(((1, G['os'].system), ))\n",
    ]
    for body in refused:
        with pytest.raises(UnsafeSource):
            check_glue_source(head + body + tail, "__glue_loop", ["__graph_loop_0"], [],
                              ["__const_print_0", "__resume2"], ["print"])


def test_torch_calls_at_a_break_are_what_torch_names_now(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch._dynamo, once imported (transformers imports it), wraps torch.manual_seed: the glue holds
    # and calls whatever torch.manual_seed is, found again by that name
    original = torch.manual_seed
    wrapper = functools.wraps(original)(lambda seed: original(seed))
    monkeypatch.setattr(torch, "manual_seed", wrapper)
    assert persist._glue_constant(wrapper) and persist.loads(persist.dumps({"s": wrapper}))["s"] is wrapper
    assert not persist._glue_constant(torch.random.seed)
    assert persist.loads(persist.dumps({"a": torch.arange}))["a"] is torch.arange


def test_try_and_with_blocks_at_a_break_have_one_shape() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    glue = ("def __glue_g(L, G, F):\n    __out = __graph_g_0(L['x'])\n"
            "    __ctx0 = __const_no_grad_0()\n    __ctx0.__enter__()\n"
            "    try:\n        __result2 = __callee1(__out[0])\n"
            "    except BaseException as __exc3:\n"
            "        return __resume4(__ctx0.__exit__, __const_reraise_2(__exc3), __out[0])\n"
            "    return __resume5(__ctx0.__exit__, __result2)\n")
    names = dict(graph_names=["__graph_g_0"], constant_names=["__const_no_grad_0", "__const_reraise_2"],
                 callee_names=["__callee1", "__resume4", "__resume5"], context_names=["__const_no_grad_0"])
    check_glue_source(glue, "__glue_g", **names)
    forged = [
        glue.replace("__result2 = __callee1(__out[0])", "__result2 = L['x'].hook(__out[0])"),  # not a break
        glue.replace("except BaseException", "except __const_no_grad_0"),
        glue.replace("    return __resume5", "    finally:\n        pass\n    return __resume5"),
        glue.replace("        return __resume4(", "        __v9 = __exc3\n        return __resume4("),
        glue.replace("__ctx0 = __const_no_grad_0()", "__ctx0 = L['lock']"),  # exit/enter of a frame object
        glue.replace("__resume4(__ctx0.__exit__", "__resume4(L['lock'].__exit__"),
    ]
    for text in forged:
        with pytest.raises(UnsafeSource):
            check_glue_source(text, "__glue_g", **names)
    with pytest.raises(UnsafeSource):  # the class is not an admitted context manager
        check_glue_source(glue, "__glue_g", **dict(names, context_names=[]))


def test_glue_refills_a_container_of_the_frame_only_with_its_own_items_and_graph_outputs() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = ("def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
            "    __c0 = L['cache'].states\n    __v1 = L['cache'].states[0]\n")
    names = dict(graph_names=["__graph_f_0"], constant_names=[])
    check_glue_source(head + "    __c0[:] = [__v1, __out[0]]\n    return __out[0]\n", "__glue_f", **names)
    for store in ("    __c0[:] = [L['self'].forward, __out[0]]\n",  # an object from elsewhere in the frame
                  "    __v2 = L['other'].states[0]\n    __c0[:] = [__v2]\n",  # another container's item
                  "    __c0[0:1] = [__v1]\n",
                  "    __c3 = G['cache'].states\n    __c3[:] = [__v1]\n"):
        with pytest.raises(UnsafeSource):
            check_glue_source(head + store + "    return __out[0]\n", "__glue_f", **names)


def test_glue_compares_only_values_the_guards_pin_to_numbers_or_tensors() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    body = ("def __glue_compare(L, G, F):\n    __out = __graph_compare_0(L['x'], L['n'])\n"
            "    __v0 = [4, 1, 4]\n    __v1 = [4, L['n'], 4]\n    __result2 = __v0 == __v1\n"
            "    return __resume3(__result2, L['n'], __out[0])\n")
    names = dict(graph_names=["__graph_compare_0"], constant_names=[], callee_names=["__resume3"])
    check_glue_source(body, "__glue_compare", **names, scalar_sources=["L['n']"])
    for sources, glue in ((["L['m']"], body),  # L['n'] could be any object: its __eq__ would run
                          (["L['n']"], body.replace("    __v0 = [4, 1, 4]\n", "    L['n'] = L['y']\n    __v0 = [4, 1, 4]\n")),
                          (["L['n']"], body.replace("[4, L['n'], 4]", "[4, L['n'].owner, 4]"))):
        with pytest.raises(UnsafeSource):
            check_glue_source(glue, "__glue_compare", **names, scalar_sources=sources)


def test_break_methods_are_called_only_on_graph_outputs() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = "def __glue_g(L, G, F):\n    __out = __graph_g_0(L['x'])\n"
    names = dict(graph_names=["__graph_g_0"], constant_names=[], callee_names=["__callee1", "__resume2"],
                 method_names=["item", "system"])
    check_glue_source(head + "    __result0 = __out[0].item()\n    return __resume2(__result0, L['x'])\n",
                      "__glue_g", **names)
    refused = [
        "    __r = __callee1(__out[0])\n    __result0 = __r.system('x')\n",  # a callee's result: any object
        "    __result0 = L['x'].item()\n",
        "    __v = [__out[0]]\n    __result0 = __v.system()\n",
    ]
    for body in refused:
        with pytest.raises(UnsafeSource):
            check_glue_source(head + body + "    return __resume2(__result0, L['x'])\n", "__glue_g", **names)


def _deco(func):
    @functools.wraps(func)
    def wrapper(x):
        return func(x) + 1
    return wrapper


@_deco
def _decorated(x):
    y = x.sin()
    print("decorated", y.shape[0])
    return y.cos()


def test_a_wrapper_s_callee_must_be_the_function_its_closure_holds(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(3, generator=torch.Generator().manual_seed(0))
    cache = tmp_path / "cache"

    def call() -> dict[str, int]:
        with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
            kiln.reset()
            torch.testing.assert_close(kiln.compile(_decorated, options={"opt_level": "-O1"})(x), _decorated(x))
        return kiln.stats()

    store.forget_verdicts()
    assert call()["frames"] == 4
    assert call()["frames"] == 0
    (path, frame), = [(p, f) for p in harness.files(cache, ".entry")
                      for f in [persist.loads(store.read_sealed(str(p)))] if f.glue_name == "__glue_wrapper"]
    assert frame.callees  # the wrapper calls _decorated's own function natively
    forged = _replace(frame, callees={k: _helper for k in frame.callees})
    path.unlink()
    body = persist.dumps(forged)
    planted = path.parent / (path.name.split("-")[0] + "-" + persist._content_name(body))
    planted.write_bytes(store.seal(body))
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        stats = call()
    assert stats["frames"] == 1, stats  # the wrapper captured again; the rest from disk
    assert any("neither named by" in r.getMessage() for r in caplog.records)


class _Encoder(torch.nn.Module):
    def forward(self, x):
        return x


def test_a_submodule_s_forward_is_a_callee_when_the_frame_holds_such_a_module() -> None:
    from kiln.capture.guards import Guard
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    held = [Guard("L['self']._modules['enc']", "check_type", _Encoder)]
    assert persist._module_forward(_Encoder.forward, held)
    assert not persist._module_forward(_Encoder.forward, [])
    assert not persist._module_forward(_helper, held)
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
    names = dict(graph_names=["__graph_f_0"], constant_names=[], callee_names=["__callee0", "__resume1"])
    tail = "    return __resume1(__result0, L['self'])\n"
    check_glue_source(head + "    __v1 = L['self']._modules['enc']\n    __result0 = __callee0(__v1, __out[0])\n"
                      + tail, "__glue_f", **names)
    for receiver in ("L['self'].helper", "G['encoder']", "L['self']._modules['enc'].hooks"):
        with pytest.raises(UnsafeSource):
            check_glue_source(head + f"    __v1 = {receiver}\n    __result0 = __callee0(__v1, __out[0])\n" + tail,
                              "__glue_f", **names)


def test_an_attribute_the_code_names_of_a_frame_value_may_go_to_the_resume_function() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = "def __glue_forward(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
    names = dict(graph_names=["__graph_f_0"], constant_names=[], callee_names=["__resume2"],
                 method_names=["loss_function", "labels"])
    tail = "    return __resume2(__result0, L['self'], __out[0])\n"
    check_glue_source(head + "    __result0 = L['self'].loss_function\n" + tail, "__glue_forward", **names)
    for read in ("L['self'].other_function", "L['self'].loss_function.labels", "G['os'].loss_function",
                 "L['self'].__class__"):
        with pytest.raises(UnsafeSource):
            check_glue_source(head + f"    __result0 = {read}\n" + tail, "__glue_forward", **names)


class _CellModule(torch.nn.Module):
    """`self` and `scale` are cell variables (a comprehension reads them): the glue hands each to
    the resume function as a cell it makes around the frame's value (`__const_cell_0(L['self'])`)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(3)) for _ in range(2)])

    def forward(self, x):
        scale = x.shape[0]
        parts = [w * scale for w in self.weights]
        n = x.max().item()  # a graph break
        return [p + n + self.weights[0] for p in parts]


def test_a_frame_whose_cells_cross_a_break_is_stored_and_read_back(tmp_path: Path) -> None:
    module, x = _CellModule(), torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = module(x)
        for round_ in range(2):
            with kiln.config.patch(cache_dir=str(tmp_path), persistent_cache=True):
                kiln.reset()
                got = kiln.compile(module)(x)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
            stats = kiln.stats()
            assert (stats["frames"], stats["disk_hits"]) == ((2, 0) if round_ == 0 else (0, 2)), stats


def test_a_cell_the_glue_makes_holds_only_what_a_break_may_take() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = "def __glue_forward(L, G, F):\n    __out = __graph_f_0(L['x'])\n    __result0 = __out[0].item()\n"
    names = dict(graph_names=["__graph_f_0"], constant_names=["__const_cell_0"], callee_names=["__resume2"],
                 method_names=["item"], cell_names=["__const_cell_0"])
    tail = "    return __resume2(__result0, __v1, __v2, __v3)\n"
    made = "    __v1 = __const_cell_0(L['self'])\n    __v2 = __const_cell_0(__out[1])\n    __v3 = __const_cell_0()\n"
    check_glue_source(head + made + tail, "__glue_forward", **names)
    with pytest.raises(UnsafeSource):  # not declared a cell: a constant's call on a frame object
        check_glue_source(head + made + tail, "__glue_forward", **{**names, "cell_names": []})
    for inside in ("L['self'].helper", "G['os']", "L['self'], L['x']", "*L['args']"):
        with pytest.raises(UnsafeSource):
            check_glue_source(head + f"    __v1 = __const_cell_0({inside})\n    __v2 = __v3 = 1\n" + tail,
                              "__glue_forward", **names)


def test_a_write_past_a_class_s_own_setattr_is_checked_as_an_attribute_store() -> None:
    """A class with its own __setattr__ (transformers' PretrainedConfig) was traced through it; the
    glue writes the result with `object.__setattr__(owner, 'name', value)`, admitted only where the
    store `owner.name = value` would be (an object read off L, G or F only to a name the frame's code
    stores on one of its own objects), with a literal identifier that is not a dunder."""
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    head = "def __glue_forward(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
    names = dict(graph_names=["__graph_f_0"], constant_names=["__const___setattr___0"],
                 attribute_names=["problem_type"], setattr_names=["__const___setattr___0"])
    tail = "    return __out[0]\n"
    ok = "    __const___setattr___0(L['self']._modules['config'], 'problem_type', 'regression')\n"
    check_glue_source(head + ok + tail, "__glue_forward", **names)
    for bad in ("__const___setattr___0(G['os'], 'problem_type', L['self'])",  # an object, under G
                "__const___setattr___0(L['self'], 'other', L['x'].grad_fn)",  # an object read off L
                "__const___setattr___0(L['self'], '__class__', 1)",
                "__const___setattr___0(L['self'], L['name'], 1)",
                "__const___setattr___0(L['self'], 'problem_type', G['os'].system)",
                "__const___setattr___0(L['self'], 'problem_type', 1, 2)"):
        with pytest.raises(UnsafeSource):
            check_glue_source(head + f"    {bad}\n" + tail, "__glue_forward", **names)
    # persist/frames.py declares every constant that is object.__setattr__ (by value, when read)
    assert persist.frames._GLUE_CALLABLES.count(object.__setattr__) == 1


class _Settings:
    def __init__(self) -> None:
        object.__setattr__(self, "log", [])

    def __setattr__(self, name, value):
        self.log.append(name)
        object.__setattr__(self, name, value)


class _WithSettings(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.settings = _Settings()
        self.settings.mode = "a"

    def forward(self, x):
        self.settings.mode = "b"
        return x * 2


def test_a_frame_writing_through_a_python_setattr_is_stored_and_read_back(tmp_path: Path) -> None:
    x = torch.randn(3)
    for round_ in range(2):
        module = _WithSettings()
        with kiln.config.patch(cache_dir=str(tmp_path), persistent_cache=True):
            kiln.reset()
            got = kiln.compile(module)(x)
        torch.testing.assert_close(got, x * 2)
        assert module.settings.mode == "b" and module.settings.log == ["mode", "mode"]
        stats = kiln.stats()
        assert (stats["frames"], stats["disk_hits"]) == ((1, 0) if round_ == 0 else (0, 1)), stats
