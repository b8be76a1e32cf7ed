"""`make demo`: Kiln at work on the small GPT of examples.gpt, stage by stage.

(a) fake tensors and symbolic sizes: a model built and run with no memory, a symbolic batch and
sequence length and the guards they produce; (b) capture: graphs, graph breaks and recompiles;
(c) AOT autograd: a training step with backend="aot_eager" against eager; (d) the whole stack:
the training step compiled by Kiln's default backend, timed against eager and the real
torch.compile, with compile times and the KILN_DEBUG dump. A section whose stage has not landed
says "not available yet: <why>" and the demo goes on; nothing is ever shown that did not run.
"""
from __future__ import annotations

import copy
import importlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Callable

import torch

from examples.gpt import GPT, GPTConfig, sample_batch

CONFIG = GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=4, n_embd=64, dropout=0.0)


class NotAvailable(Exception):
    """A stage the section needs has not landed yet."""


def require(module: str, attr: str) -> object:
    try:
        found = getattr(importlib.import_module(module), attr, None)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise NotAvailable(f"{module} does not exist yet") from None
    if found is None:
        raise NotAvailable(f"{module}.{attr} does not exist yet")
    return found


def fresh_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG)


def rss_mb() -> float | None:
    """This process's resident memory (Linux), to show that fake tensors allocate nothing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def median_ms(steps: dict[str, Callable[[], object]], runs: int = 10) -> dict[str, float]:
    """Median milliseconds per call of each step, after two warmup calls, the runs taken in turn
    (eager, kiln, torch, eager, ...) so that load from other processes hits all of them alike."""
    for step in steps.values():
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(runs):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def kiln_warnings(call: Callable[[], object]) -> tuple[object, list[str]]:
    """Run `call()`, returning its result and the first line of each warning Kiln raised (fallbacks
    to eager, a backend standing in for one that has not landed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    ours = [w for w in caught if w.category.__module__.startswith("kiln") or str(w.message).startswith("kiln")]
    return result, list(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in ours))


def require_graphs(what: str, fn: Callable, *args: object, **kwargs: object) -> None:
    """Raise NotAvailable unless Kiln compiled at least one graph since the last reset: a frame that
    ran eagerly must never be presented as compiled. The reason comes from kiln.explain."""
    import kiln

    if kiln.stats().get("graphs", 0) > 0:
        return
    report = kiln.explain(fn)(*args, **kwargs)
    reasons = [str(f) for f in getattr(report, "fallbacks", [])] or [str(r).strip().splitlines()[0] for r in report.break_reasons]
    raise NotAvailable(f"{what}: Kiln ran every frame eagerly ({reasons[0] if reasons else 'no graph was captured'})")


# (a) -------------------------------------------------------------------------------------------
def fake_tensors_and_symbolic_sizes() -> None:
    FakeTensorMode = require("kiln.fake", "FakeTensorMode")
    is_fake = require("kiln.fake", "is_fake")
    with FakeTensorMode():
        a = torch.randn(1024, 1024, device="cuda")
        b = a @ a
    print(f"lecture snippet: randn(1024, 1024, device='cuda') @ itself -> {tuple(b.shape)} {b.dtype} "
          f"on {b.device}, fake={is_fake(b)} (no GPU here, no memory used)")

    big = GPTConfig(block_size=1024, vocab_size=50304, n_layer=24, n_head=16, n_embd=1024)
    before, start = rss_mb(), time.perf_counter()
    with FakeTensorMode():
        model = GPT(big)
        idx = torch.randint(0, big.vocab_size, (8, big.block_size))
        logits, loss = model(idx, idx)
    grew = None if before is None else rss_mb() - before
    params = model.num_params()
    print(f"GPT-2 medium shape ({params / 1e6:.0f} M params, {params * 4 / 2**20:.0f} MiB if real) built and run "
          f"under FakeTensorMode in {time.perf_counter() - start:.1f} s; process memory grew by "
          f"{'?' if grew is None else f'{grew:.0f}'} MiB")
    print(f"  logits {tuple(logits.shape)}, loss {tuple(loss.shape)} {loss.dtype}, fake={is_fake(logits)}")

    ShapeEnv = require("kiln.symbolic", "ShapeEnv")
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    with mode:
        model = GPT(CONFIG)
    idx, targets = sample_batch(CONFIG, 4, 32)
    fake_idx = mode.from_real(idx, source="L['idx']", dynamic_dims=(0, 1))
    fake_targets = mode.from_real(targets, source="L['targets']", dynamic_dims=(0, 1))
    with mode:
        logits, loss = model(fake_idx, fake_targets)
    print(f"with a ShapeEnv, batch and sequence symbolic: idx {tuple(fake_idx.shape)} -> logits {tuple(logits.shape)}")
    print(f"  symbols: {env.symbol_sources()}")
    print(f"  {len(env.guards)} guards recorded (what a compiled graph would have to check before reuse):")
    for guard in env.guards:
        print(f"    {guard.python}")


# (b) -------------------------------------------------------------------------------------------
def forward_with_log(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    logits, _ = model(idx)
    print("    (user code) logits computed")
    return logits.softmax(-1)


def capture() -> None:
    require("kiln.capture", "capture_frame")
    import kiln

    kiln.reset()
    model = fresh_model()
    idx, targets = sample_batch(CONFIG, 4, 32)
    compiled = kiln.compile(model, backend="eager")
    (logits, loss), warned = kiln_warnings(lambda: compiled(idx, targets=targets))
    ref_logits, ref_loss = model(idx, targets=targets)
    print(f"kiln.compile(model, backend='eager'): loss {loss.item():.4f} (eager {ref_loss.item():.4f}), "
          f"max |logits diff| {(logits - ref_logits).abs().max().item():.2e}")
    for w in warned:
        print(f"  warning: {w}")
    print(f"  kiln.stats(): {kiln.stats()}")

    report = kiln.explain(model)(idx, targets=targets)
    print(f"kiln.explain(model): {report.graph_count} graph(s), {report.graph_break_count} break(s), "
          f"{report.op_count} ops, {len(report.guards)} guards")
    for fallback in getattr(report, "fallbacks", []):
        print(f"  not available yet: {fallback}")
    for record in report.break_reasons:
        print(f"  break: {str(record).strip().splitlines()[0]}")
    if report.graphs:
        code = report.graphs[0].code.strip().splitlines()
        print("  the graph as Python (first lines):")
        for line in code[:12]:
            print(f"    {line if len(line) <= 110 else line[:106] + ' ...'}")
        if len(code) > 12:
            print(f"    ... {len(code) - 12} more lines")

    print("a variant with a print in the middle:")
    report = kiln.explain(forward_with_log)(model, idx)
    print(f"kiln.explain(forward_with_log): {report.graph_count} graph(s), {report.graph_break_count} break(s)")
    for record in report.break_reasons:
        print("  " + str(record).strip().replace("\n", "\n  "))

    print("recompiles: the same compiled model called with sequence lengths 16, 32, 24 (KILN_LOGS=recompiles):")
    kiln.reset()
    log = sys.modules.get("kiln.log")
    if log is not None:
        log.configure("recompiles")
    try:
        compiled = kiln.compile(model, backend="eager")
        for seq in (16, 32, 24):
            compiled(*sample_batch(CONFIG, 4, seq))
            s = kiln.stats()
            print(f"  T={seq}: compiles={s.get('compiles')} recompiles={s.get('recompiles')} "
                  f"cache_hits={s.get('cache_hits')} graphs={s.get('graphs')} fallbacks={s.get('fallbacks')}")
    finally:
        if log is not None:
            log.configure()
    require_graphs("recompiles", model, *sample_batch(CONFIG, 4, 16))


# (c) -------------------------------------------------------------------------------------------
def train(model: GPT, step_fn: Callable, steps: int, batches: list) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for idx, targets in batches[:steps]:
        opt.zero_grad(set_to_none=True)
        _, loss = step_fn(idx, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def aot_training() -> None:
    require("kiln.capture", "capture_frame")
    require("kiln.autograd", "aot_eager")
    import kiln

    kiln.reset()
    batches = [sample_batch(CONFIG, 4, 32, seed=s) for s in range(3)]
    eager_model = fresh_model()
    kiln_model = copy.deepcopy(eager_model)
    compiled = kiln.compile(kiln_model, backend="aot_eager")
    eager_losses = train(eager_model, eager_model, 3, batches)
    kiln_losses, warned = kiln_warnings(lambda: train(kiln_model, compiled, 3, batches))
    for w in warned:
        print(f"  warning: {w}")
    require_graphs("aot_eager training step", fresh_model(), *batches[0])
    print("3 SGD steps, backend='aot_eager' (joint graph, min-cut partition, compiled backward) vs eager:")
    for i, (a, b) in enumerate(zip(eager_losses, kiln_losses)):
        print(f"  step {i}: loss eager {a:.6f}   kiln {b:.6f}")
    diff = max((p - q).abs().max().item() for p, q in zip(eager_model.parameters(), kiln_model.parameters()))
    print(f"  max |parameter difference| after the steps: {diff:.2e}")
    reports = getattr(importlib.import_module("kiln.autograd"), "recent_reports", None)
    if reports is None or not reports():
        print("  saved-activation report: not available yet: kiln.autograd.recent_reports gave nothing")
    else:
        report = reports()[-1]
        print(f"  activations saved for backward: {report.activation_bytes.get('save_all', 0) / 1024:.0f} KiB if the "
              f"partitioner saved everything the backward uses, {report.activation_bytes.get('min_cut', 0) / 1024:.0f} "
              f"KiB with min-cut (recomputing cheap pointwise ops instead)")
    print(f"  kiln.stats(): {kiln.stats()}")


# (d) -------------------------------------------------------------------------------------------
def training_step(model: GPT, step_model: Callable, idx: torch.Tensor, targets: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        _, loss = step_model(idx, targets)
        loss.backward()

    return step


def timed_first_call(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def inductor() -> None:
    require("kiln.capture", "capture_frame")
    require("kiln.autograd", "aot_autograd")
    require("kiln.lower", "compile_graph")
    import kiln

    idx, targets = sample_batch(CONFIG, 8, 64)
    scratch = tempfile.mkdtemp(prefix="kiln-demo-")  # empty caches: the first steps below are cold compiles
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor")
    debug_dir = os.path.join(os.getcwd(), "kiln_debug")
    kiln.reset()

    kiln_model = fresh_model()
    from kiln.debug import report  # the run report (KILN_REPORT=dir does the same for any script)

    report.install()
    machine_cache = kiln.config.cache_dir
    with kiln.config.patch(cache_dir=os.path.join(scratch, "kiln"), debug=True, debug_dir=debug_dir,
                           report_dir=os.path.join(os.getcwd(), "kiln_report")):
        kiln_step = training_step(kiln_model, kiln.compile(kiln_model), idx, targets)
        kiln_first, warned = kiln_warnings(lambda: timed_first_call(kiln_step))
        report_path = report.write()
        # a training loop's steady state: after 100 steps each hot graph runs its native wrapper,
        # built on a background thread (ATen's precompiled header comes from the machine's cache)
        from benchmarks.compilers import seed_precompiled_header, settle_kiln

        seed_precompiled_header(os.path.join(scratch, "kiln"), machine_cache)
        tier_up_s = settle_kiln(kiln_step)
    report.uninstall()
    for w in warned:
        print(f"  warning: {w}")
    stats = kiln.stats()
    require_graphs("inductor training step", fresh_model(), idx, targets)

    eager_model = fresh_model()
    eager_step = training_step(eager_model, eager_model, idx, targets)
    eager_step()
    grad_diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(eager_model.parameters(), kiln_model.parameters()))
    torch_model = fresh_model()
    torch_step = training_step(torch_model, torch.compile(torch_model), idx, targets)
    torch_first = timed_first_call(torch_step)
    ms = median_ms({"eager": eager_step, "kiln": kiln_step, "torch": torch_step})
    eager_ms, kiln_ms, torch_ms = ms["eager"], ms["kiln"], ms["torch"]

    print(f"training step (forward, cross-entropy, backward), batch 8 x 64 tokens, {torch.get_num_threads()} threads:")
    print(f"  eager            {eager_ms:8.2f} ms/step")
    print(f"  kiln (inductor)  {kiln_ms:8.2f} ms/step  {eager_ms / kiln_ms:5.2f}x eager   first step (cold compile) {kiln_first:6.1f} s")
    print(f"  torch.compile    {torch_ms:8.2f} ms/step  {eager_ms / torch_ms:5.2f}x eager   first step (cold compile) {torch_first:6.1f} s")
    print(f"  kiln timed after {kiln.config.native_wrapper_after} steps, when its hot graphs had tiered up to their "
          f"native wrappers ({tier_up_s:.1f} s of background builds)")
    print(f"  max |grad difference| kiln vs eager on the same batch: {grad_diff:.2e}")
    print(f"  kiln.stats(): {stats}")
    if stats.get("fallbacks"):
        print(f"  note: {stats['fallbacks']} call(s) of a frame ran eagerly, so the kiln line is not all compiled code")
    runs = sorted(d for d in os.listdir(debug_dir) if d.startswith("run_")) if os.path.isdir(debug_dir) else []
    if runs:
        print(f"  KILN_DEBUG dump of this compile: {os.path.join(debug_dir, runs[-1])} (open index.html)")
    else:
        print("  KILN_DEBUG dump: not available yet: no dump folder was written")
    print(f"  run report (frames, breaks, guards, saved tensors, kernels, compile time): {report_path}")


SECTIONS = (
    ("(a) fake tensors and symbolic sizes", fake_tensors_and_symbolic_sizes),
    ("(b) capture: graphs, graph breaks, recompiles", capture),
    ("(c) AOT autograd: a training step with backend='aot_eager'", aot_training),
    ("(d) the whole stack: the training step compiled, against eager and torch.compile", inductor),
)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # keep our lines in order with KILN_LOGS on stderr
    print(f"Kiln demo on a small GPT ({fresh_model().num_params() / 1e3:.0f} K params), torch {torch.__version__}")
    for title, section in SECTIONS:
        print(f"\n== {title} ==")
        try:
            section()
        except NotAvailable as exc:
            print(f"not available yet: {exc}")
        except Exception as exc:  # a stage that exists but fails: say so in one line, go on
            text = str(exc).strip().splitlines()
            print(f"not available yet: {type(exc).__name__}: {text[0] if text else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
