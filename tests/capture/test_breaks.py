"""Break records, the hint table, the summary explain prints, and KILN_LOGS=graph_breaks dedup."""
from __future__ import annotations

import ast
import dataclasses
import logging
import pathlib

import pytest

import kiln
from kiln.capture import breaks
from kiln import log
from kiln.errors import DataDependentOutputError, MissingFakeImplError, Unsupported


def user_fn(x):
    if x.sum() > 0:  # the line the record must name
        return x
    return -x


def record(exc, line_offset=1):
    code = user_fn.__code__
    return breaks.make_break_record(exc, code, code.co_firstlineno + line_offset)


def test_record_names_file_line_and_source():
    r = record(Unsupported("branch on a tensor", kind="data_dependent_branch"))
    assert r.filename == __file__
    assert r.lineno == user_fn.__code__.co_firstlineno + 1
    assert r.source_line == "if x.sum() > 0:  # the line the record must name"
    assert r.kind == "data_dependent_branch"
    assert "torch.where" in r.suggestion
    text = str(r)
    assert text.splitlines()[0] == f"Graph break at {__file__}:{r.lineno}"
    assert "    if x.sum() > 0:" in text
    assert "reason: branch on a tensor" in text
    assert "hint: " in text and "torch.where" in text


def test_record_is_frozen():
    r = record(Unsupported("x"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.reason = "y"


def test_unknown_line_falls_back_to_first_line():
    r = breaks.make_break_record(Unsupported("x"), user_fn.__code__, None)
    assert r.lineno == user_fn.__code__.co_firstlineno
    assert r.source_line == "def user_fn(x):"


def test_exception_hint_overrides_table():
    r = record(Unsupported("custom", kind="print", hint="do this instead"))
    assert r.suggestion == "do this instead"


@pytest.mark.parametrize("exc,needle", [
    (Unsupported("p", kind="print"), "out of the compiled region"),
    (Unsupported("i", kind="item"), "capture_scalar_outputs"),
    (Unsupported("i", kind="inplace"), "x = x + y"),
    (Unsupported("n", kind="numpy"), "torch"),
    (Unsupported("d", kind="disabled"), "kiln.disable"),
    (Unsupported("d", kind="dynamic_shape"), "mark_dynamic"),
    (Unsupported("l", kind="logging"), "log outside"),
    (Unsupported("g", kind="generator"), "generator"),
    (Unsupported("b", kind="unsupported_bytecode"), "kiln.disable"),
    (Unsupported("c", kind="unsupported_call"), "allow_in_graph"),
    (DataDependentOutputError("aten.nonzero.default"), "nonzero"),
    (DataDependentOutputError("aten._unique2.default"), "out of the hot region"),
    (DataDependentOutputError("aten._local_scalar_dense.default"), "keep the value as a tensor"),
    (DataDependentOutputError("aten.tolist"), "keep the value as a tensor"),
    (MissingFakeImplError("mylib::op", "no fake"), "register_fake"),
])
def test_hint_table_gives_the_lectures_rewrites(exc, needle):
    assert needle in record(exc).suggestion


def test_unknown_and_generic_kinds_have_no_hint():
    assert record(Unsupported("x")).suggestion is None
    assert record(Unsupported("x", kind="no_such_kind")).suggestion is None


def test_hint_table_rejects_duplicates_and_undocumented_entries():
    with pytest.raises(ValueError):
        breaks.hint_for_kind("print")(lambda exc: "again")

    def nodoc(exc):
        return "x"

    with pytest.raises(ValueError):
        breaks.hint_for_kind("brand_new_kind_without_doc")(nodoc)
    assert "brand_new_kind_without_doc" not in breaks.HINTS


def _kinds_raised_in_kiln() -> set[str]:
    root = pathlib.Path(kiln.__file__).parent
    kinds = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                # Tables that map a function or a method name to its break kind (`_BREAK_KINDS`).
                names = [getattr(t, "id", "") for t in node.targets]
                if any(("KIND" in n or "BREAK" in n) for n in names):
                    kinds |= {v.value for v in node.value.values
                              if isinstance(v, ast.Constant) and isinstance(v.value, str)}
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name not in ("Unsupported", "unsupported") and not name.endswith("Unsupported"):
                continue
            for kw in node.keywords:
                if kw.arg == "kind" and isinstance(kw.value, ast.Constant):
                    kinds.add(kw.value.value)
    return kinds


def test_every_kind_raised_in_kiln_has_a_hint_entry():
    missing = _kinds_raised_in_kiln() - set(breaks.HINTS)
    assert not missing, f"add these break kinds to kiln/capture/breaks.py's hint table: {missing}"


def test_summary_groups_by_reason_with_counts():
    code = user_fn.__code__
    a = breaks.make_break_record(Unsupported("print() is a side effect", kind="print"), code,
                                 code.co_firstlineno + 2)
    b = breaks.make_break_record(Unsupported("branch on a tensor", kind="data_dependent_branch"),
                                 code, code.co_firstlineno + 1)
    text = breaks.summarize_breaks([a, b, a, a])
    lines = text.splitlines()
    assert lines[0] == "4 graph breaks, 2 distinct reasons:"
    assert lines[1] == "  1. [3x] print() is a side effect"
    assert lines[2] == f"       at {__file__}:{code.co_firstlineno + 2}: return x"
    assert "hint:" in lines[3]
    assert "  2. [1x] branch on a tensor" in lines
    assert breaks.summarize_breaks([]) == "No graph breaks."
    assert breaks.summarize_breaks([b]).startswith("1 graph break, 1 distinct reason:")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, rec):
        self.messages.append(rec.getMessage())


def test_log_break_prints_each_break_once():
    r = record(Unsupported("a unique reason for this test", kind="print"))
    collect = _Collect()
    logging.getLogger("kiln").addHandler(collect)
    log.configure("graph_breaks")
    try:
        breaks.reset()
        assert breaks.log_break(r) is True
        assert breaks.log_break(r) is False
        assert breaks.log_break(dataclasses.replace(r, lineno=r.lineno + 1)) is True
        assert collect.messages == [str(r), str(dataclasses.replace(r, lineno=r.lineno + 1))]
        breaks.reset()
        assert breaks.log_break(r) is True
        assert len(collect.messages) == 3
    finally:
        logging.getLogger("kiln").removeHandler(collect)
        log.configure("")
        breaks.reset()


def test_log_break_is_silent_without_kiln_logs():
    collect = _Collect()
    logging.getLogger("kiln").addHandler(collect)
    log.configure("")
    breaks.reset()
    try:
        assert breaks.log_break(record(Unsupported("quiet", kind="print"))) is True
        assert collect.messages == []
    finally:
        logging.getLogger("kiln").removeHandler(collect)
        breaks.reset()
