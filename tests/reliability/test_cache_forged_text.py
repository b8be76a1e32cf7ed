"""Forged text in a stored frame entry: every construct outside capture's grammar is refused.

A stored entry's guard sources and glue become code again in a later process
(kiln/capture/persist/grammar.py admits only the forms capture writes). Each case here forges one
entry the way an attacker who knows the format would (a valid seal, named by its hash): a
guard or glue text that would create a marker file if it ran. The entry must be refused with a
`removed ...: not a frame entry: <why>` line under KILN_LOGS=cache, the file deleted, the frame
captured again (one capture, no disk hit), the answer eager's, and the marker absent. The last
tests check the other direction: every text capture writes for a sweep of programs is admitted.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import log
from kiln.capture import persist
from kiln.capture.guards import Guard
from kiln.capture.persist.grammar import DUNDER_READS, UnsafeSource, check_glue_source, check_guard_source
from kiln.runtime import store
from tests.reliability import cache_harness as harness

pytestmark = pytest.mark.cpp


def _f(x, w):
    return torch.tanh(x @ w).sin() * 2 + 1


def _call(cache: Path) -> tuple[torch.Tensor, dict[str, int]]:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    w = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    with kiln.config.patch(cache_dir=str(cache), persistent_cache=True):
        kiln.reset()
        out = kiln.compile(_f, options={"opt_level": "-O1"})(x, w)
    torch.testing.assert_close(out, _f(x, w))
    return out, kiln.stats()


@pytest.fixture(scope="module")
def _genuine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A cache holding the genuine entry of `_f`, and that entry (a StoredFrame)."""
    cache = tmp_path_factory.mktemp("forged") / "cache"
    store.forget_verdicts()
    _, stats = _call(cache)
    assert stats["frames"] == 1
    (entry,) = harness.files(cache, ".entry")
    _, again = _call(cache)
    assert again["disk_hits"] == 1 and again["frames"] == 0  # the genuine entry is used
    return cache, persist.loads(store.read_sealed(str(entry)))


@pytest.fixture(autouse=True)
def _cache_log(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(store, "_warned_damage", True)  # the one warning per process: not under test
    log.configure("cache")
    yield
    log.configure("")
    kiln.reset()


def _forge(cache: Path, frame: Any, change: Callable[[Any, str], Any], marker: Path) -> Path:
    """Replace the entry by `change(genuine frame, marker path)`, sealed and named as Kiln would."""
    (entry,) = harness.files(cache, ".entry")
    entry.unlink()
    body = persist.dumps(change(frame, str(marker)))
    planted = entry.parent / persist._content_name(body)
    planted.write_bytes(store.seal(body))
    return planted


def _glue_line(line: str) -> Callable[[Any, str], Any]:
    """A forgery that adds `line` (with {m} the marker path) at the top of the glue's body."""

    def change(frame: Any, marker: str) -> Any:
        head = f"def {frame.glue_name}(L, G, F):\n"
        source = frame.glue_source.replace(head, head + "    " + line.format(m=marker) + "\n", 1)
        assert source != frame.glue_source
        return persist.StoredFrame(frame.format, frame.guards, frame.glue_name, source, frame.graphs,
                                   frame.constants)
    return change


def _glue_text(make: Callable[[Any, str], str]) -> Callable[[Any, str], Any]:
    def change(frame: Any, marker: str) -> Any:
        return persist.StoredFrame(frame.format, frame.guards, frame.glue_name, make(frame, marker),
                                   frame.graphs, frame.constants)
    return change


def _guard(source: str, kind: str = "check_type", expected: Any = torch.Tensor) -> Callable[[Any, str], Any]:
    """A forgery that adds a guard whose source text (with {m}) would run when the guards are checked."""

    def change(frame: Any, marker: str) -> Any:
        text = source.format(m=marker)
        guard = Guard(text, kind, expected) if kind != "check_aliasing" else Guard("", kind, ((text, "L['x']"),))
        return persist.StoredFrame(frame.format, (guard, *frame.guards), frame.glue_name, frame.glue_source,
                                   frame.graphs, frame.constants)
    return change


_TOUCH = "__import__('os').system('touch {m}')"
FORGERIES: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    # label: (forgery, a fragment of the refusal's reason)
    "glue imports os": (_glue_line("__v = " + _TOUCH), "stored code calls"),
    "glue reads __globals__": (_glue_line("__v = F.__globals__['os']"), "'__globals__'"),
    "glue reaches builtins": (_glue_line("__v = G['__builtins__']['exec'](\"open('{m}', 'w')\")"), "stored code calls"),
    "glue calls through sys.modules": (_glue_line("__v = __import__('sys').modules['os'].system('touch {m}')"),
                                       "stored code calls"),
    "glue calls a method not in the grammar": (_glue_line("__v = L['x'].__reduce_ex__(2)[0]('touch {m}')"),
                                               "stored code"),
    "glue passes an argument to a zero-argument method": (_glue_line("__v = L['x'].size(" + _TOUCH + ")"),
                                                          "stored code calls"),
    "glue environ.get with a default": (_glue_line("__v = __import__('os').environ.get('HOME', " + _TOUCH + ")"),
                                        "stored code calls"),
    "glue lambda": (_glue_line("__v = (lambda: " + _TOUCH + ")()"), "stored code calls"),
    "glue f-string": (_glue_line('__v = f"{{' + _TOUCH + '}}"'), "JoinedStr"),
    "glue comprehension": (_glue_line("__v = [" + _TOUCH + " for _ in (1,)]"), "ListComp"),
    "glue walrus": (_glue_line("__v = (__w := " + _TOUCH + ")"), "NamedExpr"),
    "glue import statement": (_glue_line("import os; os.system('touch {m}')"), "Import statement"),
    "glue with statement": (_glue_line("with open('{m}', 'w'): pass"), "With statement"),
    "glue try statement": (_glue_line("try: open('{m}', 'w')\n    except Exception: pass"), "glue try block"),
    "glue expression statement": (_glue_line("open('{m}', 'w')"), "Expr statement"),
    "glue rebinds a graph": (_glue_text(lambda frame, m: frame.glue_source.replace(
        f"def {frame.glue_name}(L, G, F):\n",
        f"def {frame.glue_name}(L, G, F):\n    {next(iter(frame.graphs))} = G['__builtins__']\n", 1)),
        "glue rebinds"),
    "glue default argument": (_glue_text(lambda frame, m: frame.glue_source.replace(
        "(L, G, F):", f"(L, G, F=__import__('os').system('touch {m}')):", 1)), "another signature"),
    "glue decorator": (_glue_text(lambda frame, m: f"@__import__('os').system\n" + frame.glue_source),
                       "another signature"),
    "glue second function": (_glue_text(lambda frame, m: frame.glue_source
                                        + f"\n__x = __import__('os').system('touch {m}')\n"), "not one function"),
    "glue stores into a global": (_glue_line("G['torch'].tanh = G['torch'].sin"), "stores an object read off"),
    "glue computed key": (_glue_line("__v = G[" + _TOUCH + "]"), "subscripts with"),
    "guard imports os": (_guard(_TOUCH), "stored code calls"),
    "guard reads __globals__": (_guard("F.__globals__['os']"), "'__globals__'"),
    "guard calls __subclasses__": (_guard("type(L['x']).__subclasses__()"), "__subclasses__"),
    "guard calls a read": (_guard("G['torch'].save(L['x'], '{m}')"), "stored code calls"),
    "shape guard imports os": (_guard(_TOUCH + " == 0", "check_shape", None), "stored code calls"),
    "shape guard calls a builtin outside the grammar": (_guard("len(open('{m}', 'w').name) > 0", "check_shape",
                                                               None), "stored code calls"),
    "aliasing group with a call": (_guard(_TOUCH, "check_aliasing"), "stored code calls"),
}


@pytest.mark.parametrize("label", list(FORGERIES))
def test_forged_text_is_refused_logged_and_the_frame_captured_again(
        _genuine: tuple[Path, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture, label: str) -> None:
    pristine, genuine = _genuine
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    marker = tmp_path / "ran"
    forgery, why = FORGERIES[label]
    planted = _forge(cache, genuine, forgery, marker)
    with caplog.at_level(logging.INFO, logger="kiln.cache"):
        _, stats = _call(cache)
    assert not marker.exists(), f"{label}: forged code ran"
    assert not planted.exists(), f"{label}: the forged entry was kept"
    assert stats["disk_hits"] == 0 and stats["frames"] == 1, stats
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln.cache" and str(planted) in r.getMessage()]
    assert lines and "not a frame entry" in lines[0] and why in lines[0], (label, lines)


# ---------------------------------------------------------------------------------------------------
# What capture writes is admitted


def test_every_source_kind_is_admitted() -> None:
    for text in ("L['x']", "G['w']", "F.__closure__[0].cell_contents", "L['self']._modules['fc']._parameters['weight']",
                 "__import__('sys').modules['torch.nn.functional'].__dict__['relu']",
                 "dict.__getitem__(L['d'], 'k')", "list(L['d'].values())[2]", "L['t'].__reduce__()",
                 "__import__('os').environ.get('KILN_X')", "type(L['self']).forward.__func__",
                 "L['f'].__wrapped__", "L['m'].__self__", "L['m'].__name__", "L['x'].size()[0]",
                 "L['self'].__class__.__name__", "type(L['d']).__getitem__", "L['t'].item()",
                 "type(L['self'].config).__validators__", "L['x'][-1]", "L['d'][('a', 1)]",
                 "L['x'].size()[0] * L['x'].stride()[0] >= 2 and L['n'] % 8 == 0",
                 "min(L['a'].size()[1], 4) == max(abs(L['n']), int(L['m'] // 2)) if L['k'] else not L['j']",
                 "L['x'].storage_offset() == 0"):
        check_guard_source(text)


def test_library_dunders_are_admitted_only_as_reads() -> None:
    # every dunder the grammar admits is a read (a method identity, a table, a default): read off an
    # object or its type it passes; called, with or without arguments, it is refused in guards and glue
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'])\n"
    for name in sorted(DUNDER_READS):
        for read in (f"L['o'].{name}", f"type(L['o']).{name}", f"type(L['o']).__mro__[1].{name}"):
            check_guard_source(read)
            check_glue_source(head + f"    __v = {read}\n    return __out[0]\n", "__glue_f", ["__graph_f_0"], [])
            for call in (f"{read}()", f"{read}(L['x'])", f"{read}.__call__()"):
                with pytest.raises(UnsafeSource):
                    check_guard_source(call)
                with pytest.raises(UnsafeSource):
                    check_glue_source(head + f"    __v = {call}\n    return __out[0]\n", "__glue_f",
                                      ["__graph_f_0"], [])
    for outside in ("__globals__", "__builtins__", "__subclasses__", "__bases__", "__reduce_ex__", "__import__"):
        with pytest.raises(UnsafeSource):
            check_guard_source(f"type(L['o']).{outside}")
    with pytest.raises(UnsafeSource):  # a class reached through __mro__ by a computed index
        check_guard_source("type(L['o']).__mro__[L['i']].__dict__['f']")


def test_glue_forms_capture_writes_are_admitted() -> None:
    head = "def __glue_f(L, G, F):\n    __out = __graph_f_0(L['x'], L['self']._modules['l']._parameters['w'])\n"
    bodies = [
        "    return __out[0]\n",
        "    return (__out[0], [__out[1], 3], {'a': __out[2]})\n",
        "    __const__set_grad_enabled_0(False)\n    return __out[0]\n",
        "    L['self'].step = __out[1]\n    return __out[0]\n",
        "    L['xs'][:] = [__out[0], L['xs'][0]]\n    return None\n",
        "    __o = __const_Out_0(logits=__out[0], loss=None)\n    return __o\n",
        "    __v1 = L['kwargs']['a']\n    __d0 = {'a': __v1}\n    L['kwargs'].clear()\n    L['kwargs'].update(__d0)\n",
    ]
    for body in bodies:
        check_glue_source(head + body, "__glue_f", ["__graph_f_0"], ["__const_Out_0", "__const__set_grad_enabled_0"])
    with pytest.raises(UnsafeSource):
        check_glue_source(head + "    __const_Out_0.x = L['fn']\n", "__glue_f", ["__graph_f_0"], ["__const_Out_0"])


def _env_var_program(x: torch.Tensor) -> torch.Tensor:
    scale = 2.0 if os.environ.get("KILN_TEST_FORGED_SCALE") else 1.0
    return x.sin() * scale


@pytest.mark.parametrize("fn", [_f, _env_var_program])
def test_entries_capture_stores_pass_the_check_in_process(tmp_path: Path, fn: Callable[..., Any]) -> None:
    args = (torch.randn(6, 5), torch.randn(5, 4)) if fn is _f else (torch.randn(4),)
    with kiln.config.patch(cache_dir=str(tmp_path / "cache"), persistent_cache=True):
        kiln.reset()
        kiln.compile(fn, options={"opt_level": "-O1"})(*args)
    (entry,) = harness.files(tmp_path / "cache", ".entry")
    persist.check_texts(persist.loads(store.read_sealed(str(entry))))
