"""`python -m kiln lint|report|bisect|minify ...`: the diagnostics of kiln.debug from a shell.

lint PATH...             compile hazards in source files, with the rewrite for each (exit 1 if any break)
report SCRIPT [ARGS]     run the script, write one HTML page of everything it compiled, print its path
bisect SCRIPT [ARGS]     run the script, then bisect the first call of each function or module it compiled
minify FILE [ARGS]       a repro.py written by Kiln: shrink its graph further; any other script: run it and
                         minify the first compiled call that goes wrong; writes repro.py (--out DIR)
knobs [--markdown]       every setting of kiln.config with its environment variable and value now; with
                         --markdown the README's settings table (generated from kiln.config's declarations)
boundary                 build the boundary extension (native guards and plans) into the cache now
The script runs as __main__ with its own arguments; kiln.compile is watched to learn what to bisect.
"""
from __future__ import annotations

import argparse
import functools
import os
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import kiln
from kiln import config
from kiln.runtime import native


@dataclass
class CompiledTarget:
    """What the script handed to kiln.compile, and the arguments of its first call."""

    model: Any
    calls: list[tuple[tuple, dict]] = field(default_factory=list)


def _snapshot(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    from kiln.debug.accuracy import clone_inputs

    return clone_inputs((tuple(args), dict(kwargs)))


def watch_compile(targets: list[CompiledTarget]) -> Callable[..., Any]:
    """A kiln.compile that also records each compiled object and the inputs of its first call."""
    import torch

    original = kiln.api.compile

    def compile(model: Any = None, **options: Any) -> Any:
        if model is None:
            return lambda m: compile(m, **options)
        compiled = original(model, **options)
        target = CompiledTarget(model)
        targets.append(target)
        if isinstance(compiled, torch.nn.Module):
            def first_call(module: Any, args: tuple, kwargs: dict) -> None:
                if not target.calls:
                    target.calls.append(_snapshot(args, kwargs))

            compiled.register_forward_pre_hook(first_call, with_kwargs=True)
            return compiled

        @functools.wraps(compiled)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not target.calls:
                target.calls.append(_snapshot(args, kwargs))
            return compiled(*args, **kwargs)

        return call

    return compile


def run_script(script: str, args: list[str], targets: list[CompiledTarget] | None = None) -> BaseException | None:
    """Run a script as __main__ (kiln.compile watched when `targets` is given); what it raised, if anything."""
    saved_argv, saved_compile = sys.argv, kiln.compile
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    if targets is not None:
        kiln.compile = watch_compile(targets)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return None if exc.code in (None, 0) else exc
    except Exception as exc:  # the diagnosis still runs on what was compiled before
        print(f"kiln: {script} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc
    finally:
        sys.argv, kiln.compile = saved_argv, saved_compile
    return None


def cmd_lint(ns: argparse.Namespace) -> int:
    from kiln.debug.lint import lint_paths

    findings = lint_paths(ns.paths)
    for finding in findings:
        print(finding)
    breaking = sum(f.breaks for f in findings)
    print(f"kiln lint: {len(findings)} findings ({breaking} graph breaks, {len(findings) - breaking} advice) "
          f"in {len({f.filename for f in findings})} files")
    return 1 if breaking else 0


def cmd_report(ns: argparse.Namespace) -> int:
    from kiln.debug import report

    config.report_dir = ns.out or config.report_dir or os.path.join(os.getcwd(), "kiln_report")
    report.install()
    failure = run_script(ns.script, ns.args)
    path = report.write()
    report.uninstall()  # written once, here, not again at exit
    print(f"kiln: report written to {path}")
    return 1 if failure is not None else 0


def cmd_bisect(ns: argparse.Namespace) -> int:
    from kiln.debug.bisect import bisect

    targets: list[CompiledTarget] = []
    run_script(ns.script, ns.args, targets)
    called = [t for t in targets if t.calls]
    if not called:
        print("kiln bisect: the script compiled nothing that was called")
        return 2
    found = 0
    for target in called:
        args, kwargs = target.calls[0]
        name = getattr(target.model, "__qualname__", type(target.model).__name__)
        result = bisect(target.model, *args, **kwargs)
        print(f"== {name}\n{result}")
        found += result.stage is not None
    return 1 if found else 0


def cmd_minify(ns: argparse.Namespace) -> int:
    from kiln.debug.minify import MinifyResult, minify, minify_graph

    out = ns.out or os.path.join(os.getcwd(), "kiln_minified")
    if _is_repro(ns.script):
        import torch.fx

        from kiln.debug.repro import random_inputs

        module = runpy.run_path(ns.script, run_name="kiln_repro")
        gm = torch.fx.symbolic_trace(module["Repro"]())
        saved = module.get("SAVED_INPUTS")
        folder = os.path.dirname(os.path.abspath(ns.script))
        inputs = torch.load(os.path.join(folder, saved)) if saved else random_inputs(module["INPUTS"])
        stage = _repro_stage(ns.script)
        result = minify_graph(gm, inputs, stage)
    else:
        targets: list[CompiledTarget] = []
        run_script(ns.script, ns.args, targets)
        found: MinifyResult | None = None
        for target in (t for t in targets if t.calls):
            args, kwargs = target.calls[0]
            try:
                found = minify(target.model, *args, **kwargs)
                break
            except ValueError:  # this one compiles right; try the next
                continue
        if found is None:
            print("kiln minify: no compiled call of the script goes wrong")
            return 2
        result = found
    print(result)
    print(f"kiln: repro written to {result.write(out)}")
    return 1


def knob_table() -> str:
    """The README's settings table: one row per declaration of kiln.config, in declaration order."""
    rows = ["| `kiln.config` | environment | type | default | meaning |", "|---|---|---|---|---|"]
    for k in config.KNOBS:
        cells = [f"`{k.name}`" if k.name else "", f"`{k.env}`" if k.env else "", k.type_name, k.shown, k.meaning]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def cmd_knobs(ns: argparse.Namespace) -> int:
    if ns.markdown:
        print(knob_table(), end="")
        return 0
    for k in config.KNOBS:
        value = getattr(config, k.name) if k.name else k.from_env()
        where = f"kiln.config.{k.name}" if k.name else k.env
        print(f"{where} = {value!r}" + (f"  ({k.env})" if k.name and k.env else "") + f"  # {k.meaning}")
    return 0


def cmd_boundary(ns: argparse.Namespace) -> int:
    print(f"kiln: the boundary extension is built: {native.build_boundary()}")
    return 0


def _is_repro(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return "class Repro(torch.nn.Module)" in text and "check_repro(" in text


def _repro_stage(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "check_repro(" in line and 'stage="' in line:
                return line.split('stage="', 1)[1].split('"', 1)[0]
    return "lower"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lint = commands.add_parser("lint", help="find compile hazards in source files")
    lint.add_argument("paths", nargs="+")
    lint.set_defaults(run=cmd_lint)
    for name, run, help_ in (("report", cmd_report, "run a script and write the HTML report"),
                             ("bisect", cmd_bisect, "run a script and bisect what goes wrong"),
                             ("minify", cmd_minify, "shrink a failing graph to a small repro.py")):
        sub = commands.add_parser(name, help=help_)
        sub.add_argument("--out", help="folder for what is written")
        sub.add_argument("script")
        sub.add_argument("args", nargs=argparse.REMAINDER)
        sub.set_defaults(run=run)
    knobs = commands.add_parser("knobs", help="list the settings (--markdown: the README's table)")
    knobs.add_argument("--markdown", action="store_true")
    knobs.set_defaults(run=cmd_knobs)
    commands.add_parser("boundary", help="build the boundary extension now").set_defaults(run=cmd_boundary)
    ns = parser.parse_args(argv)
    return ns.run(ns)


if __name__ == "__main__":
    sys.exit(main())
