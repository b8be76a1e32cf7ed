"""Split artifacts (kiln/runtime/pieces.py) that must not be served from disk: entries whose files
were flipped, cut short or had a branch's library swapped, forged recipes (a call outside the
grammar, a parameter name that would be code, a piece under a name that is no split's) and a branch
whose code changed are never run; the frame is compiled again and gives eager's values. The models,
the script and the serving itself are in test_split_cache.py (split from it: each half is about two
minutes of second processes, and `make test` runs each file on one worker).
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from kiln.capture import persist
from kiln.runtime import artifact, records, store
from tests.runtime.test_split_cache import MODELS, _entries, _run, _setup


@pytest.fixture(scope="module")
def _lambdas_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One first process (cond_lambdas, infer) whose filled cache each refusal test damages a copy of:
    the first process is not what these tests are about, the second is."""
    code, cache = _setup(tmp_path_factory.mktemp("split_refused"))
    _run(code, cache, ["cond_lambdas"], "infer")
    return code, cache


def _copy(filled: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    code, pristine = filled
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    return code, cache


def _stored_frame(cache: Path) -> tuple[Path, persist.StoredFrame]:
    (path,) = _entries(cache)
    data = store.read_sealed(str(path))
    assert data is not None
    frame = persist.loads(data)
    assert isinstance(frame, persist.StoredFrame)
    return path, frame


def _split_of(frame: persist.StoredFrame) -> artifact.Recipe:
    (recipe,) = frame.graphs.values()
    assert recipe.kind == "split"
    return recipe


@pytest.mark.cpp
@pytest.mark.parametrize("damage", ["flip", "truncate", "swap_branch_libraries"])
def test_a_damaged_entry_or_library_is_compiled_again(_lambdas_cache: tuple[Path, Path], tmp_path: Path,
                                                     damage: str) -> None:
    code, cache = _copy(_lambdas_cache, tmp_path)
    path, frame = _stored_frame(cache)
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    else:  # the true branch's kernel library holds the false branch's, and the other way round
        modules = _split_of(frame).fields["modules"]
        branches = [m for name, m in modules.items() if name.startswith("submod_") and m.kind == "split"]
        (cond_piece,) = branches
        libraries = [_library(cond_piece.fields["modules"][name]) for name in ("cond_true_0", "cond_false_0")]
        a, b = (cache / lib for lib in libraries)
        assert a != b and a.is_file() and b.is_file()
        saved = Path(a).read_bytes()
        Path(a).write_bytes(Path(b).read_bytes())
        Path(b).write_bytes(saved)
    second, log = _run(code, cache, ["cond_lambdas"], "infer")  # eager's values on both branches
    assert second["disk_hits"] == 0 and second["compiles"] == 1, (second, log[-3000:])


def _library(recipe: artifact.Recipe) -> str:
    """The kernel library a piece's forward loads (an aot recipe over a wrapper or tiered recipe)."""
    found = sorted({s for owner, s in records.strings_in(recipe) if s.endswith(".so")})
    assert len(found) == 1, found
    return found[0]


def _forge(path: Path, frame: persist.StoredFrame, split: artifact.Recipe) -> Path:
    """A well-sealed entry holding `split` in place of the stored one (as someone able to write the
    cache could make): its checks, not its seal, must refuse it."""
    (name,) = frame.graphs
    forged = dataclasses.replace(frame, graphs={name: split})
    data = persist.dumps(forged)
    target = path.with_name(path.name.split("-")[0] + "-" + persist._content_name(data))
    path.unlink()
    assert store.write_sealed(str(target), data)
    return target


def _with_nodes(split: artifact.Recipe, edit: Any) -> artifact.Recipe:
    nodes = [edit(n) for n in split.fields["nodes"]]
    return artifact.Recipe("split", dict(split.fields, nodes=tuple(nodes)))


MARKER = "hop_forged_ran"


@pytest.mark.cpp
def test_forged_split_recipes_are_refused_never_run(_lambdas_cache: tuple[Path, Path], tmp_path: Path) -> None:
    code, cache = _copy(_lambdas_cache, tmp_path)
    path, frame = _stored_frame(cache)
    split = _split_of(frame)
    marker = tmp_path / MARKER
    code_name = f"x=open({str(marker)!r},'w')"
    forgeries = [
        # a parameter name that fx would paste into the forward's signature
        _with_nodes(split, lambda n: dataclasses.replace(n, name=code_name) if n.op == "placeholder" else n),
        # a call outside the grammar's table
        _with_nodes(split, lambda n: dataclasses.replace(n, target="system") if n.target == "getitem" else n),
        # a piece under a name that is no split's (an attribute of every module)
        artifact.Recipe("split", dict(split.fields, modules={("__class__" if k == "submod_0" else k): v
                                                            for k, v in split.fields["modules"].items()})),
    ]
    for forged in forgeries:
        written = _forge(path, frame, forged)
        second, log = _run(code, cache, ["cond_lambdas"], "infer")
        assert second["disk_hits"] == 0 and second["compiles"] == 1, (second, log[-3000:])
        assert not marker.exists() and not written.exists()
        assert "a split recipe refused" in log, log[-3000:]
        path, frame = _stored_frame(cache)  # the entry the recompile stored


@pytest.mark.cpp
def test_a_changed_branch_is_not_served_from_disk(tmp_path: Path) -> None:
    # a module-level branch (the frame's code, the key, is the same: its guards see the change), a
    # lambda branch and an inner branch of a nested cond (the frame's own nested code: the key);
    # no entry may run the old branch's compiled artifact
    names = ["cond_named", "cond_lambdas", "cond_nested"]
    code, cache = _setup(tmp_path)
    first, _ = _run(code, cache, names, "infer")
    again, _ = _run(code, cache, names, "infer")
    assert again["compiles"] == 0 and again["disk_hits"] == first["compiles"]
    changed = MODELS
    for old, new in [("return t.exp() * W", "return t.sin() * W + 2"), ("t.cos() * 3", "t.cos() * 4"),
                     ("lambda s: s * 3", "lambda s: s * 5")]:
        assert old in changed
        changed = changed.replace(old, new)
    (code / "hopmodels.py").write_text(changed)
    second, log = _run(code, cache, names, "infer")  # compared with the changed eager inside
    assert second["disk_hits"] == 0 and second["compiles"] == len(names), (second, log[-3000:])
