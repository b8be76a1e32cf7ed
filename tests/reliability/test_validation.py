"""Bad arguments to kiln.compile are clear errors at compile time, and the cache folder's default
never lands at the file system's root."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln.capture.options import INDUCTOR_OPTIONS

REPO = Path(__file__).resolve().parents[2]


def double(x):
    return x * 2


@pytest.mark.parametrize("kwargs, error, words", [
    ({"fullgraph": "yes"}, TypeError, "fullgraph must be True or False"),
    ({"fullgraph": 1}, TypeError, "fullgraph must be True or False"),
    ({"dynamic": "auto"}, ValueError, "dynamic must be None, True or False"),
    ({"dynamic": 0}, ValueError, "dynamic must be None, True or False"),
    ({"mode": "fast"}, ValueError, "unknown mode 'fast'"),
    ({"mode": ["default"]}, ValueError, "unknown mode"),
    ({"backend": "nonexistent"}, ValueError, "unknown backend 'nonexistent'"),
    ({"backend": 123}, TypeError, "backend must be a name or a callable"),
    ({"options": {"nonexistent": 1}}, ValueError, "unknown option 'nonexistent' for the inductor backend"),
    ({"options": [("verify", True)]}, TypeError, "options must be a dict"),
    ({"options": {1: True}}, TypeError, "option names are strings"),
    ({"backend": "eager", "options": {"verify": False}}, ValueError, "backend 'eager' takes no options"),
    ({"backend": lambda gm, ex: gm.forward, "options": {"verify": False}}, ValueError, "not a callable backend"),
    ({"mode": "max-autotune", "options": {"verify": False}}, ValueError, "either mode or options"),
])
def test_bad_argument_is_a_clear_error_at_compile_time(kwargs, error, words):
    with pytest.raises(error, match=words):
        kiln.compile(double, **kwargs)
    with pytest.raises(error, match=words):  # the decorator form checks before it sees the function
        kiln.compile(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"fullgraph": True}, {"dynamic": True}, {"dynamic": False}, {"mode": "reduce-overhead"},
    {"mode": "max-autotune"}, {"mode": "default"}, {"options": {"opt_level": "-O1", "verify": False}},
    {"backend": "eager"}, {"backend": "aot_eager"},
])
def test_good_arguments_are_accepted(kwargs):
    assert callable(kiln.compile(double, **kwargs))


def test_every_inductor_option_is_read_by_the_lowering():
    # compile_graph and the pass list it drives (kiln/lower/pipeline.py)
    source = "".join((REPO / "kiln" / "lower" / name).read_text() for name in ("__init__.py", "pipeline.py"))
    for key in INDUCTOR_OPTIONS:
        assert f'"{key}"' in source, f"kiln.lower.compile_graph and its pipeline do not read option {key!r}"


def _default_cache_dir(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("KILN_CACHE_DIR", "XDG_CACHE_HOME")}
    environment.update(env, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", "import kiln.config as c; print(c.cache_dir)"],
                          capture_output=True, text=True, env=environment, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("home", ["", "/", "relative/dir"])
def test_empty_or_odd_home_does_not_put_the_cache_at_the_root(home):
    path = _default_cache_dir(HOME=home)
    assert os.path.isabs(path) and not path.startswith("/.cache")
    assert path.endswith(os.path.join(".cache", "kiln")) or "kiln-cache-" in os.path.basename(path)


def test_cache_dir_default_follows_home_and_the_environment(tmp_path):
    assert _default_cache_dir(HOME=str(tmp_path)) == str(tmp_path / ".cache" / "kiln")
    assert _default_cache_dir(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg")) == str(tmp_path / "xdg" / "kiln")
    assert _default_cache_dir(KILN_CACHE_DIR=str(tmp_path / "mine")) == str(tmp_path / "mine")
