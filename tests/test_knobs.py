"""The settings registry (kiln/config.py): every KILN_ variable and kiln.config setting declared once,
read only through the registry, and the README's table generated from it.

The scans read the sources with `ast` and regular expressions; the parsing rules and the import-time
reads are checked on the declarations themselves and in a fresh process.
"""
from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from kiln import config, log
from kiln.__main__ import knob_table

ROOT = pathlib.Path(__file__).resolve().parent.parent
KILN = ROOT / "kiln"
BEGIN, END = "<!-- knobs:begin", "<!-- knobs:end -->"
ENV_NAME = re.compile(r"\bKILN_[A-Z][A-Z0-9_]*\b")


def _sources() -> list[pathlib.Path]:
    return sorted(p for p in KILN.rglob("*") if p.is_file() and p.suffix in (".py", ".cpp", ".h", ".md"))


def _python_names() -> set[str]:
    """Every identifier the package's Python defines or uses (`KILN_DECOMPOSITIONS` is a table, not
    an environment variable)."""
    names: set[str] = set()
    for path in KILN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return names


def test_readme_table_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "README.md lost its knobs markers"
    block = readme.split(BEGIN, 1)[1].split("\n", 1)[1].split(END, 1)[0]
    assert block == knob_table(), (
        "README.md's settings table differs from kiln/config.py's declarations: paste the output of "
        "`python -m kiln knobs --markdown` between its knobs markers")


def test_every_kiln_variable_named_in_the_package_is_declared() -> None:
    declared = {k.env for k in config.KNOBS if k.env}
    python_names = _python_names()
    undeclared = {}
    for path in _sources():
        for name in ENV_NAME.findall(path.read_text(encoding="utf-8")):
            if name not in declared and name not in python_names:
                undeclared.setdefault(name, str(path.relative_to(ROOT)))
    assert not undeclared, f"KILN_ variables that kiln/config.py does not declare: {undeclared}"


def test_only_the_registry_reads_kiln_variables() -> None:
    """An `os.environ`/`os.getenv` expression naming a KILN_ variable outside kiln/config.py reads the
    environment behind the registry's back."""
    found = []
    for path in KILN.rglob("*.py"):
        if path == KILN / "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Call, ast.Subscript, ast.Compare)):
                text = ast.unparse(node)
                if re.search(r"\b(environ|getenv)\b", text) and re.search(r"""['"]KILN_""", text):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert not found, found


def test_every_setting_is_declared_once_under_its_own_name() -> None:
    names = [k.name for k in config.KNOBS if k.name]
    envs = [k.env for k in config.KNOBS if k.env]
    assert len(names) == len(set(names)) and len(envs) == len(set(envs))
    settings = {name for name, value in vars(config).items()
                if not name.startswith("_") and isinstance(value, (bool, int, str, type(None)))}
    assert settings == set(names) == config.setting_names()
    for k in config.KNOBS:
        assert k.meaning and k.shown and (k.name or k.env)
        assert config.knob(k.name or k.env) is k  # type: ignore[arg-type]


def test_the_frame_key_holds_settings_only() -> None:
    """The persistent frame cache keys entries on the capture settings' values: the registry itself
    (whose defaults hold the working directory at import) must stay out of the key."""
    from kiln.capture import persist

    keyed = dict(ast.literal_eval(persist._config_text()))
    assert set(keyed) <= config.setting_names() and "specialize_int" in keyed and "debug_dir" not in keyed


def test_patch_accepts_settings_only() -> None:
    with config.patch(cache_size_limit=3):
        assert config.cache_size_limit == 3
    assert config.cache_size_limit == 8
    for name in ("os", "patch", "KNOBS", "no_such_setting"):
        with pytest.raises(AttributeError, match="no setting"):
            with config.patch(**{name: None}):
                pass


@pytest.mark.parametrize("raw, value", [(None, True), ("0", False), ("", False), ("1", True), ("yes", True)])
def test_a_switch_is_off_for_zero_or_empty(monkeypatch: pytest.MonkeyPatch, raw: str | None, value: bool) -> None:
    knob = config.knob("native_guards")
    if raw is None:
        monkeypatch.delenv(knob.env, raising=False)  # type: ignore[arg-type]
    else:
        monkeypatch.setenv(knob.env, raw)  # type: ignore[arg-type]
    assert knob.from_env() is value


def test_other_settings_take_an_empty_value_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, raw, value in (("KILN_NATIVE_WRAPPER_AFTER", "", 100), ("KILN_NATIVE_WRAPPER_AFTER", "7", 7),
                            ("KILN_CPU_WRAPPER", "", "auto"), ("KILN_CPU_WRAPPER", "native", "native"),
                            ("KILN_REPORT", "", None), ("KILN_REPORT", "out", "out"), ("KILN_LOGS", "", "")):
        monkeypatch.setenv(key, raw)
        assert config.knob(key).from_env() == value, (key, raw)
    monkeypatch.setenv("KILN_NATIVE_WRAPPER_AFTER", "many")
    with pytest.raises(ValueError, match="KILN_NATIVE_WRAPPER_AFTER='many'"):
        config.knob("KILN_NATIVE_WRAPPER_AFTER").from_env()


def test_kiln_logs_is_read_each_time_the_log_configures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_LOGS", "guards")
    try:
        log.configure()
        assert log.enabled("guards")
    finally:
        monkeypatch.delenv("KILN_LOGS")
        log.configure(os.environ.get("KILN_LOGS", ""))
    assert not log.enabled("guards")


_IMPORT_SCRIPT = """
import json, os
before = dict(os.environ)
import kiln
from kiln import config
print(json.dumps({"env_written": {k: v for k, v in os.environ.items() if before.get(k) != v},
                  "values": {k.name: getattr(config, k.name) for k in config.KNOBS if k.name}}))
"""


def test_import_reads_the_environment_and_never_writes_it(tmp_path: pathlib.Path) -> None:
    """Each variable sets its setting when kiln is imported; the import adds nothing to the process
    environment (KILN_CPU_BACKEND=triton once made it set TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "TRITON_"))}
    env.update(PYTHONPATH=str(ROOT), KILN_CPU_BACKEND="triton", KILN_NATIVE_WRAPPER_AFTER="7", KILN_DEBUG="1",
               KILN_PERSISTENT_CACHE="0", KILN_REPORT="", KILN_CACHE_DIR=str(tmp_path), KILN_REPRO_AFTER="aot")
    out = subprocess.run([sys.executable, "-c", _IMPORT_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["env_written"] == {}
    values = got["values"]
    assert (values["cpu_backend"], values["native_wrapper_after"], values["debug"], values["persistent_cache"],
            values["report_dir"], values["cache_dir"], values["repro_after"]) == \
        ("triton", 7, True, False, None, str(tmp_path), "aot")
    assert values["debug_dir"] == str(tmp_path / "kiln_debug") and values["cache_size_limit"] == 8
