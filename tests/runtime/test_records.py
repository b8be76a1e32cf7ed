"""kiln.runtime.records and kiln.runtime.store: cache files hold data, are sealed, and are checked.

In-process and fast: what the restricted unpickler admits and refuses (pickle gadgets, sympy's
string parsing, references used as callables), sealed files and their damage, atomic writes, and
the wrapper-source check the kernel-wrapper loader applies.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import pickletools

import pytest
import sympy
import torch

from kiln import config
from kiln.runtime import kernel_wrapper, records, store


@dataclasses.dataclass(frozen=True)
class _Point:
    x: int
    dtype: torch.dtype


class _Gadget:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def test_records_round_trip_with_references() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    value = {"p": _Point(3, torch.float16), "op": torch.ops.aten.add.Tensor, "expr": s0 * 4 + sympy.Integer(2),
             "dev": torch.device("cpu"), "layout": torch.strided, "set": frozenset({1, 2}), "sl": slice(1, None)}
    loaded = records.loads(records.dumps(value), types=(_Point,))
    assert loaded == value and loaded["p"].dtype is torch.float16 and loaded["op"] is torch.ops.aten.add.Tensor
    assert loaded["expr"].free_symbols == {s0}


@pytest.mark.parametrize("value", [1 / 3, 0.1, 2 / 3 * 1e300, -2.5e-300, 1e16 + 2])
def test_a_sympy_float_reads_back_to_every_bit(value: float) -> None:
    # `size / 3` of a graph is s0*0.3333...: its float written with str()'s 15 digits read back as
    # 0.333333333333333, and a graph from the cache returned 0.9999999999999989 for s0 = 3
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    expr = s0 * sympy.Float(value)
    loaded = records.loads(records.dumps({"expr": expr}))["expr"]
    assert loaded == expr and float(loaded.subs(s0, 3)) == 3 * value


@pytest.mark.parametrize("gadget", [_Gadget(os.system, "true"), _Gadget(eval, "1"), _Gadget(getattr, "os", "system"),
                                    _Gadget(_Point, 1, torch.float32)])
def test_globals_outside_the_allowlist_are_refused(gadget) -> None:
    with pytest.raises(records.RecordError, match="not an admitted record type"):
        records.loads(pickle.dumps(gadget))  # _Point too: it is not admitted unless asked for


def test_a_reference_is_never_the_callable_of_a_reduce() -> None:
    # Hand-written pickle: REDUCE with a persistent reference (an ATen op) as the callable.
    data = (pickle.PROTO + bytes([4]) + pickle.BINUNICODE + len(b"op").to_bytes(4, "little") + b"op"
            + pickle.BINUNICODE + len(b"aten::zeros").to_bytes(4, "little") + b"aten::zeros"
            + pickle.BINUNICODE + (0).to_bytes(4, "little") + pickle.TUPLE2 + pickle.TUPLE2 + pickle.BINPERSID
            + pickle.MARK + pickle.BININT1 + bytes([3]) + pickle.TUPLE + pickle.REDUCE + pickle.STOP)
    pickletools.dis(data, out=open(os.devnull, "w"))  # well-formed
    with pytest.raises(records.RecordError):
        records.loads(data)


def test_sympy_strings_are_never_parsed() -> None:
    # sympy evaluates a string argument with eval(); a stored expression node only gets sympy objects
    evil = ("sympy", ("e", "sympy.core.mod", "Mod", (("s", "__import__('os').system('true')", ()), ("i", 2))))
    with pytest.raises(records.RecordError, match="bad symbol name"):
        records.REFERENCES["sympy"].decode(evil[1])
    with pytest.raises(records.RecordError, match="not an admitted sympy class"):
        records.REFERENCES["sympy"].decode(("e", "os", "system", ()))


def test_sealed_files_detect_damage_and_are_deleted(tmp_path) -> None:
    path = str(tmp_path / "x.rec")
    assert store.write_sealed(path, b"payload")
    assert store.read_sealed(path) == b"payload"
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.warns(UserWarning):
        store._warned_damage = False
        assert store.read_sealed(path) is None
    assert not os.path.exists(path)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")] == []


def test_relative_paths_stay_inside_the_root(tmp_path) -> None:
    store.forget_verdicts()
    with config.patch(cache_dir=str(tmp_path / "c")):
        inside = os.path.join(store.root(), "cpp", "ab", "k.so")
        assert store.relative(inside) == "cpp/ab/k.so"
        assert store.absolute("cpp/ab/k.so") is None  # its folder does not exist: nothing to read there
        assert store.folder("cpp", "ab") == os.path.dirname(inside)
        assert store.absolute("cpp/ab/k.so") == inside
        assert store.absolute("../escape.so") is None and store.absolute("/etc/passwd") is None
        assert store.relative(str(tmp_path / "elsewhere.so")) is None
    store.forget_verdicts()


_WRAPPER = """def call(arg0):
    s0 = arg0.size(0)
    buf0 = torch.empty_strided((s0,), (1,), dtype=torch_float32)
    kernel0(arg0.data_ptr(), buf0.data_ptr(), s0)
    return (buf0,)
"""


@pytest.mark.parametrize("line", ["    __import__('os').system('true')", "    arg0.__class__",
                                  "    torch.ops.aten.add", "    open('x')", "    import os",
                                  "    (lambda: 1)()", "    arg0.tolist"])
def test_wrapper_source_check(line: str) -> None:
    names = {"torch_float32", "kernel0"}
    kernel_wrapper.check_wrapper_source(_WRAPPER, names)
    evil = _WRAPPER.replace("    return", line + "\n    return")
    with pytest.raises(ValueError):
        kernel_wrapper.check_wrapper_source(evil, names)


_CHECKED_WRAPPER = """import ctypes as _ctypes
_ErrorRecord = _ctypes.c_int64 * 3

def _kernel_error(err):
    site, value, size = err[0], err[1], err[2]
    if site == 7:
        return IndexError(f'embedding(): index {value} is out of range for a table of {size} rows')
    return RuntimeError(f'kiln: kernel check {site} failed (value {value}, bound {size})')


def call(arg0):
    kiln_err = _ErrorRecord()
    buf0 = torch.empty_strided((4,), (1,), dtype=torch_float32)
    kernel0(arg0.data_ptr(), buf0.data_ptr(), kiln_err)
    if kiln_err[0]: raise _kernel_error(kiln_err)
    return (buf0,)
"""


@pytest.mark.parametrize("change", [None, ("import ctypes as _ctypes", "import os as _ctypes"),
                                    ("return RuntimeError(", "return __import__('os').system("),
                                    ("c_int64 * 3", "c_int64 * 3; import os"),
                                    ("site, value, size = err[0]", "site, value, size = open('x'), err[0]")])
def test_wrapper_source_check_admits_only_the_error_record_preamble(change) -> None:
    names = {"torch_float32", "kernel0"}
    if change is None:
        kernel_wrapper.check_wrapper_source(_CHECKED_WRAPPER, names)
        return
    with pytest.raises(ValueError):
        kernel_wrapper.check_wrapper_source(_CHECKED_WRAPPER.replace(*change), names)


def test_references_inside_torch_fx_containers_are_decoded() -> None:
    # a lowered extern node keeps its arguments in fx's immutable_list: a size expression or a
    # dtype inside one stayed an inert placeholder, and the wrapper of a graph read back from the
    # cache failed to render it (a view-program fuzz case, after a frame came from the disk)
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    value = immutable_list([s0 * 2, (torch.int8,), immutable_dict({"dtype": torch.bfloat16})])
    loaded = records.loads(records.dumps(value))
    assert type(loaded) is immutable_list and type(loaded[2]) is immutable_dict
    assert loaded[0] == s0 * 2 and loaded[1] == (torch.int8,) and loaded[2]["dtype"] is torch.bfloat16
