"""The persistent frame cache (kiln.capture.persist): a second process loads what the first stored.

Each test writes a small script, runs it in fresh processes sharing one KILN_CACHE_DIR, and reads
back per call: how many entries came from disk, how many frames were captured, and the largest
difference from eager (outputs, and gradients for the training step). A changed source, global,
inlined method, shape, dtype or requires_grad must never be answered by a stored entry.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from kiln.capture import persist
from kiln.capture.guards import Guard, compile_guards

REPO = Path(__file__).resolve().parents[2]

_FUNCTION_SCRIPT = textwrap.dedent("""
    import json, os, torch, kiln
    SCALE = float(os.environ["SCALE"])

    def f(x, y):
        return torch.OP(x) * y + SCALE

    compiled = kiln.compile(f, options={"opt_level": "-O1"})  # faster builds
    report = []
    for shape, dtype, grad in json.loads(os.environ["CALLS"]):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=g, dtype=getattr(torch, dtype)).requires_grad_(grad)
        y = torch.randn(shape, generator=g, dtype=getattr(torch, dtype))
        before = kiln.stats()
        out = compiled(x, y)
        after = kiln.stats()
        err = (out - f(x, y)).abs().max().item()
        report.append([after["disk_hits"] - before["disk_hits"], after["frames"] - before["frames"], err])
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": report, "kiln": environment_digest()}))
""")

_MODULE_SCRIPT = textwrap.dedent("""
    import json, torch, kiln

    class Inner(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * FACTOR

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.inner = Inner()

        def forward(self, x, target):
            return torch.nn.functional.mse_loss(self.inner(self.fc(x)), target)

    torch.manual_seed(0)
    net, ref = Net(), Net()
    ref.load_state_dict(net.state_dict())
    x, target = torch.randn(5, 8), torch.randn(5, 4)
    compiled = kiln.compile(net, options={"opt_level": "-O1"})  # faster builds
    loss = compiled(x, target)
    loss.backward()
    expected = ref(x, target)
    expected.backward()
    err = max([(loss - expected).abs().item()]
              + [(p.grad - q.grad).abs().max().item() for p, q in zip(net.parameters(), ref.parameters())])
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": [kiln.stats()["disk_hits"], kiln.stats()["frames"], err, kiln.stats()["graphs"]],
                      "kiln": environment_digest()}))
""")


_SEEN_KILN: dict[Path, str] = {}


def _run(path: Path, cache: Path, **env: str) -> Any:
    """The script's report; skips the test if Kiln's own sources changed since the cache's first
    run (they are part of every key: a developer editing Kiln while this runs gets misses)."""
    environment = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO),
                   "KILN_PERSISTENT_CACHE": "1", **env}
    environment.pop("KILN_LOGS", None)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=environment,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if _SEEN_KILN.setdefault(cache, out["kiln"]) != out["kiln"]:
        pytest.skip("Kiln's sources changed between the runs of this test")
    return out["report"]


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_second_process_loads_the_frame_and_changes_are_never_stale(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    base = [[[8, 16], "float32", False]]
    script = _script(tmp_path, "f.py", _FUNCTION_SCRIPT.replace("OP", "sin"))
    first = _run(script, cache, SCALE="2.0", CALLS=json.dumps(base))
    assert first[0][:2] == [0, 1] and first[0][2] < 1e-5
    assert list((cache / "frames").rglob("*.entry")), "the capture was not stored"

    # Another shape, dtype or requires_grad first (none may take the stored entry), then the
    # stored call itself, answered from disk without a capture.
    calls = [[[4, 16], "float32", False], [[8, 16], "float64", False], [[8, 16], "float32", True]] + base
    second = _run(script, cache, SCALE="2.0", CALLS=json.dumps(calls))
    for disk_hits, frames, err in second[:3]:
        assert (disk_hits, frames) == (0, 1) and err < 1e-5
    assert second[3][:2] == [1, 0] and second[3][2] < 1e-5

    # A changed global the trace read, and a changed source: captured anew, with the new result.
    changed_global = _run(script, cache, SCALE="3.0", CALLS=json.dumps(base))
    assert changed_global[0][:2] == [0, 1] and changed_global[0][2] < 1e-5
    other = _script(tmp_path, "f.py", _FUNCTION_SCRIPT.replace("OP", "cos"))
    changed_source = _run(other, cache, SCALE="2.0", CALLS=json.dumps(base))
    assert changed_source[0][:2] == [0, 1] and changed_source[0][2] < 1e-5


def test_training_step_from_disk_and_inlined_method_change(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = _script(tmp_path, "net.py", "FACTOR = 2.0\n" + _MODULE_SCRIPT)
    assert _run(script, cache)[:2] == [0, 1]
    disk_hits, frames, err, graphs = _run(script, cache)
    assert (disk_hits, frames, graphs) == (1, 0, 1) and err < 1e-5  # the loaded graph is counted
    # Inner.forward is inlined into Net.forward's graph: its new body must not meet the old entry.
    changed = _script(tmp_path, "net.py", "FACTOR = 2.0\n" + _MODULE_SCRIPT.replace("torch.relu(x)", "torch.tanh(x)"))
    disk_hits, frames, err, graphs = _run(changed, cache)
    assert (disk_hits, frames) == (0, 1) and err < 1e-5


_HELPER_SCRIPT = textwrap.dedent("""
    import json, torch, kiln

    def helper(x):
        return x * BODY

    def f(x):
        return helper(x).sin()

    x = torch.randn(8)
    out = kiln.compile(f, options={"opt_level": "-O1"})(x)
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": [kiln.stats()["disk_hits"], kiln.stats()["frames"], (out - f(x)).abs().max().item()],
                      "kiln": environment_digest()}))
""")


def test_changed_global_function_is_not_stale(tmp_path: Path) -> None:
    # f's code is unchanged; the guard on G['helper'] travels as helper's name plus a digest of its code.
    cache = tmp_path / "cache"
    assert _run(_script(tmp_path, "h.py", _HELPER_SCRIPT.replace("BODY", "2")), cache)[:2] == [0, 1]
    disk_hits, frames, err = _run(_script(tmp_path, "h.py", _HELPER_SCRIPT.replace("BODY", "3")), cache)
    assert (disk_hits, frames) == (0, 1) and err < 1e-5


_PROBE_SCRIPT = textwrap.dedent("""
    import functools, json, os, torch, kiln

    def _constant(fn):  # transformers' _make_compile_constant: assume_constant_result without torch
        fn._dynamo_marked_constant = True
        return fn

    @functools.lru_cache
    @_constant
    def probe_cached():
        return os.environ["PROBE"] in ("1", "cached")

    @_constant
    def probe_plain():
        return os.environ["PROBE"] == "1"

    def f(x):
        if probe_cached():
            x = x.sin()
        if probe_plain():
            return x + 1
        return x.cos()

    x = torch.randn(8)
    out = kiln.compile(f, options={"opt_level": "-O1"})(x)
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": [kiln.stats()["disk_hits"], kiln.stats()["frames"], (out - f(x)).abs().max().item()],
                      "kiln": environment_digest()}))
""")


def test_constant_result_probes_are_stored_and_called_again_by_the_next_process(tmp_path: Path) -> None:
    # An lru_cache'd probe marked as constant (transformers' is_torch_distributed_available) is
    # stored by name; its result is constant within a process only, so a process whose probes
    # answer otherwise (another environment) must capture anew, for the plain probe as well.
    cache = tmp_path / "cache"
    script = _script(tmp_path, "probe.py", _PROBE_SCRIPT)
    assert _run(script, cache, PROBE="1")[:2] == [0, 1]
    assert _run(script, cache, PROBE="1")[:2] == [1, 0]
    for other in ("cached", "0"):  # the plain probe changes; then both
        disk_hits, frames, err = _run(script, cache, PROBE=other)
        assert (disk_hits, frames) == (0, 1) and err < 1e-5, other


_NAMEDTUPLE_SCRIPT = textwrap.dedent("""
    import collections, json, torch, kiln

    Pair = collections.namedtuple("Pair", ["first", "second"])

    def f(x):
        return Pair(x.sin(), x.cos() * 2)  # the glue builds the namedtuple from the graph's outputs

    x = torch.randn(8)
    out = kiln.compile(f, options={"opt_level": "-O1"})(x)
    want = f(x)
    assert type(out) is Pair
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": [kiln.stats()["disk_hits"], kiln.stats()["frames"],
                                 max((a - b).abs().max().item() for a, b in zip(out, want))],
                      "kiln": environment_digest()}))
""")


def test_namedtuple_built_by_the_glue_is_stored(tmp_path: Path) -> None:
    # transformers' Reformer returns namedtuples (LSHSelfAttentionOutput ...) from its layers
    cache = tmp_path / "cache"
    script = _script(tmp_path, "pair.py", _NAMEDTUPLE_SCRIPT)
    assert _run(script, cache)[:2] == [0, 1]
    disk_hits, frames, err = _run(script, cache)
    assert (disk_hits, frames) == (1, 0) and err < 1e-5


_LEN_SCRIPT = textwrap.dedent("""
    import json, torch, kiln

    class Cache:
        def __init__(self):
            self.layers = [1, 2, 3]

        def __len__(self):  # inlined by len(cache): guarded as type(L['cache']).__len__
            return len(self.layers)

        def __bool__(self):
            return bool(self.layers)

    def f(x, cache):
        return x * len(cache) if cache else x

    x = torch.randn(8)
    out = kiln.compile(f, options={"opt_level": "-O1"})(x, Cache())
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": [kiln.stats()["disk_hits"], kiln.stats()["frames"],
                                 (out - f(x, Cache())).abs().max().item()],
                      "kiln": environment_digest()}))
""")


def test_len_and_bool_written_in_python_are_read_by_stored_guards(tmp_path: Path) -> None:
    # Reformer's ReformerDynamicCache.__len__
    cache = tmp_path / "cache"
    script = _script(tmp_path, "length.py", _LEN_SCRIPT)
    assert _run(script, cache)[:2] == [0, 1]
    disk_hits, frames, err = _run(script, cache)
    assert (disk_hits, frames) == (1, 0) and err < 1e-5
    changed = _script(tmp_path, "length.py", _LEN_SCRIPT.replace("return len(self.layers)", "return 2"))
    disk_hits, frames, err = _run(changed, cache)  # the inlined __len__ changed: captured anew
    assert (disk_hits, frames) == (0, 1) and err < 1e-5


_NUMPY_SCRIPT = textwrap.dedent("""
    import json, numpy as np, torch, kiln

    def f(x, flag):
        y = x * np.pi                    # G['np']: numpy by name (its version is in the key)
        return y.sin() if flag else y.cos()

    x = torch.randn(8)
    report = []
    for flag in json.loads(FLAGS):
        flag = np.bool_(flag)            # a numpy comparison's result: guarded by value
        before = kiln.stats()
        out = kiln.compile(f, options={"opt_level": "-O1"})(x, flag)
        after = kiln.stats()
        report.append([after["disk_hits"] - before["disk_hits"], after["frames"] - before["frames"],
                       (out - f(x, flag)).abs().max().item()])
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": report, "kiln": environment_digest()}))
""")


def test_numpy_module_and_numpy_bools_travel(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _script(tmp_path, "np_true.py", _NUMPY_SCRIPT.replace("FLAGS", "'[true]'"))
    assert _run(first, cache)[0][:2] == [0, 1]
    both = _script(tmp_path, "np_true.py", _NUMPY_SCRIPT.replace("FLAGS", "'[true, false]'"))
    report = _run(both, cache)
    assert report[0][:2] == [1, 0] and report[1][:2] == [0, 1], report  # numpy.False_ does not take True_'s entry
    assert all(err < 1e-5 for *_, err in report)


def test_numpy_version_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy

    before = persist.environment_digest()
    persist.environment_digest.cache_clear()
    monkeypatch.setattr(numpy, "__version__", "0.0.1")
    try:
        assert persist.environment_digest() != before
    finally:
        persist.environment_digest.cache_clear()


def test_changed_lowering_limits_are_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limit of kiln.lower changed in-process (tests do it) must not find frames whose graphs were
    compiled under the old one; unchanged limits give the key of a process without kiln.lower."""
    from kiln.capture.options import CompileOptions
    from kiln.lower import conv_layout

    def f(x):
        return x + 1

    options = CompileOptions(backend="inductor")
    before = persist.frame_key(f.__code__, options)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_GEMM_MACS", conv_layout.SMALL_CONV_GEMM_MACS + 1)
    changed = persist.frame_key(f.__code__, options)
    monkeypatch.undo()
    assert changed != before and persist.frame_key(f.__code__, options) == before
    monkeypatch.delitem(sys.modules, "kiln.lower.conv_layout")
    assert persist.frame_key(f.__code__, options) == before


_NONZERO_SCRIPT = textwrap.dedent("""
    import json, torch, kiln

    def f(x):
        rows, cols = (x > 0).nonzero(as_tuple=True)  # views of one base whose size is the count
        return rows, cols, x.sum()

    compiled = kiln.compile(f, options={"opt_level": "-O1"})
    report = []
    for seed in (0, 1):  # two counts of positive elements
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
        before = kiln.stats()
        out, want = compiled(x), f(x)
        after = kiln.stats()
        report.append([after["disk_hits"] - before["disk_hits"], after["frames"] - before["frames"],
                       torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
                       and torch.allclose(out[2], want[2], atol=1e-5), out[0].shape[0]])  # a sum of 20 ~1s
    from kiln.capture.persist import environment_digest
    print(json.dumps({"report": report, "kiln": environment_digest()}))
""")


def test_views_sized_by_their_base_s_unbacked_dim_are_stored(tmp_path: Path) -> None:
    # Longformer's _get_global_attn_indices returns nonzero(as_tuple=True)'s columns: views whose
    # size is a dim of the base the graph returns, read back at run time (aot.BaseDim)
    cache = tmp_path / "cache"
    script = _script(tmp_path, "nonzero.py", _NONZERO_SCRIPT)
    first = _run(script, cache)
    assert first[0][:2] == [0, 1] and all(r[2] for r in first), first
    second = _run(script, cache)
    assert [r[1] for r in second] == [0, 0] and second[0][0] == 1, second
    assert all(r[2] for r in second) and second[0][3] != second[1][3], second


def test_only_classes_namedtuple_made_are_glue_constants() -> None:
    import collections
    from typing import NamedTuple

    made = collections.namedtuple("made", "x y")

    class Typed(NamedTuple):
        x: int

    class Derived(made):  # its own class between: a user constructor could live there
        pass

    class Imitation(tuple):
        _fields = ("x",)

        def __new__(cls, x):  # noqa: ANN001, ANN204
            return tuple.__new__(cls, (x,))

    with_init = collections.namedtuple("with_init", "x")
    with_init.__init__ = lambda self, x: None  # type: ignore[assignment,misc]
    assert persist._glue_constant(made) and persist._glue_constant(Typed)
    assert not any(persist._glue_constant(c) for c in (Derived, Imitation, with_init))


def test_switch_off_stores_and_loads_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = _script(tmp_path, "f.py", _FUNCTION_SCRIPT.replace("OP", "sin"))
    calls = json.dumps([[[8, 16], "float32", False]])
    for _ in range(2):
        assert _run(script, cache, SCALE="2.0", CALLS=calls, KILN_PERSISTENT_CACHE="0")[0][:2] == [0, 1]
    assert not (cache / "frames").exists()


# ---------------------------------------------------------------------------------------------------
# In-process: which guards travel


class _Opaque:
    pass


def test_identity_of_an_arbitrary_object_is_not_portable() -> None:
    with pytest.raises(persist.NotPortable):
        persist._portable_guard(Guard("G['obj']", "check_id", _Opaque()))
    with pytest.raises(persist.NotPortable):
        persist._portable_guard(Guard("G['obj']", "check_value", [1, 2]))
    persist._portable_guard(Guard("G['torch']", "check_id", torch))
    persist._portable_guard(Guard("G['n']", "check_value", 3))


def test_local_class_and_tensor_are_not_portable_but_named_ones_round_trip() -> None:
    class Local:
        pass

    for value in (Local, torch.zeros(2, requires_grad=True)):  # small constant tensors are data
        with pytest.raises(persist.NotPortable):
            persist.dumps(value)
    guards = [Guard("G['torch']", "check_id", torch), Guard("L['x']", "check_type", _Opaque)]
    loaded = persist.loads(persist.dumps(guards))
    assert loaded[0].expected is torch and loaded[1].expected is _Opaque
    check = compile_guards(loaded)
    assert check.fn({"x": _Opaque()}, {"torch": torch}, None)
    assert persist.loads(persist.dumps(torch.float32)) is torch.float32


def test_changed_class_is_stale() -> None:
    data = persist.dumps(_Opaque)
    original = _Opaque.__dict__.get("method")
    _Opaque.method = lambda self: 1  # type: ignore[attr-defined]
    persist.class_digest.cache_clear()
    try:
        with pytest.raises(persist.Stale):
            persist.loads(data)
    finally:
        del _Opaque.method  # type: ignore[attr-defined]
        assert original is None
        persist.class_digest.cache_clear()


def test_guards_read_back_check_the_same() -> None:
    # The guard function is generated again from the stored records, never read back as code.
    x = torch.randn(3, 4)
    guards = [Guard("G['torch']", "check_id", torch), Guard("L['n']", "check_value", 3),
              Guard("L['x']", "check_tensor", persist.TensorSpec.of(x))]
    fresh = compile_guards(guards)
    reused = compile_guards(persist.loads(persist.dumps(list(fresh.guards))))
    assert reused.source == fresh.source
    for L in ({"n": 3, "x": x}, {"n": 4, "x": x}, {"n": 3, "x": torch.randn(4, 4)}):
        assert reused.fn(L, {"torch": torch}, None) == fresh.fn(L, {"torch": torch}, None)


def _make_validator(limit: int, scale: float = 1.0):
    def validator(value, *, strict=True):
        return value < limit * scale
    return validator


def test_identity_of_a_local_function_travels_as_its_code() -> None:
    # A library's per-field validator (a closure made by a factory) cannot be found by name in
    # another process; the trace inlined its code, so it is guarded by code, globals and defaults.
    from kiln.capture.guards import FunctionCode

    one, other = _make_validator(3), _make_validator(5)
    (guard,) = persist._portable_guards([Guard("L['v']", "check_id", one)], None)
    assert guard.kind == "check_code" and isinstance(guard.expected, FunctionCode)
    check = compile_guards(persist.loads(persist.dumps([guard])))
    assert check.fn({"v": one}, {}, None) and check.fn({"v": other}, {}, None)  # cells are guarded where read
    assert not check.fn({"v": _make_validator.__code__}, {}, None)
    assert not check.fn({"v": lambda value, *, strict=True: True}, {}, None)
    changed = _make_validator(3)
    changed.__kwdefaults__ = {"strict": False}
    assert not check.fn({"v": changed}, {}, None)


def test_forged_local_code_reference_is_refused() -> None:
    code = _make_validator(1).__code__
    kind, module, qualname, digest = persist._encode_local_code(code)
    assert persist._decode_local_code(module, qualname, digest) is code
    with pytest.raises(persist.Stale):  # another digest: the code changed, or the record was forged
        persist._decode_local_code(module, qualname, "0" * 64)
    with pytest.raises(persist.Stale):
        persist._decode_local_code(module, "_make_validator.<locals>.other", digest)
    with pytest.raises(persist.NotPortable):  # not local to a function
        persist._encode_local_code(_make_validator.__code__)


class _Layer:
    pass


def test_glue_rebuilds_objects_only_of_classes_the_frame_s_data_holds() -> None:
    from kiln.capture.persist.grammar import UnsafeSource, check_glue_source

    tied_by_type = [Guard("L['cache'].layers[0]", "check_type", _Layer)]
    tied_by_identity = [Guard("L['cache'].layer_class", "check_id", _Layer)]
    from_a_global = [Guard("G['Layer']", "check_id", _Layer)]
    assert persist._built_class(_Layer, tied_by_type) and persist._built_class(_Layer, tied_by_identity)
    assert not persist._built_class(_Layer, from_a_global) and not persist._built_class(_Layer, [])

    def builds_one():  # a frame that makes a _Layer itself
        return _Layer()

    def builds_other():
        return _Opaque()

    assert persist._built_class(_Layer, [], builds_one.__code__)
    assert not persist._built_class(_Layer, [], builds_other.__code__)
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n    __c0 = L['cache'].layers\n"
    fine = "    __o = __const_Layer_0.__new__(__const_Layer_0)\n    __o.__dict__.update({'keys': __out[0], 'ok': True})\n" \
           "    __c0[:] = [__o]\n    return __out[0]\n"
    check_glue_source(head + fine, "__glue_f", ["__graph_f_0"], [], class_names=["__const_Layer_0"])
    refused = [
        fine.replace("'ok': True", "'hook': L['self'].forward"),  # an object read off the frame
        fine.replace("__new__(__const_Layer_0)", "__new__(__const_Other_1)"),
        "    __o = __const_Layer_0(L['x'])\n",  # its constructor is not called
        "    __o = __const_Layer_0.__new__(__const_Layer_0)\n    __o.__dict__.update(L['d'])\n",
    ]
    for body in refused:
        with pytest.raises(UnsafeSource):
            check_glue_source(head + body, "__glue_f", ["__graph_f_0"], [],
                              class_names=["__const_Layer_0", "__const_Other_1"][:1])
