"""The HTML run report: its sections from a run with a break, a recompile and lowered kernels;
and the page as a real headless browser renders it (skipped when chromium is not installed)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

import kiln
from kiln.debug import report

pytestmark = pytest.mark.cpp
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def noisy(x, w):
    h = torch.relu(x @ w)
    print("step")  # a graph break
    return (h * 2).softmax(-1).sum()


class Anchors(HTMLParser):
    """Every id and every in-page link of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("report"))
    with kiln.config.patch(report_dir=folder, persistent_cache=False,
                           cache_dir=str(tmp_path_factory.mktemp("cache"))):
        kiln.reset()
        report.uninstall()
        report.install()
        try:
            w = torch.randn(8, 8, requires_grad=True)
            compiled = kiln.compile(noisy)
            compiled(torch.randn(4, 8), w).backward()
            compiled(torch.randn(6, 8), w).backward()  # another size: a recompile
            path = report.write()
        finally:
            report.uninstall()
            kiln.reset()
    return path


def test_sections_and_links(page):
    text = open(page).read()
    for heading in ("Kiln run report", "Summary", "Counters and cache hits", "Compile time per stage", "Frames",
                    "Graph breaks (1)", "Source", "Guards", "AOT autograd: saved tensors", "Lowering: kernels"):
        assert heading in text, heading
    parsed = Anchors()
    parsed.feed(text)
    assert parsed.links and set(parsed.links) <= parsed.ids, set(parsed.links) - parsed.ids
    assert "frame-0" in parsed.ids and any(i.startswith("kernel-") for i in parsed.ids)


def test_breaks_guards_recompiles_kernels(page):
    text = open(page).read()
    assert "call to print()" in text and 'print(&quot;step&quot;)' in text  # reason and the source line
    assert "move the print out of the compiled region" in text  # the hint
    assert re.search(r"Recompiled</b> because a guard failed: .*x\.size\(\)\[0\]", text)
    assert "fused from" in text and 'extern &quot;C&quot; void kernel0' in text
    assert "cache_hits" in text and "capture" in text and "lower.schedule" in text


@pytest.mark.slow
def test_report_via_environment_at_exit(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import torch, kiln\nf = kiln.compile(lambda x: x.sin() + 1)\nf(torch.randn(3))\n")
    env = dict(os.environ, KILN_REPORT=str(tmp_path / "out"), PYTHONPATH=ROOT, KILN_CACHE_DIR=str(tmp_path / "c"))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "kiln: report written to" in done.stdout
    (folder,) = os.listdir(tmp_path / "out")
    assert os.path.exists(tmp_path / "out" / folder / "index.html")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")
def test_renders_in_a_headless_browser(page, tmp_path):
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path}"]
    dom = subprocess.run(args + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = Anchors()
    rendered.feed(dom.stdout)  # the DOM the browser built, not our text: it parsed every section
    assert {"summary", "frames", "frame-0", "breaks-0"} <= rendered.ids
    assert set(rendered.links) <= rendered.ids
    shot = tmp_path / "page.png"
    subprocess.run(args + ["--window-size=1200,2000", f"--screenshot={shot}", "file://" + page + "#breaks-0"],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000  # a real picture, not an empty page
