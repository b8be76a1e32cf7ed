"""Small programs of the kinds PyTorch tests its own Dynamo with in test_functions, test_misc,
test_unspec, test_global, test_input_attr_tracking, test_reconstruct and test_decorators (our own
programs, in dynfunctions_programs_a-f.py): math and operator on tensors and sizes, python scalars
changing between calls, globals, attributes on inputs, values returned from a graph that must be
rebuilt (functions, partials, bound methods, classes, views, ranges, slices), decorators, argument
passing, closures, recursion, classes built in the frame, string formatting, isinstance/ABCs,
id/hash, exceptions crossing inlined calls.

Each program runs eagerly and through kiln.compile(backend=<a counter over eager>) call by call:
the same value or exception (type and text), the same arguments afterwards (objects by their
attributes), the same module globals (GV_*) and side effects (LOG). The graph count and fallback
count are recorded in dynfunctions_counts.json with the real torch.compile(backend="eager")'s graph
count over the same calls (`dynamo`); the slow test checks those live. A slice of the programs also
runs under aot_eager. Rewrite the record with
`PYTHONPATH=.:tests:tests/capture .venv/bin/python tests/capture/test_dynfunctions_programs.py --record`.

A fixed fifth of the programs runs in `make test`; the rest is marked slow.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import types
import warnings
from typing import Any, Callable

import pytest
import torch

import kiln
from semantics_oracle import same

import dynfunctions_programs_a as prog_a
import dynfunctions_programs_b as prog_b
import dynfunctions_programs_c as prog_c
import dynfunctions_programs_d as prog_d
import dynfunctions_programs_e as prog_e
import dynfunctions_programs_f as prog_f

RECORD = os.path.join(os.path.dirname(__file__), "dynfunctions_counts.json")
MODULES = (prog_a, prog_b, prog_c, prog_d, prog_e, prog_f)
PROGRAMS = {name: (mod, fn, make, calls) for mod in MODULES for name, fn, make, calls in mod.PROGRAMS}
_PROBE = torch.linspace(-1, 1, 12).reshape(3, 4)


def _norm(value: Any, depth: int = 0) -> Any:
    """A value as it can be compared: callables by what they return on a probe tensor, objects by
    their type name and attributes, views and iterators by their items."""
    if depth > 6:
        return ("deep", type(value).__name__)
    rec = functools.partial(_norm, depth=depth + 1)
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, types.GeneratorType):
        return ("generator", [rec(v) for v in value])
    if isinstance(value, type):
        return ("class", value.__qualname__)
    if hasattr(type(value), "__next__") and iter(value) is value:  # an iterator: its type and what it still gives
        return ("iterator", type(value).__name__, [rec(v) for v in value])
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType)):
        try:
            return ("callable", rec(value(_PROBE)))
        except Exception as exc:  # noqa: BLE001 - compared
            return ("callable raised", type(exc).__name__)
    if isinstance(value, (type({}.keys()), type({}.values()), type({}.items()))):
        return (type(value).__name__, [rec(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(rec(v) for v in value) if type(value) in (list, tuple) else \
            (type(value).__name__, [rec(v) for v in value])
    if isinstance(value, dict):
        return {k: rec(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return value
    if isinstance(value, (int, float, complex, str, bytes, bool, type(None), range, slice, torch.Size,
                          torch.dtype, torch.device)):
        return value
    slots = [s for c in type(value).__mro__ for s in getattr(c, "__slots__", ()) if hasattr(value, s)]
    attrs = dict(vars(value)) if hasattr(value, "__dict__") else {}
    attrs.update({s: getattr(value, s) for s in slots})
    if attrs or slots or hasattr(value, "__dict__"):
        return ("object", type(value).__qualname__, {k: rec(v) for k, v in sorted(attrs.items())})
    return ("other", type(value).__qualname__, repr(value) if type(value).__repr__ is not object.__repr__ else "")


def _outcome(fn: Callable[..., Any], args: tuple) -> tuple:
    try:
        return ("ok", _norm(fn(*args)))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc).__name__, str(exc))


def _args(make: Callable[..., tuple], i: int) -> tuple:
    torch.manual_seed(i)
    return make(i)


def _runs(mod: Any, fn: Callable[..., Any], make: Callable[..., tuple], calls: int) -> list[tuple]:
    for reset in mod.RESETS:
        reset()
    runs = []
    for i in range(calls):
        mod.LOG.clear()
        args = _args(make, i)
        result = _outcome(fn, args)
        runs.append((result, list(mod.LOG), _norm(args), _norm(mod.state())))
    return runs


def run_compiled(name: str, backend: str = "eager") -> tuple[int, int]:
    """The program eager then compiled, compared call by call; returns (graphs, fallbacks)."""
    mod, fn, make, calls = PROGRAMS[name]
    want = _runs(mod, fn, make, calls)
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fallback's warning: the count is compared instead
        got = _runs(mod, compiled, make, calls)
    for i, (g, w) in enumerate(zip(got, want)):
        (g_out, g_log, g_args, g_state), (w_out, w_log, w_args, w_state) = g, w
        assert g_out[0] == w_out[0], f"call {i}: compiled {g_out!r}, eager {w_out!r}"
        if w_out[0] == "ok":
            assert same(g_out[1], w_out[1]), f"call {i}: compiled returned {g_out[1]!r}, eager {w_out[1]!r}"
        else:
            assert g_out[1:] == w_out[1:], f"call {i}: compiled raised {g_out[1:]}, eager {w_out[1:]}"
        assert same(g_log, w_log), f"call {i}: side effects {g_log!r}, eager's {w_log!r}"
        assert same(g_args, w_args), f"call {i}: arguments left {g_args!r}, eager left {w_args!r}"
        assert same(g_state, w_state), f"call {i}: globals left {g_state!r}, eager left {w_state!r}"
    return counter.frame_count, int(kiln.stats()["fallbacks"])


def dynamo_count(name: str) -> int:
    """The real torch.compile(backend=<counter>)'s graph count over the program's calls."""
    import torch._dynamo

    mod, fn, make, calls = PROGRAMS[name]
    counter = kiln.backends.CountingBackend()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counter)
    for reset in mod.RESETS:
        reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(calls):
                mod.LOG.clear()
                try:
                    compiled(*_args(make, i))
                except Exception:  # noqa: BLE001 - a program may raise; the count is what is read
                    pass
    finally:
        torch._dynamo.reset()
    return counter.frame_count


def _load() -> dict[str, dict[str, int]]:
    with open(RECORD) as f:
        return dict(json.load(f))


_NAMES = list(PROGRAMS)
_PARAMS = [pytest.param(name, marks=[] if i % 5 == 0 else [pytest.mark.slow]) for i, name in enumerate(_NAMES)]


@pytest.mark.parametrize("name", _PARAMS)
def test_program_matches_eager(name: str) -> None:
    graphs, fallbacks = run_compiled(name)
    record = _load()[name]
    assert (graphs, fallbacks) == (record["kiln"], record["fallbacks"]), (graphs, fallbacks, record)


# every seventh program also under aot_eager (the same values; graphs through AOT autograd)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if i % 35 == 0 else [pytest.mark.slow])
                                  for i, n in enumerate(_NAMES) if i % 7 == 0])
def test_program_matches_eager_aot(name: str) -> None:
    graphs, fallbacks = run_compiled(name, "aot_eager")
    assert fallbacks == _load()[name]["fallbacks"]


def test_record_covers_every_program() -> None:
    assert sorted(_load()) == sorted(_NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", _NAMES)
def test_dynamo_count_recorded(name: str) -> None:
    assert dynamo_count(name) == _load()[name]["dynamo"]


def _sweep(names: list[str], with_dynamo: bool) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for program in names:
        try:
            kiln_graphs, kiln_fallbacks = run_compiled(program)
        except AssertionError as exc:
            print(f"WRONG {program}: {str(exc)[:300]}")
            kiln_graphs, kiln_fallbacks = -1, -1
        except Exception as exc:  # noqa: BLE001 - reported
            print(f"ERROR {program}: {type(exc).__name__}: {str(exc)[:300]}")
            kiln_graphs, kiln_fallbacks = -1, -1
        table[program] = {"kiln": kiln_graphs, "fallbacks": kiln_fallbacks,
                          "dynamo": dynamo_count(program) if with_dynamo else -1}
        if table[program]["fallbacks"] > 0:
            print(f"FALLBACK {program}: {table[program]}")
        if with_dynamo and table[program]["kiln"] != table[program]["dynamo"]:
            print(f"COUNT {program}: {table[program]}")
    return table


# ---- closures returned together keep sharing their cell (a write through one is seen by the other)
def _pair_made(x):
    k = x + 1

    def get():
        return k

    def put(v):
        nonlocal k
        k = v
    return get, put


def _pair_written(x):
    get, put = _pair_made(x)
    put(x * 5)
    return get, put


def _pair_across_break(x):
    k = x

    def get():
        return k
    print("", end="")

    def put(v):
        nonlocal k
        k = v
    return get, put


@pytest.mark.parametrize("fn", [_pair_made, _pair_written, _pair_across_break], ids=lambda f: f.__name__)
def test_returned_closures_share_their_cell(fn: Callable[..., Any]) -> None:
    outcomes = []
    for run in (fn, kiln.compile(fn, backend="eager")):
        kiln.reset()
        get, put = run(torch.ones(2))
        before = get().tolist()
        put(torch.zeros(2))
        outcomes.append((before, get().tolist(), get.__closure__[0] is put.__closure__[0]))
    assert outcomes[0] == outcomes[1]


if __name__ == "__main__":  # the sweep and the record (see the module docstring)
    import logging

    logging.disable(logging.WARNING)
    selected = [a for a in sys.argv[1:] if not a.startswith("--")]
    names = [n for n in _NAMES if not selected or any(n.startswith(s) or PROGRAMS[n][0].__name__.endswith(s)
                                                      for s in selected)]
    table = _sweep(names, with_dynamo="--no-dynamo" not in sys.argv)
    wrong = sum(r["kiln"] == -1 for r in table.values())
    equal = sum(r["kiln"] == r["dynamo"] for r in table.values())
    fallbacks = sum(r["fallbacks"] > 0 for r in table.values())
    print(f"{len(table)} programs; wrong {wrong}; fallbacks {fallbacks}; Kiln's graph count equals torch.compile's on {equal}")
    if "--record" in sys.argv:
        assert not wrong, "a wrong program cannot be recorded"
        with open(RECORD, "w") as f:
            json.dump(table, f, indent=0)
            f.write("\n")
