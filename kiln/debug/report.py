"""The run report: one static HTML page of everything a compiled run did (KILN_REPORT=dir).

A Collector listens to the entry's capture events and, through the inductor backend, to each graph
it lowers. Per frame it keeps the source, the captured graphs, the graph breaks (line, reason,
hint), the guards, why it was recompiled (the guard that failed), the AOT saved-tensor table and
the ops the backward recomputes (checkpointed regions marked), the ATen graphs, each kernel with
the FX nodes it fused and its C++, and compile time per stage.
`write()` renders `<dir>/report_<time>/index.html`: no script, no server, links inside the page.
Counterpart: tlparse over TORCH_TRACE logs (here built in, read in a browser as is).
"""
from __future__ import annotations

import atexit
import html
import inspect
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kiln import config


@dataclass
class LoweredGraph:
    """One ATen graph the lowering compiled: its code, schedule, kernels and wrapper."""

    aten_code: str
    schedule: str
    kernels: list[tuple[str, list[str], str]]  # (name, FX nodes fused, C++)
    wrapper: str
    timings: dict[str, float]


@dataclass
class FrameReport:
    name: str
    filename: str
    lineno: int
    source: str
    recompile_reason: str | None
    fallback_reason: str | None
    graphs: list[str] = field(default_factory=list)  # captured graphs' code
    breaks: list[Any] = field(default_factory=list)  # BreakRecord
    guards: list[str] = field(default_factory=list)
    glue: str = ""
    aot: list[Any] = field(default_factory=list)  # AotReport
    lowered: list[LoweredGraph] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class Collector:
    """What one process compiled, frame by frame, in capture order."""

    def __init__(self) -> None:
        self.frames: list[FrameReport] = []
        self.pending: list[LoweredGraph] = []  # lowered during the capture now running
        self.seen_aot: set[int] = set()
        self.seen_times = 0

    def on_capture(self, event: Any) -> None:
        fn = event.fn
        code = fn.__code__
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):  # a resume function or code without a file
            source = ""
        frame = FrameReport(fn.__qualname__, code.co_filename, code.co_firstlineno, source,
                            event.recompile_reason, event.fallback_reason)
        result = event.result
        if result is not None:
            frame.graphs = [gm.code.strip() for gm in result.graphs]
            frame.breaks = list(result.breaks)
            frame.guards = [str(g) for g in result.guards]
            frame.glue = getattr(result, "glue_source", "")
        frame.lowered, self.pending = self.pending, []
        frame.aot = self._new_aot_reports()
        frame.seconds = self._frame_seconds()
        self.frames.append(frame)

    def _new_aot_reports(self) -> list[Any]:
        import sys

        autograd = sys.modules.get("kiln.autograd")
        if autograd is None:
            return []
        fresh = [r for r in autograd.recent_reports() if id(r) not in self.seen_aot]
        self.seen_aot.update(id(r) for r in fresh)
        return fresh

    def _frame_seconds(self) -> dict[str, float]:
        from kiln import compile_time

        records = compile_time.frames()
        if len(records) <= self.seen_times:
            return {}
        last = records[-1]
        self.seen_times = len(records)
        return dict(last.seconds)

    def on_lowered(self, aten_gm: Any, compiled: Any) -> None:
        from kiln.debug.bisect import kernel_function
        from kiln.lower.schedule import Kernel, ScatterKernel, format_program

        program = getattr(compiled, "program", None)
        if program is None:
            return
        kernels = []
        for step in program.steps:
            if isinstance(step, (Kernel, ScatterKernel)):
                origins = step.origins() if isinstance(step, Kernel) else list(step.node.origins)
                kernels.append((step.name, list(dict.fromkeys(origins)), kernel_function(compiled.cpp_source, step.name)))
        self.pending.append(LoweredGraph(aten_gm.code.strip(), format_program(program), kernels,
                                         compiled.wrapper_source, dict(compiled.timings)))


_collector: Collector | None = None


def install() -> Collector:
    """Start collecting (KILN_REPORT or `python -m kiln report`); the page is written at exit."""
    global _collector
    if _collector is None:
        from kiln.capture import entry

        _collector = Collector()
        entry.add_observer(_collector.on_capture)
        atexit.register(_write_at_exit)
    return _collector


def uninstall() -> None:
    global _collector
    if _collector is not None:
        from kiln.capture import entry

        entry.remove_observer(_collector.on_capture)
    _collector = None


def recording(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """A lowering compiler that also hands each compiled graph to the report."""

    def compile_and_record(gm: Any, example_inputs: list) -> Any:
        compiled = compiler(gm, example_inputs)
        if _collector is not None:
            _collector.on_lowered(gm, compiled)
        return compiled

    return compile_and_record


def _write_at_exit() -> None:
    if _collector is not None and _collector.frames:
        path = write()
        print(f"kiln: report written to {path}")


def write(folder: str | None = None) -> str:
    """Render the collected run to `<folder>/report_<time>_<pid>/index.html`; returns its path."""
    from kiln import api  # the package root imports kiln.debug: this module reads the api, not the root

    root = folder or config.report_dir or os.path.join(os.getcwd(), "kiln_report")
    out = os.path.join(root, time.strftime("report_%Y%m%d_%H%M%S") + f"_{os.getpid()}")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "index.html")
    frames = _collector.frames if _collector is not None else []
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(frames, api.stats()))
    return path


# ---------------------------------------------------------------------------------------------------
# HTML

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 12px; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { border: 1px solid #ccc; padding: 2px 8px;
text-align: left; font-size: 13px; vertical-align: top; }
.break { background: #ffe9e9; } .hint { color: #06592a; } .note { color: #555; }
nav li { margin: 2px 0; } details { margin: 0.4em 0; } summary { cursor: pointer; font-weight: 600; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _table(headers: list[str], rows: list[list[Any]], row_class: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr" + (f' class="{row_class}"' if row_class else "") + ">"
                   + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _code(text: str, title: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{_e(title)}</summary><pre>{_e(text)}</pre></details>"


def _source(frame: FrameReport) -> str:
    """The frame's source with line numbers, the lines where it broke marked."""
    if not frame.source:
        return '<p class="note">no source (generated code)</p>'
    marked = {b.lineno for b in frame.breaks if os.path.abspath(b.filename) == os.path.abspath(frame.filename)}
    lines = []
    for k, text in enumerate(frame.source.splitlines()):
        lineno = frame.lineno + k
        cls = ' class="break"' if lineno in marked else ""
        lines.append(f'<span id="L{id(frame)}_{lineno}"{cls}>{lineno:5d}  {_e(text)}</span>')
    return "<pre>" + "\n".join(lines) + "</pre>"


def _frame_section(k: int, frame: FrameReport) -> str:
    parts = [f'<h2 id="frame-{k}">Frame {k}: {_e(frame.name)}</h2>',
             f'<p class="note">{_e(frame.filename)}:{frame.lineno}</p>']
    if frame.recompile_reason:
        parts.append(f'<p id="recompile-{k}"><b>Recompiled</b> because a guard failed: {_e(frame.recompile_reason)}</p>')
    if frame.fallback_reason:
        parts.append(f"<p><b>Ran eagerly:</b> {_e(frame.fallback_reason)}</p>")
    parts.append("<h3>Source</h3>" + _source(frame))
    parts.append(f'<h3 id="breaks-{k}">Graph breaks ({len(frame.breaks)})</h3>')
    if frame.breaks:
        rows = [[f"{_e(os.path.basename(b.filename))}:{b.lineno}", f"<code>{_e(b.source_line.strip())}</code>",
                 _e(b.reason), f'<span class="hint">{_e(b.suggestion or "")}</span>'] for b in frame.breaks]
        parts.append(_table(["line", "source", "reason", "hint"], rows, "break"))
    parts.append(f"<h3>Graphs ({len(frame.graphs)})</h3>")
    for g, code in enumerate(frame.graphs):
        parts.append(_code(code, f"captured graph {g} (torch level)"))
    if frame.glue:
        parts.append(_code(frame.glue, "glue (runs graphs, side effects and breaks)"))
    parts.append(f"<h3>Guards ({len(frame.guards)})</h3><pre>{_e(chr(10).join(frame.guards))}</pre>")
    if frame.aot:
        parts.append(f'<h3 id="aot-{k}">AOT autograd: saved tensors</h3>')
        for report in frame.aot:
            rows = [[_e(s.name), _e(s.produced_by), _e(list(s.shape)), _e(s.dtype), s.nbytes] for s in report.saved]
            bytes_ = ", ".join(f"{p}: {n} B" for p, n in report.saved_bytes.items())
            parts.append(f"<p>graph {_e(report.graph)}, partitioned with {_e(report.policy)}; saved {_e(bytes_)}</p>")
            parts.append(_table(["saved", "produced by", "shape", "dtype", "bytes"], rows))
            recomputed = report.recomputed
            if recomputed:
                regions = sum(r.region is not None for r in recomputed)
                parts.append(f"<p>recomputed in the backward: {len(recomputed)} ops, {regions} of them in "
                             "checkpointed regions (torch.utils.checkpoint)</p>")
                rows = [[_e(r.name), _e(r.op), _e("" if r.region is None else r.region),
                         _e(r.policy or "chosen by the min-cut")] for r in recomputed]
                parts.append(_table(["recomputed", "op", "checkpoint region", "why"], rows))
            parts.append(_code(report.forward_code, "ATen forward graph"))
            parts.append(_code(report.backward_code, "ATen backward graph"))
    if frame.lowered:
        parts.append(f'<h3 id="kernels-{k}">Lowering: kernels</h3>')
        for g, low in enumerate(frame.lowered):
            rows = [[f'<a href="#kernel-{k}-{g}-{_e(name)}">{_e(name)}</a>', _e(", ".join(nodes))]
                    for name, nodes, _ in low.kernels]
            parts.append(f"<p>ATen graph {g}: {len(low.kernels)} kernels</p>" + _table(["kernel", "FX nodes fused"], rows))
            parts.append(_code(low.aten_code, f"ATen graph {g}"))
            parts.append(_code(low.schedule, f"schedule of graph {g}"))
            for name, nodes, source in low.kernels:
                parts.append(f'<div id="kernel-{k}-{g}-{_e(name)}">' + _code(source, f"{name}: {', '.join(nodes)}")
                             + "</div>")
            parts.append(_code(low.wrapper, f"wrapper of graph {g}"))
    if frame.seconds:
        rows = [[_e(stage), f"{s * 1e3:.1f}"] for stage, s in frame.seconds.items()]
        parts.append(f'<h3 id="time-{k}">Compile time</h3>' + _table(["stage", "ms"], rows))
    return "\n".join(parts)


def render(frames: list[FrameReport], stats: dict[str, Any]) -> str:
    """The whole page: summary, a linked table of contents, one section per frame."""
    toc = []
    for k, frame in enumerate(frames):
        extra = []
        if frame.breaks:
            extra.append(f'<a href="#breaks-{k}">{len(frame.breaks)} breaks</a>')
        if frame.recompile_reason:
            extra.append(f'<a href="#recompile-{k}">recompile</a>')
        if frame.lowered:
            extra.append(f'<a href="#kernels-{k}">{sum(len(g.kernels) for g in frame.lowered)} kernels</a>')
        toc.append(f'<li><a href="#frame-{k}">{_e(frame.name)}</a> <span class="note">'
                   f'{_e(os.path.basename(frame.filename))}:{frame.lineno}</span> {" · ".join(extra)}</li>')
    counters = [[_e(k), _e(v if isinstance(v, int) else f"{v * 1e3:.1f} ms")] for k, v in stats.items()
                if not k.startswith("compile_time.")]
    times = [[_e(k.split(".", 1)[1]), f"{v * 1e3:.1f}"] for k, v in stats.items() if k.startswith("compile_time.")]
    body = [f"<h1>Kiln run report</h1><p class=\"note\">{_e(time.strftime('%Y-%m-%d %H:%M:%S'))}, "
            f"{len(frames)} captures</p>",
            '<h2 id="summary">Summary</h2>', '<h3 id="cache">Counters and cache hits</h3>',
            _table(["counter", "value"], counters),
            '<h3 id="compile-time">Compile time per stage</h3>', _table(["stage", "ms"], times),
            '<h2 id="frames">Frames</h2><nav><ol>' + "".join(toc) + "</ol></nav>"]
    body += [_frame_section(k, frame) for k, frame in enumerate(frames)]
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Kiln run report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")
