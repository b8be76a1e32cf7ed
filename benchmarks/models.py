"""`make bench-models`: the real-model corpus (tests/e2e/real_models.py) under eager, Kiln and torch.compile.

For each model, inference (eval, no_grad) and a training step (forward, loss, backward): the median
step time of each compiler in one process (samples taken in turn), the speedups over eager, the
seconds of the first compiled call (capture and compilation, cold: empty caches), and the warm start
(the first call in a second process that finds the first one's cache on disk) for inference; then
the geomeans. Before Kiln is timed its step runs until its hot graphs have tiered up to their native
wrappers (built on a background thread; "kiln bg s" is that build time). Kiln's result is compared with eager's: a model whose output differs is reported as
such and left out of the geomeans, as is a compiler that raised.

    python -m benchmarks.models                      # every model (long on 2 cores)
    python -m benchmarks.models --quick              # five models, few samples, no warm start
    python -m benchmarks.models --only gpt2,bert     # chosen models (repeat or comma-separate)
    python -m benchmarks.models --modes infer        # inference only
    python -m benchmarks.models --no-warm            # skip the second-process measurements
    python -m benchmarks.models --held-out --threads 1   # the held-out models (tests/e2e/held_out_models.py)
    python -m benchmarks.models --cnn --threads 1        # the held-out CNNs (tests/e2e/cnn_models.py)
    python -m benchmarks.models --held-out9 --threads 1  # the ninth held-out set (tests/e2e/held_out_models9.py)

With --held-out the models are the 33 held-out `transformers` families that the project does not
tune against (the way a new user meets Kiln); detr and yolos run inference only (their losses need
scipy's matcher). With --cnn they are five torchvision-style CNNs written here (MobileNetV2,
ShuffleNetV2, DenseNet, SqueezeNet, ResNeXt with squeeze-excitation). --threads sets torch's thread count for every compiler (the default leaves torch's).

"k early" is Kiln before tier-up in the main process, whose cache may already hold the boundary extension
(`make venv` builds it): guards and plans are then native from the first call. "k py/t" is the Python tier
measured honestly: a fresh process per model and mode with an empty Kiln cache and tier-up held
(KILN_NATIVE_WRAPPER_AFTER=0, so nothing builds the extension), Kiln, torch.compile and eager timed in turn
there (least CPU time of the calling thread per call: a fair measure at --threads 1 on a shared machine);
Kiln's speedup over eager divided by torch.compile's (--no-python-tier skips it).
"""
from __future__ import annotations

import os

# Three OpenMP pools share this process (ATen's, Kiln's kernels', Inductor's kernels'), and idle
# threads of one pool spin while another works: measured on 2 busy cores, an eager BERT call took
# 9 ms alone, 19 ms once Kiln's kernels had run and 290 ms after torch.compile's (2.8 ms with passive
# waiting). A user's process has one compiler; passive waiting keeps the others from taxing it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

from benchmarks.timing import geomean, measure_interleaved

QUICK_MODELS = ("gpt2", "bert", "llama", "t5", "vit")
COMPILERS = ("kiln", "torch")
_CACHE_ENV = {"kiln": "KILN_CACHE_DIR", "torch": "TORCHINDUCTOR_CACHE_DIR"}


_HELD_OUT = False  # set by --held-out (and passed on to the warm-start children)
_CNN = False  # set by --cnn (likewise)
_SET9 = False  # set by --held-out9 (with _HELD_OUT): tests/e2e/held_out_models9.py's families
INFER_ONLY = {"detr", "yolos"}  # held-out models whose losses match boxes with scipy's solver


def _corpus() -> Any:
    from tests.e2e import real_models  # the corpus lives with the tests that check it

    return real_models


def _models() -> dict[str, Any]:
    """The models benched: the corpus, with --held-out the held-out families, with --cnn the CNNs."""
    if _CNN:
        from tests.e2e.cnn_models import CNN_MODELS

        return CNN_MODELS
    if not _HELD_OUT:
        return _corpus().MODELS
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e")
    if here not in sys.path:
        sys.path.insert(0, here)  # held_out_models imports its helpers as `real_models`, as its tests do
    if _SET9:
        from held_out_models9 import HELD_OUT9

        return HELD_OUT9
    from held_out_models import HELD_OUT

    return HELD_OUT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.models", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"models {', '.join(QUICK_MODELS)}, few samples, no warm start")
    parser.add_argument("--only", action="append", default=[], help="model name(s) of tests/e2e/real_models.py")
    parser.add_argument("--modes", default="infer,train", help="infer, train or both (comma-separated)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-start subprocesses")
    parser.add_argument("--samples", type=int, default=None, help="timed samples per compiler")
    parser.add_argument("--json", default="bench_models.json", help="where to write the results")
    parser.add_argument("--held-out", action="store_true", help="the held-out models instead of the corpus")
    parser.add_argument("--cnn", action="store_true", help="the held-out torchvision-style CNNs instead")
    parser.add_argument("--held-out9", action="store_true", help="the ninth held-out set instead")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for every compiler")
    parser.add_argument("--no-python-tier", dest="python_tier", action="store_false",
                        help="skip the Python-tier subprocesses (the 'k py/t' column)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "MODE", "COMPILER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = [name for item in args.only for name in item.split(",") if name]
    args.modes = [m for m in args.modes.split(",") if m]
    if set(args.modes) - {"infer", "train"}:
        parser.error("--modes takes infer and/or train")
    global _HELD_OUT, _CNN, _SET9
    _HELD_OUT, _CNN, _SET9 = args.held_out or args.held_out9, args.cnn, args.held_out9
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child is None:
        known = set(_models())
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return args


# ---------------------------------------------------------------------------------------------------
# One model in this process


def _wrap(compiler: str, model: torch.nn.Module) -> Callable:
    if compiler == "eager":
        return model
    if compiler == "kiln":
        import kiln

        return kiln.compile(model)
    return torch.compile(model)


def _step(rm: Any, entry: Any, model: torch.nn.Module, fn: Callable, training: bool) -> Callable[[], Any]:
    """One call (inference) or one training step (zero grads, forward, loss, backward); inputs that
    hold objects a call changes (a KV cache) are made again for every call."""
    fixed = entry.inputs(training)
    fresh = any(not isinstance(v, (torch.Tensor, bool, int, float, type(None))) for v in fixed.values())
    model.train(training)

    def step() -> Any:
        kwargs = entry.inputs(training) if fresh else fixed
        if not training:
            with torch.no_grad():
                return fn(**kwargs)
        for p in model.parameters():
            p.grad = None
        out = fn(**kwargs)
        rm._scalar_loss(out).backward()
        return out

    return step


def _reset(compiler: str) -> None:
    if compiler == "kiln":
        import kiln

        kiln.reset()
    elif compiler == "torch":
        torch._dynamo.reset()


def bench_model(name: str, training: bool, opts: dict) -> dict:
    """Timings, speedups, first-call seconds and Kiln's agreement with eager for one model and mode."""
    rm = _corpus()
    entry = _models()[name]
    row: dict[str, Any] = {"model": name, "mode": "train" if training else "infer", "errors": {}}
    steps: dict[str, Callable[[], Any]] = {}
    models = {c: entry.build() for c in ("eager", *COMPILERS)}
    steps["eager"] = _step(rm, entry, models["eager"], models["eager"], training)
    want = rm._as_tree(steps["eager"]())
    for compiler in COMPILERS:
        _reset(compiler)
        try:
            step = _step(rm, entry, models[compiler], _wrap(compiler, models[compiler]), training)
            start = time.perf_counter()
            got = rm._as_tree(step())
            row[f"{compiler}_first_s"] = time.perf_counter() - start
            try:
                rm.assert_close_trees(rm._detach(got), rm._detach(want), max(entry.tol, 1e-3), name)
            except AssertionError as exc:
                row["errors"][compiler] = f"output differs from eager: {str(exc).splitlines()[0][:160]}"
                continue
            steps[compiler] = step
        except Exception as exc:
            row["errors"][compiler] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    if "kiln" in steps:
        # before tier-up: calls 2.. of Kiln (plans or the Python wrapper), a handful of single calls in
        # turn with eager's and torch.compile's, well under kiln.config.native_wrapper_after calls
        early = measure_interleaved(steps, warmup=0, samples=opts["early_samples"], min_sample_s=0.0)
        row["kiln_early_speedup"] = early["eager"].median_s / early["kiln"].median_s
        if "torch" in early:
            row["torch_early_speedup"] = early["eager"].median_s / early["torch"].median_s
        try:  # time the steady state: hot graphs on their native wrappers
            from benchmarks.compilers import settle_kiln

            row["kiln_tier_up_s"] = settle_kiln(steps["kiln"])
        except Exception as exc:
            row["errors"]["kiln"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            del steps["kiln"]
    if "kiln" in steps:
        import kiln

        stats = kiln.stats()
        row["kiln_graphs"], row["kiln_breaks"] = stats.get("graphs", 0), stats.get("graph_breaks", 0)
        row["kiln_fallbacks"] = stats.get("fallbacks", 0)
    timings = measure_interleaved(steps, warmup=opts["warmup"], samples=opts["samples"], min_sample_s=0.02)
    for compiler, timing in timings.items():
        row[f"{compiler}_ms"] = timing.ms
    for compiler in COMPILERS:
        if compiler in timings:
            row[f"{compiler}_speedup"] = timings["eager"].median_s / timings[compiler].median_s
    return row


# ---------------------------------------------------------------------------------------------------
# Warm start: the first call in a second process


def child(name: str, mode: str, compiler: str) -> dict:
    """Run in a fresh process: one eager call (PyTorch's own one-time costs), then the compiler's
    import, wrapping and first call, timed."""
    rm = _corpus()
    entry = _models()[name]
    training = mode == "train"
    model = entry.build()
    _step(rm, entry, model, model, training)()
    start = time.perf_counter()
    if compiler == "kiln":
        import kiln  # noqa: F401  (timed: a user's warm start includes it)
    step = _step(rm, entry, model, _wrap(compiler, model), training)
    step()
    out: dict[str, Any] = {"first_call_s": time.perf_counter() - start}
    if compiler == "kiln":
        import kiln

        stats = kiln.stats()
        out.update(frames=stats["frames"], disk_hits=stats["disk_hits"])
    return out


def _child_run(name: str, mode: str, compiler: str, cache: str) -> dict:
    env = {**os.environ, _CACHE_ENV[compiler]: cache}
    env.pop("KILN_LOGS", None)
    flags = (["--held-out9"] if _SET9 else ["--held-out"] * _HELD_OUT) + ["--cnn"] * _CNN + (["--threads", str(torch.get_num_threads())])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", *flags, "--child", name, mode, compiler],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def python_tier(name: str, mode: str) -> dict:
    """Run in a fresh process whose Kiln cache is empty and that never tiers up (the parent sets
    KILN_CACHE_DIR and KILN_NATIVE_WRAPPER_AFTER=0): Kiln's Python tier as a first process with a
    cold cache meets it (generated Python guards, Python wrappers, no boundary extension: nothing
    builds it), timed in turn with eager and torch.compile. The speedups over eager of both compilers
    come from the same samples; `boundary_loaded` says whether the extension was loaded after all
    (then the numbers are not the Python tier's, and the row says so)."""
    rm = _corpus()
    entry = _models()[name]
    training = mode == "train"
    models = {c: entry.build() for c in ("eager", *COMPILERS)}
    steps = {c: _step(rm, entry, models[c], models[c] if c == "eager" else _wrap(c, models[c]), training)
             for c in ("eager", *COMPILERS)}
    for step in steps.values():
        for _ in range(3):
            step()  # capture, compile and recompiles, outside the timing
    cpu_s = _cpu_min_interleaved(steps, samples=15, calls=3)
    from kiln.runtime import boundary

    out: dict[str, Any] = {"boundary_loaded": bool(boundary._loaded)}
    for compiler, seconds in cpu_s.items():
        out[f"{compiler}_us"] = seconds * 1e6
    for compiler in COMPILERS:
        out[f"{compiler}_speedup"] = cpu_s["eager"] / cpu_s[compiler]
    return out


def _cpu_min_interleaved(steps: dict[str, Callable[[], Any]], samples: int, calls: int) -> dict[str, float]:
    """The least CPU seconds of this thread per call of each step, samples of `calls` calls taken in
    turn. CPU time, not wall time: other processes on a shared machine add waits, not this thread's
    work (at one torch thread every compiler's kernels run on it)."""
    best = {name: float("inf") for name in steps}
    for _ in range(samples):
        for name, step in steps.items():
            start = time.thread_time()
            for _ in range(calls):
                step()
            best[name] = min(best[name], (time.thread_time() - start) / calls)
    return best


def python_tier_run(name: str, mode: str, scratch: str) -> dict:
    cache = tempfile.mkdtemp(prefix="kiln-python-tier-", dir=scratch)
    env = {**os.environ, "KILN_CACHE_DIR": cache, "KILN_NATIVE_WRAPPER_AFTER": "0"}
    env.pop("KILN_LOGS", None)
    flags = ["--held-out"] * _HELD_OUT + ["--cnn"] * _CNN + (["--threads", str(torch.get_num_threads())])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", *flags, "--child", name, mode, "python-tier"],
                          capture_output=True, text=True, env=env, timeout=1800)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def warm_start(name: str, mode: str, scratch: str) -> dict:
    """For each compiler: (cold first call, warm first call) in two processes sharing a cache."""
    out: dict[str, Any] = {}
    for compiler in COMPILERS:
        cache = tempfile.mkdtemp(prefix=f"{compiler}-", dir=scratch)
        cold = _child_run(name, mode, compiler, cache)
        warm = _child_run(name, mode, compiler, cache)
        out[compiler] = {"cold": cold, "warm": warm}
    return out


# ---------------------------------------------------------------------------------------------------
# Report


def _fmt(value: Any, spec: str) -> str:
    """`value` formatted by `spec` ("9.2f"), or a dash of the same width when it is missing."""
    width = int(spec.split(".")[0] or 0)
    return format(value, spec) if isinstance(value, (int, float)) else "-".rjust(width)


_COLUMNS = (
    "  (kiln, torch: steady speedups over eager, Kiln on its native tier; k early: Kiln's speedup over eager in its\n"
    "   calls 2.. before tier-up in this process, whose cache may hold the boundary extension already (native guards\n"
    "   and plans from the first call: not the Python tier); k py/t: Kiln's Python tier over torch.compile, both timed\n"
    "   in turn with eager in a fresh process with an empty Kiln cache and no tier-up (Python guards and wrappers),\n"
    "   least CPU time of the thread per call, speedup over speedup: 1.00 is torch.compile's speed; meant for\n"
    "   --threads 1, where every compiler's kernels run on the calling thread)")


def _python_tier_ratio(row: dict) -> float | None:
    """Kiln's Python-tier speedup over torch.compile's, from the same samples; None without one."""
    py = row.get("python_tier") or {}
    if "kiln_speedup" not in py or "torch_speedup" not in py or py.get("boundary_loaded"):
        return None
    return py["kiln_speedup"] / py["torch_speedup"]  # type: ignore[no-any-return]


def print_table(rows: list[dict]) -> dict:
    header = (f"{'model':<18}{'mode':<6}{'eager ms':>9}{'kiln':>9}{'torch':>9}{'k early':>9}{'k py/t':>8}"
              f"{'kiln 1st s':>11}{'torch 1st s':>12}{'kiln bg s':>10}{'kiln warm':>10}{'torch warm':>11}  notes")
    print(header)
    print(_COLUMNS)
    for r in rows:
        warm = r.get("warm", {})
        kw = warm.get("kiln", {}).get("warm", {}).get("first_call_s")
        tw = warm.get("torch", {}).get("warm", {}).get("first_call_s")
        notes = "; ".join(f"{c}: {e}" for c, e in r["errors"].items())
        if r.get("kiln_breaks"):
            notes = f"{r['kiln_breaks']} break(s) " + notes
        if warm.get("kiln", {}).get("warm", {}).get("frames"):
            notes += f" kiln warm captured {warm['kiln']['warm']['frames']} frame(s)"
        py = _python_tier_ratio(r)
        if r.get("python_tier", {}).get("error"):
            notes += f" python tier: {r['python_tier']['error']}"
        elif r.get("python_tier", {}).get("boundary_loaded"):
            notes += " python tier: the boundary extension loaded (not the Python tier)"
        print(f"{r['model']:<18}{r['mode']:<6}{_fmt(r.get('eager_ms'), '9.2f')}{_fmt(r.get('kiln_speedup'), '8.2f')}x"
              f"{_fmt(r.get('torch_speedup'), '8.2f')}x{_fmt(r.get('kiln_early_speedup'), '8.2f')}x{_fmt(py, '8.2f')}"
              f"{_fmt(r.get('kiln_first_s'), '11.2f')}"
              f"{_fmt(r.get('torch_first_s'), '12.2f')}{_fmt(r.get('kiln_tier_up_s'), '10.2f')}{_fmt(kw, '10.2f')}"
              f"{_fmt(tw, '11.2f')}  {notes}")
    summary: dict[str, Any] = {}
    for mode in ("infer", "train"):
        both = [r for r in rows if r["mode"] == mode and "kiln_speedup" in r and "torch_speedup" in r]
        if not both:
            continue
        summary[mode] = {"models": len(both),
                         "kiln_geomean": geomean([r["kiln_speedup"] for r in both]),
                         "torch_geomean": geomean([r["torch_speedup"] for r in both]),
                         "kiln_over_torch_geomean": geomean([r["kiln_speedup"] / r["torch_speedup"] for r in both]),
                         "kiln_early_over_torch_geomean": geomean(
                             [r["kiln_early_speedup"] / r["torch_speedup"] for r in both if "kiln_early_speedup" in r]),
                         # the same early single calls of both compilers, timed in turn (torch.compile has no tier-up,
                         # but a single call timed alone carries the timer's and the scheduler's overhead for both)
                         "kiln_early_over_torch_early_geomean": geomean(
                             [r["kiln_early_speedup"] / r["torch_early_speedup"] for r in both
                              if "kiln_early_speedup" in r and "torch_early_speedup" in r]),
                         "kiln_python_tier_over_torch_geomean": geomean(
                             [x for x in map(_python_tier_ratio, both) if x is not None]),
                         "kiln_over_torch_min": min((r["kiln_speedup"] / r["torch_speedup"], r["model"]) for r in both),
                         "kiln_first_s_geomean": geomean([r["kiln_first_s"] for r in both]),
                         "torch_first_s_geomean": geomean([r["torch_first_s"] for r in both])}
        pairs = [(r["warm"]["kiln"]["warm"].get("first_call_s"), r["warm"]["torch"]["warm"].get("first_call_s"))
                 for r in both if "warm" in r]
        pairs = [(k, t) for k, t in pairs if k and t]
        if pairs:
            summary[mode]["warm_ratio_geomean"] = geomean([k / t for k, t in pairs])
        s = summary[mode]
        line = (f"geomean {mode} over {s['models']} models (both compilers ran and matched eager): kiln "
                f"{s['kiln_geomean']:.2f}x, torch.compile {s['torch_geomean']:.2f}x; first call kiln "
                f"{s['kiln_first_s_geomean']:.2f} s, torch {s['torch_first_s_geomean']:.2f} s; kiln/torch "
                f"{s['kiln_over_torch_geomean']:.2f} (lowest {s['kiln_over_torch_min'][0]:.2f}, "
                f"{s['kiln_over_torch_min'][1]}), before tier-up {s['kiln_early_over_torch_geomean'] or 0:.2f} "
                f"(over torch.compile's own early calls {s['kiln_early_over_torch_early_geomean'] or 0:.2f})")
        if s["kiln_python_tier_over_torch_geomean"] is not None:
            line += f"; Python tier (cold cache, no tier-up) kiln/torch {s['kiln_python_tier_over_torch_geomean']:.2f}"
        if "warm_ratio_geomean" in s:
            line += f"; warm start kiln/torch {s['warm_ratio_geomean']:.3f}"
        print(line)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        try:
            run = python_tier if args.child[2] == "python-tier" else child
            print(json.dumps(run(*args.child[:2]) if run is python_tier else child(*args.child)))
        except Exception as exc:
            traceback.print_exc()
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:200]}))
        return 0
    rm = _corpus()
    names = args.only or (list(QUICK_MODELS) if args.quick and not (_HELD_OUT or _CNN) else list(_models()))
    opts = {"warmup": 1 if args.quick else 3, "samples": args.samples or (3 if args.quick else 9),
            "early_samples": 5 if args.quick else 15}
    warm = not args.no_warm and not args.quick
    print(f"Kiln bench-models: torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
          f"threads, {'held-out ' if _HELD_OUT else 'CNN ' if _CNN else ''}OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, {len(names)} models, modes "
          f"{','.join(args.modes)}{', quick' if args.quick else ''}", flush=True)
    scratch = tempfile.mkdtemp(prefix="kiln-bench-models-")
    # cold first calls in this process: caches start empty
    os.environ["KILN_CACHE_DIR"] = os.path.join(scratch, "kiln-main")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "torch-main")
    rows: list[dict] = []
    started = time.perf_counter()
    try:
        for name in names:
            for mode in args.modes:
                if _HELD_OUT and mode == "train" and name in INFER_ONLY:
                    continue
                print(f"  {name} {mode} ...", flush=True)
                try:
                    row = bench_model(name, mode == "train", opts)
                except Exception as exc:
                    row = {"model": name, "mode": mode, "errors": {"eager": f"{type(exc).__name__}: {exc}"[:200]}}
                if warm and mode == "infer" and not row["errors"]:
                    row["warm"] = warm_start(name, mode, scratch)
                if args.python_tier and not row["errors"]:
                    row["python_tier"] = python_tier_run(name, mode, scratch)
                rows.append(row)
                print("    " + json.dumps({k: v for k, v in row.items() if k != "warm"}, default=str), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    summary = print_table(rows)
    with open(args.json, "w") as f:
        json.dump({"threads": torch.get_num_threads(), "rows": rows, "summary": summary,
                   "wall_s": time.perf_counter() - started}, f, indent=2, default=str)
    print(f"\nresults written to {args.json} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
