"""KILN_DEBUG=1: write every capture to ./kiln_debug/run_<time>/ with an index page.

One folder per captured frame (in capture order): the original bytecode, the glue's Python, each
graph as Python, the guards and their generated check function, the graph breaks. `index.html`
links them and says why each frame was (re)compiled. The writer listens to the entry's capture
events; later stages add their files (ATen graphs, kernels) under the same run folder through
`run_dir()`. Counterpart: TORCH_COMPILE_DEBUG's torch_compile_debug/ folder.
"""
from __future__ import annotations

import dis
import os
from typing import Any

from kiln import config, log
from kiln.capture import entry

_installed = False


def run_dir() -> str:
    """The folder of this process's dump (created on first use; shared with every stage via kiln.log)."""
    return log.dump_run_dir()


def install() -> None:
    """Listen to every capture; events are written only while config.debug (KILN_DEBUG=1) is on.
    The package installs this at import, so no stage needs to import kiln.debug. Idempotent."""
    global _installed
    if not _installed:
        entry.add_observer(write_event)
        log.on_dump_row(_write_index)
        _installed = True


def reset() -> None:
    """Forget the run folder: the next capture under KILN_DEBUG starts a fresh one."""
    log.reset_dump()


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)


def write_event(event: entry.CaptureEvent) -> None:
    """Write one capture event's artifacts, then refresh the index page."""
    if not config.debug:
        return
    fn = event.fn
    folder_name = f"{len(log.dump_rows()):03d}_{fn.__qualname__.replace('<', '').replace('>', '').replace('.', '_')}"
    folder = os.path.join(run_dir(), folder_name)
    os.makedirs(folder, exist_ok=True)
    code = fn.__code__
    _write(folder, "bytecode_before.txt",
           f"# {fn.__qualname__} at {code.co_filename}:{code.co_firstlineno}\n" + dis.Bytecode(code).dis())
    result = event.result
    if result is None:
        note = f"ran eagerly: {event.fallback_reason}"
        _write(folder, "fallback.txt", note + "\n")
    else:
        note = f"{len(result.graphs)} graph(s), {len(result.breaks)} break(s)"
        _write(folder, "glue.py", result.glue_source)
        for i, gm in enumerate(result.graphs):
            _write(folder, f"graph_{i}.py", _graph_text(gm))
        from kiln.capture.guards import compile_guards

        check = compile_guards(result.guards)
        _write(folder, "guards.py", "# guards\n" + "".join(f"#   {g}\n" for g in check.guards) + "\n" + check.source)
        if result.breaks:
            _write(folder, "breaks.txt", "\n\n".join(str(b) for b in result.breaks) + "\n")
    if event.recompile_reason:
        note += f"; recompiled because {event.recompile_reason}"
    log.add_dump_row(folder_name, fn.__qualname__, note)


def _graph_text(gm: Any) -> str:
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # a backend may hand back a graph whose readable print fails; the code still shows
        return gm.code


def _write_index() -> None:
    import html  # only under KILN_DEBUG: a plain `import kiln` does not load it

    rows = log.dump_rows()
    table = "\n".join(
        f"<tr><td><a href='{html.escape(folder)}/'>{html.escape(folder)}</a></td>"
        f"<td>{html.escape(name)}</td><td>{html.escape(note)}</td></tr>"
        for folder, name, note in rows
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>kiln debug</title></head><body>\n"
        f"<h1>kiln debug dump</h1><p>{len(rows)} folder(s); counters: {entry.STATS.as_dict()}</p>\n"
        "<table border='1' cellpadding='4'><tr><th>folder</th><th>frame</th><th>what happened</th></tr>\n"
        f"{table}\n</table></body></html>\n"
    )
    _write(run_dir(), "index.html", page)
