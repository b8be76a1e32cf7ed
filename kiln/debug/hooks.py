"""What kiln.debug attaches to the stages, so that no stage has to import kiln.debug.

The package root calls `install()` once at import. The KILN_DEBUG dump listens to the entry's
capture events (it writes only while config.debug is on), and two hooks in the inductor backend's
table wrap its compilers only while their setting is on: the run report (config.report_dir,
KILN_REPORT: each lowered graph goes on the page) and the accuracy repro (config.repro_after,
KILN_REPRO_AFTER: the stage named is watched against eager). Each hook loads its module on first
use, so a plain `import kiln` stays cheap. Counterpart: the debug wrappers torch._inductor applies
around its compile_fx when its config asks for them.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from kiln import backends, config
from kiln.debug import dump

Compiler = Callable[..., Any]


def install() -> None:
    """Attach the dump and the inductor hooks (idempotent); the report, when KILN_REPORT is set."""
    dump.install()
    backends.add_inductor_hook(record_in_report)
    backends.add_inductor_hook(watch_for_repro)
    if config.report_dir:  # KILN_REPORT: collect the run for the HTML page written at exit
        from kiln.debug import report

        report.install()


def record_in_report(make_backend: Compiler, fw_compiler: Compiler,
                     bw_compiler: Compiler) -> tuple[Compiler, Compiler, Compiler]:
    """Under KILN_REPORT each compiler also hands its compiled graph to the run report."""
    if not config.report_dir:
        return make_backend, fw_compiler, bw_compiler
    from kiln.debug.report import recording

    return make_backend, recording(fw_compiler), recording(bw_compiler)


def watch_for_repro(make_backend: Compiler, fw_compiler: Compiler,
                    bw_compiler: Compiler) -> tuple[Compiler, Compiler, Compiler]:
    """Under KILN_REPRO_AFTER the backend is built by the repro watcher around AOT autograd."""
    if not config.repro_after:
        return make_backend, fw_compiler, bw_compiler
    from kiln.debug.repro import watched_inductor

    return functools.partial(watched_inductor, make_backend), fw_compiler, bw_compiler
