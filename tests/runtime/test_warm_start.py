"""Warm start of real transformers models: a second process serves the frame from disk.

Every transformers model returns a ModelOutput built in its glue, reads its config through two
paths (the model's and a submodule's), and inlines decorated methods; the frame cache stores such
frames with the ModelOutput class named and checked, the second path as an aliasing guard, and
class attributes as records. The two-process test counts captures in the second process (none),
compares with eager, and the rest plant forged records to check that what is read back is verified:
a stored constant that capture does not bind, a class-attribute guard on data, a glue that moves an
object read off the frame into a global, a changed ModelOutput class or enum.
"""
from __future__ import annotations

import enum
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from kiln.capture import persist
from kiln.capture.guards import ABSENT, ClassAttribute, Guard, compile_guards
from kiln.capture.persist.grammar import UnsafeSource, check_glue_source
from kiln.runtime import artifact, records, store
from tests.reliability import cache_harness as harness

_MODEL_SCRIPT = textwrap.dedent("""
    import json, sys, time, traceback
    import torch
    from torch.utils import _pytree as pytree
    from tests.e2e import real_models as rm
    import kiln
    saved, report = sys.argv[1], {}
    for name, mode, seeded in json.loads(sys.argv[2]):
        training = mode == "train"
        entry = rm.MODELS[name]
        kiln.reset()  # counters and in-memory entries per model: each model finds only what is on disk
        try:
            start = time.perf_counter()
            out, grads = rm.run_call(entry.build(), lambda m: kiln.compile(m), entry, training)
            seconds = time.perf_counter() - start
            stats = kiln.stats()
            torch.save(out, f"{saved}/{name}-{mode}.pt")
            want, want_grads = rm.eager_result(entry, training)
            if seeded:  # integer outputs drawn after a reseed (LSH buckets): inductor's randn is not eager's
                out, want = (pytree.tree_map(lambda v: None if isinstance(v, torch.Tensor) and not v.is_floating_point()
                                             else v, tree) for tree in (out, want))
            rm.assert_close_trees(out, want, entry.tol, name)
            if training:
                rm.assert_close_trees(grads, want_grads, entry.tol, name + " grads")
            report[name] = {"frames": stats["frames"], "compiles": stats["compiles"], "disk_hits": stats["disk_hits"],
                            "captured_s": stats.get("compile_time.capture", 0.0), "seconds": seconds}
        except Exception:
            report[name] = {"error": traceback.format_exc()[-3000:]}
    print(json.dumps(report))
""")


def _run_models(code: Path, cache: Path, runs: list[tuple[str, str]], saved: Path) -> dict[str, dict[str, Any]]:
    """Run one call of each corpus model (name, mode) in turn in one fresh process, kiln.reset()
    between them; each model's outputs saved to `saved`/NAME-MODE.pt and compared with eager's
    inside (the integer ones too unless the model is SEEDED). Per model: its counters, or "error"."""
    environment = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": f"{code}{os.pathsep}{harness.REPO}",
                   "KILN_PERSISTENT_CACHE": "1"}
    environment.pop("KILN_LOGS", None)
    saved.mkdir(parents=True, exist_ok=True)
    spec = json.dumps([(name, mode, name in _SEEDED) for name, mode in runs])
    proc = subprocess.run([sys.executable, "-c", _MODEL_SCRIPT, str(saved), spec], capture_output=True, text=True,
                          env=environment, timeout=600 * len(runs), cwd=str(code))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The models of the CI run share two processes (a first that captures all six in turn, a second that
# must serve all six from disk): one process start per model would cost more than most of the models.
# Order: wav2vec2 first, so its lru_cache'd probe is called cold, as in a process of its own.
_SHARED = [("wav2vec2", "infer"), ("gpt2", "infer"), ("distilbert", "train"), ("mistral_cache", "infer"),
           ("mixtral", "infer"), ("reformer", "infer")]


@pytest.fixture(scope="module")
def _shared_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """(folder, first process's report, second's) for the _SHARED models, one cache."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("warm_models")
    code = harness.snapshot(folder)
    cache = folder / "cache"
    first = _run_models(code, cache, _SHARED, folder / "first")
    second = _run_models(code, cache, _SHARED, folder / "second")
    return folder, first, second


@pytest.mark.cpp
# distilbert training: its config's strict-dataclass validators (closures a factory makes per
# field) are inlined when the loss sets config.problem_type, and travel as code (check_code)
# mistral_cache: the glue rebuilds the cache's DynamicLayer objects (`C.__new__(C)` and their
# attributes), a class the frame's own data names (an identity guard rooted at L)
# wav2vec2: a weight-normed conv (torch.nn.utils.parametrize makes its class per module) and an
# lru_cache'd probe marked as having a constant result (is_torch_distributed_available)
# mixtral: the experts' forward is a decorator's wrapper whose closure holds the ExpertsInterface it
# dispatches through (named with its cells' types; the guards check each cell where the trace read it)
# reformer: graph breaks in every attention layer, and a glue that keeps the reversible Function's
# inputs on its ctx (`ctx.layers = layers`, stores the frame's own code makes). Its LSH buckets come
# from torch.randn after a reseed, which inductor draws other than eager (tests/e2e's
# REFORMER_SEEDED_RANDOM): its integer outputs are compared with the first process's, not eager's
@pytest.mark.parametrize("name,mode", [*_SHARED, pytest.param("llama", "train", marks=pytest.mark.slow)])
def test_second_process_runs_a_transformers_model_without_capturing(request: pytest.FixtureRequest, tmp_path: Path,
                                                                     name: str, mode: str) -> None:
    pytest.importorskip("transformers")
    if (name, mode) in _SHARED:
        folder, first_runs, second_runs = request.getfixturevalue("_shared_runs")
    else:  # a model of its own (the slow ones): its own two processes
        folder = tmp_path
        code = harness.snapshot(tmp_path)
        first_runs = _run_models(code, tmp_path / "cache", [(name, mode)], tmp_path / "first")
        second_runs = _run_models(code, tmp_path / "cache", [(name, mode)], tmp_path / "second")
    first, second = first_runs[name], second_runs[name]
    assert "error" not in first, first["error"]
    assert "error" not in second, second["error"]  # outputs compared with eager inside
    assert first["frames"] >= 1 and first["disk_hits"] == 0
    assert second["frames"] == 0 and second["compiles"] == 0, second
    assert second["disk_hits"] >= 1 and second["captured_s"] == 0.0, second
    if name in _SEEDED:  # the same compiled code on the same inputs: the same outputs, integers included
        from torch.utils import _pytree as pytree

        got, want = (pytree.tree_leaves(torch.load(folder / run / f"{name}-{mode}.pt", weights_only=False))
                     for run in ("second", "first"))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, (a, b)


_SEEDED = {"reformer"}  # models whose integer outputs come from random draws after a reseed


# ---------------------------------------------------------------------------------------------------
# What is read back is verified


class Mode(enum.Enum):
    FAST = "fast"


class Config:
    def __init__(self) -> None:
        self.width = 4


class Holder:
    scale = 2
    table = {"a": 1}

    def method(self) -> int:
        return 1

    @property
    def doubled(self) -> int:
        return self.scale * 2


def test_enum_member_property_and_absent_round_trip() -> None:
    for value in (Mode.FAST, Holder.__dict__["doubled"], ABSENT, torch.float16):
        assert persist.loads(persist.dumps(value)) is value
    for value in (Mode.FAST, Holder.__dict__["doubled"]):
        persist._portable_guard(Guard("L['x']", "check_id", value))


def test_changed_enum_or_property_is_stale() -> None:
    member, prop = persist.dumps(Mode.FAST), persist.dumps(Holder.__dict__["doubled"])
    saved = Holder.__dict__["doubled"]
    Holder.doubled = property(lambda self: 3)  # type: ignore[assignment,method-assign]
    Mode.extra = lambda self: 0  # type: ignore[attr-defined]
    persist.class_digest.cache_clear()
    try:
        with pytest.raises(persist.Stale):
            persist.loads(prop)
        with pytest.raises(persist.Stale):
            persist.loads(member)
    finally:
        Holder.doubled = saved  # type: ignore[method-assign]
        del Mode.extra  # type: ignore[attr-defined]
        persist.class_digest.cache_clear()


def test_class_attribute_guard_round_trips_and_checks_the_same() -> None:
    guards = [Guard("", "check_class_attr", ClassAttribute((Holder,), "scale", 2)),
              Guard("", "check_class_attr", ClassAttribute((Holder,), "method", Holder.__dict__["method"])),
              Guard("", "check_class_attr", ClassAttribute((Holder,), "missing", ABSENT))]
    for guard in guards:
        persist._portable_guard(guard)
    fresh = compile_guards(guards)
    loaded = persist.loads(persist.dumps(list(fresh.guards)))
    reused = compile_guards(loaded)
    assert reused.fn({}, {}, None) and fresh.fn({}, {}, None)
    Holder.scale = 3
    try:
        assert not reused.fn({}, {}, None) and not fresh.fn({}, {}, None)
    finally:
        Holder.scale = 2


def _registered(x: Any) -> Any:
    return x


class Registry:
    table = {"eager": _registered, "width": 4}  # a class-level registry (transformers' ExpertsInterface)
    data = {"a": [1]}


def test_class_attribute_dict_is_checked_by_its_items_and_travels_by_them() -> None:
    # A dict read off a class without a source: its items are what the trace used. A registration
    # that changes it in place must fail the guard, in this process and for an entry from disk.
    guard = Guard("", "check_class_attr", ClassAttribute((Registry,), "table", Registry.table))
    persist._portable_guard(guard)
    fresh = compile_guards([guard])
    reused = compile_guards(persist.loads(persist.dumps(list(fresh.guards))))
    assert fresh.fn({}, {}, None) and reused.fn({}, {}, None)
    for change in ({"eager": Holder.method}, {"width": 5}, {"other": _registered}):
        saved = dict(Registry.table)
        Registry.table.update(change)
        try:
            assert not fresh.fn({}, {}, None) and not reused.fn({}, {}, None), change
        finally:
            Registry.table.clear()
            Registry.table.update(saved)
    assert fresh.fn({}, {}, None)


def _weight_normed(name: str = "weight") -> torch.nn.Module:
    from torch.nn.utils import parametrizations

    return parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3), name=name, dim=2 if name == "weight" else 0)


def test_a_class_parametrize_made_travels_by_its_structure() -> None:
    # parametrize makes one class per module: another process's class is another object, checked
    # as what parametrize makes (base, members, torch's own code), never by name
    conv = _weight_normed()
    L = {"m": conv}
    stored = persist._portable_guards([Guard("L['m']", "check_type", type(conv))], (L, {}, None))
    assert [g.kind for g in stored] == ["check_parametrized_type"]
    check = compile_guards(persist.loads(persist.dumps(stored)))
    assert check.fn(L, {}, None) and check.fn({"m": _weight_normed()}, {}, None)

    class ParametrizedConv1d(torch.nn.Conv1d):  # an imitation: same name and module, user code
        __module__ = "torch.nn.utils.parametrize"

        @property
        def weight(self) -> Any:
            return self.parametrizations["weight"]()

    for other in (torch.nn.Conv1d(4, 4, 3), _weight_normed("bias"), ParametrizedConv1d(4, 4, 3)):
        assert not check.fn({"m": other}, {}, None), other


def test_class_attribute_guard_on_data_is_refused() -> None:
    # A dict holding data objects: another process could hold other contents under the same names.
    guard = Guard("", "check_class_attr", ClassAttribute((Registry,), "data", Registry.data))
    with pytest.raises(persist.NotPortable):
        persist._portable_guard(guard)


def test_second_path_to_an_unnamed_object_becomes_an_aliasing_guard() -> None:
    config = Config()
    L = {"self": {"config": config, "inner": {"config": config}}}
    guards = [Guard("L['self']['config']", "check_type", Config),
              Guard("L['self']['inner']['config']", "check_id", config)]
    stored = persist._portable_guards(guards, (L, {}, None))
    assert [g.kind for g in stored] == ["check_type", "check_aliasing"]
    check = compile_guards(persist.loads(persist.dumps(stored)))
    assert check.fn(L, {}, None)
    other = {"self": {"config": Config(), "inner": {"config": Config()}}}
    assert not check.fn(other, {}, None)  # two configs where the trace saw one
    same = Config()
    assert check.fn({"self": {"config": same, "inner": {"config": same}}}, {}, None)
    with pytest.raises(persist.NotPortable):  # no frame to find the first path on: not stored
        persist._portable_guards(guards, None)


@dataclass
class NotAnOutput:
    logits: Optional[torch.Tensor] = None


def _frame(constants: dict[str, Any], glue: str = "") -> persist.StoredFrame:
    source = glue or ("def __glue_f(L, G, F):\n"
                      "    __out = __graph_f_0(L['x'])\n"
                      "    return __const_Out_0(logits=__out[0])\n")
    graphs = {"__graph_f_0": artifact.Recipe("aot", {})}  # read back, never rebuilt here
    return persist.StoredFrame(persist.FORMAT, (Guard("L['x']", "check_type", torch.Tensor),), "__glue_f", source,
                               graphs, constants)


def _read_back(tmp_path: Path, frame: persist.StoredFrame) -> persist.StoredFrame | None:
    data = persist.dumps(frame)
    path = tmp_path / persist._content_name(data)
    path.write_bytes(store.seal(data))
    loaded = persist._read(str(path))
    assert (loaded is None) == (not path.exists())  # a refused entry is deleted
    return loaded


def test_stored_glue_constants_are_only_what_capture_binds(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    output = transformers.modeling_outputs.CausalLMOutputWithPast
    loaded = _read_back(tmp_path, _frame({"__const_Out_0": output}))
    assert loaded is not None and loaded.constants["__const_Out_0"] is output
    # a trusted module's function by name (os.system) or a dataclass that is no ModelOutput: refused
    assert _read_back(tmp_path, _frame({"__const_Out_0": os.system})) is None
    assert _read_back(tmp_path, _frame({"__const_Out_0": NotAnOutput})) is None
    assert _read_back(tmp_path, _frame({"__evil": torch._C._set_grad_enabled})) is None


def test_changed_model_output_class_is_stale() -> None:
    transformers = pytest.importorskip("transformers")
    output = transformers.modeling_outputs.CausalLMOutputWithPast
    data = persist.dumps(_frame({"__const_Out_0": output}))
    output.extra = lambda self: 0
    persist.class_digest.cache_clear()
    try:
        with pytest.raises(persist.Stale):
            persist.loads(data)
    finally:
        del output.extra
        persist.class_digest.cache_clear()


def test_glue_moves_frame_objects_only_into_the_frame_s_own_containers() -> None:
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
    fine = [
        "    __v1 = L['kwargs']['a']\n    __d0 = {'a': __v1}\n    L['kwargs'].clear()\n    L['kwargs'].update(__d0)\n",
        "    __o = __const_Out_0(logits=__out[0])\n    __o['past'] = L['cache']\n    return __o\n",
        "    G['mod'].__dict__['state'].flag = None\n",
    ]
    for body in fine:
        check_glue_source(head + body, "__glue_f", ["__graph_f_0"], ["__const_Out_0"])
    refused = [
        "    G['mod'].hook = L['self'].forward\n",  # an object read off the frame planted in a global
        "    G['table']['key'] = L['fn']\n",
        "    G['table'].update({'key': L['fn']})\n",
        "    L['kwargs'].pop('a')\n",
        "    L['self'].__class__ = L['other']\n",
        "    __const_Out_0 = L['fn']\n",
    ]
    for body in refused:
        with pytest.raises(UnsafeSource):
            check_glue_source(head + body, "__glue_f", ["__graph_f_0"], ["__const_Out_0"])


def test_forged_member_reference_is_refused() -> None:
    # A "member" reference must find a property/staticmethod/classmethod in the class's dict.
    forged = ("member", __name__, "Holder.method", persist._member_digest(Holder.__dict__["method"]))
    with pytest.raises((persist.Stale, records.RecordError)):
        persist._decode_named(forged)
    with pytest.raises(records.RecordError):  # a digest-free member of a module that is not trusted
        persist._decode_named(("member", __name__, "Holder.doubled", None))


def test_guard_sources_read_library_dunders_but_not_globals() -> None:
    from kiln.capture.persist.grammar import check_guard_source

    check_guard_source("type(L['self'].config).__validators__")
    check_guard_source("L['self'].forward.__func__")
    for text in ("L['f'].__globals__['os']", "type(L['x']).__subclasses__", "L['m'].__builtins__"):
        with pytest.raises(UnsafeSource):
            check_guard_source(text)


def test_small_constant_tensors_travel_as_data_and_forged_ones_are_refused() -> None:
    for t in (torch.tensor(-100), torch.arange(6.0).view(2, 3).t(), torch.tensor([True, False]), torch.zeros(0, 3)):
        back = records.loads(records.dumps(t))
        assert back.dtype == t.dtype and back.stride() == t.stride() and torch.equal(back, t)
        assert back.data_ptr() != t.data_ptr() or t.numel() == 0
    for big_or_not_data in (torch.zeros(1 << 15), torch.zeros(2, requires_grad=True), torch.nn.Parameter(torch.zeros(2))):
        assert records.REFERENCES["tensor"].encode(big_or_not_data) is None
        with pytest.raises(records.RecordError):  # pickled by torch's own reducer: refused on reading
            records.loads(records.dumps(big_or_not_data))
    ok = records.REFERENCES["tensor"].encode(torch.arange(4, dtype=torch.int64))
    forged = [(ok[0], ok[1], ok[2], ok[3][:-1]),  # bytes that do not fill the sizes
              ("object", ok[1], ok[2], ok[3]),  # not a dtype of the table
              (ok[0], (2, 2), (0, 1), ok[3])]  # overlapping strides
    for data in forged:
        with pytest.raises(records.RecordError):
            records.REFERENCES["tensor"].decode(data)


def test_wrapper_recipe_constants_are_data_only() -> None:
    # The frame cache's reader names trusted functions (os.system is the standard library's): a
    # forged wrapper recipe binding one under a constant's name is refused before anything runs.
    from kiln.runtime import kernel_wrapper

    source = "def call(args):\n    (x,) = args\n    args.clear()\n    return (aten_abs(x),)\n"
    forged = kernel_wrapper.WrapperRecipe(source, {"aten_abs": os.system}, {}, None, None)
    data = persist.dumps(forged)
    loaded = persist.loads(data)
    assert loaded.constants["aten_abs"] is os.system  # the reference decodes: the loader must refuse
    with pytest.raises(ValueError, match="wrapper constant"):
        kernel_wrapper.load_wrapper(loaded)


def test_entries_are_read_only_for_calls_with_their_local_types(tmp_path: Path) -> None:
    config = Config()
    stored_for = persist.discriminator({"self": config, "kwargs": {}})
    entry = persist.DiskEntry(str(tmp_path / f"{stored_for}-{'0' * 24}.entry"), stored_for)
    assert entry.matches({"self": Config(), "kwargs": {"other": 1}})  # types only, never values
    assert not entry.matches({"self": Holder(), "kwargs": {}})
    assert entry._check is None  # nothing read yet
    legacy = persist.DiskEntry(str(tmp_path / f"{'0' * 24}.entry"), None)
    assert legacy.matches({"self": Holder()})
    # a file that cannot be read gives a check that never passes (and no payload)
    assert not entry.check.fn({"self": config, "kwargs": {}}, {}, None)
    with pytest.raises(persist.Stale):
        entry.payload
    assert persist._split_name(f"{stored_for}-abc.entry") == (stored_for, "abc.entry")
    assert persist._split_name("abc.entry") == (None, "abc.entry")


# ---------------------------------------------------------------------------------------------------
# A function whose closure holds a data object (transformers' use_experts_implementation: the
# experts' forward holds the ExpertsInterface it dispatches through)


class Dispatch:
    def __init__(self) -> None:
        self.mode = "fast"


class OtherDispatch(Dispatch):
    pass


def _dispatching(dispatch: Any) -> Any:
    def forward(x: Any) -> Any:
        return x if dispatch.mode == "fast" else -x
    return forward


dispatched = _dispatching(Dispatch())
dispatched.__qualname__ = "dispatched"  # named at module level, as a decorated method is by its class


def _closure_guards(cell_type: Any = Dispatch, cell_source: str = "L['f'].__closure__[0].cell_contents") -> list:
    return [Guard("L['f']", "check_id", dispatched),
            Guard(cell_source, "check_type", cell_type),
            Guard("L['f'].__closure__[0].cell_contents.mode", "check_value", "fast")]


def test_function_with_data_in_its_closure_travels_with_its_cells_guarded() -> None:
    with pytest.raises(persist.NotPortable):  # by content, as before: the cell's object has no name
        persist.function_digest(dispatched)
    fresh = compile_guards(_closure_guards())
    for guard in fresh.guards:
        persist._portable_guard(guard)
    loaded = persist.loads(persist.dumps(list(fresh.guards)))
    assert loaded[0].expected is dispatched
    reused = compile_guards(loaded)
    L = {"f": dispatched}
    assert fresh.fn(L, {}, None) and reused.fn(L, {}, None)
    cell = dispatched.__closure__[0]  # type: ignore[index]
    saved = cell.cell_contents
    try:
        saved.mode = "slow"  # what the trace read of the object: the guards still compare it
        assert not fresh.fn(L, {}, None) and not reused.fn(L, {}, None)
        saved.mode = "fast"
        cell.cell_contents = OtherDispatch()  # another kind of object in the cell
        assert not reused.fn(L, {}, None)
    finally:
        saved.mode = "fast"
        cell.cell_contents = saved


def test_function_with_unguarded_data_in_its_closure_is_refused(tmp_path: Path) -> None:
    # no type guard on the cell, one at another source or of another type, or the function named
    # where no guard reads its cells (a class attribute's value): no entry reads it back
    for guards in (_closure_guards()[:1], _closure_guards(cell_source="L['g'].__closure__[0].cell_contents"),
                   _closure_guards(cell_type=OtherDispatch),
                   [Guard("", "check_class_attr", ClassAttribute((Holder,), "hook", dispatched))]):
        data = persist.dumps(guards)
        with pytest.raises(records.RecordError):
            persist.loads(data)
    with pytest.raises(records.RecordError):
        persist.loads(persist.dumps(dispatched))
    frame = _frame({}, "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n    return __out[0]\n")
    forged = persist.StoredFrame(frame.format, (*frame.guards, *_closure_guards()[:1]), frame.glue_name,
                                 frame.glue_source, frame.graphs)
    assert _read_back(tmp_path, forged) is None
    kept = persist.StoredFrame(frame.format, (*frame.guards, *_closure_guards()), frame.glue_name,
                               frame.glue_source, frame.graphs)
    assert _read_back(tmp_path, kept) is not None


def test_changed_cell_of_a_function_with_data_in_its_closure_is_stale() -> None:
    data = persist.dumps(_closure_guards())
    cell = dispatched.__closure__[0]  # type: ignore[index]
    saved = cell.cell_contents
    cell.cell_contents = OtherDispatch()  # the same code holding another kind of object
    try:
        with pytest.raises(persist.Stale):
            persist.loads(data)
    finally:
        cell.cell_contents = saved
    assert persist.loads(data)[0].expected is dispatched


def test_glue_sets_attributes_only_as_the_frame_s_code_does() -> None:
    # An autograd Function's forward keeps its inputs on ctx (Reformer's reversible layers): the
    # glue replays `ctx.layers = layers`, an attribute the frame's own code stores, on the frame's
    # own object, with the frame's own values. Nothing else moves an object into an attribute.
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"

    def check(body: str, attributes: Any = ("layers", "buckets", "__class__"), scalars: Any = ()) -> None:
        check_glue_source(head + body, "__glue_f", ["__graph_f_0"], [], scalar_sources=scalars,
                          attribute_names=attributes)

    fine = [
        "    L['ctx'].layers = L['layers']\n",
        "    __v0 = L['all'][0]\n    __v1 = L['___stack1'][3]\n    L['ctx'].buckets = (__v0, __v1)\n",
        "    L['ctx'].buckets = (__out[0], L['all'][1])\n",
        "    __c = L['n'] == 3\n    L['ctx'].layers = L['layers']\n    return __c\n",
    ]
    for body in fine:
        check(body, scalars=["L['n']"])
    refused = [
        ("    L['ctx'].layers = L['layers']\n", ()),  # the frame's code stores no such attribute
        ("    L['ctx'].hook = L['layers']\n", ("layers",)),
        ("    L['ctx'].__class__ = L['other']\n", None),  # never a dunder
        ("    G['mod'].layers = L['layers']\n", None),  # never on a global's object
        ("    L['self'].inner.layers = L['layers']\n", None),  # nor on one reached through an attribute
        ("    L['ctx'].layers = L['self'].forward\n", None),  # nor a value read through an attribute
        ("    L['ctx'].layers = G['os']\n", None),
        ("    __v0 = L['self'].forward\n    L['ctx'].layers = (__v0,)\n", None),
        ("    L['ctx'].layers = L['layers']\n    __c = L['n'] == 3\n    return __c\n", None),  # compared after
    ]
    for body, attributes in refused:
        with pytest.raises(UnsafeSource):
            check(body, ("layers", "buckets", "__class__") if attributes is None else attributes, ["L['n']"])


def _keeps_on_ctx(ctx: Any, layers: Any) -> None:
    ctx.layers = layers


def test_stored_attributes_are_those_the_frame_s_code_stores() -> None:
    assert persist._stored_attributes(_keeps_on_ctx.__code__) == {"layers"}
    frame = persist.StoredFrame(persist.FORMAT, (Guard("L['x']", "check_type", torch.Tensor),), "__glue_f",
                                "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
                                "    L['ctx'].layers = L['layers']\n    return __out[0]\n",
                                {"__graph_f_0": artifact.Recipe("aot", {})})
    persist.check_texts(frame, _keeps_on_ctx.__code__)
    with pytest.raises(UnsafeSource):  # read without its code, or with another code: refused
        persist.check_texts(frame)
    with pytest.raises(UnsafeSource):
        persist.check_texts(frame, _registered.__code__)
