"""`make bench`: every workload under eager, Kiln (default backend) and the real torch.compile, in one
run, with speedups, cold and warm compile times, bandwidth of the memory-bound workloads, the
guard-overhead micro-benchmark, a geomean row, and everything written to bench_results.json.

    python -m benchmarks.run                    # the full suite (several minutes on 2 cores)
    python -m benchmarks.run --quick            # small sizes, few samples
    python -m benchmarks.run --only softmax     # one workload (repeat or comma-separate for more)
    python -m benchmarks.run --no-startup       # skip the cold/warm subprocess measurements
    python -m benchmarks.run --no-tierup        # skip the before-tier-up / seconds-to-full-speed processes
    python -m benchmarks.run --only ddp         # the 2-process DDP training step (benchmarks/ddp.py)
    python -m benchmarks.run --threads all      # one pass at torch's default thread count (default: 1,all)

The workloads run once per thread count of --threads (torch.set_num_threads, which Kiln's kernels
follow as ATen's do); each speed and memory table says its thread count. Cold and warm starts (fresh
processes, default threads) are measured in the first pass only, and so is the tier-up table (a
fresh process per workload with empty caches, at the first pass's thread count): Kiln's speed over
its first ~100 calls, on its Python wrappers, and the seconds until its native wrappers run, beside
torch.compile's first call (benchmarks.tierup). --quick leaves adam_step and sgd_step out unless
--only names them (adamw_step runs the same code), and measures tier-up only for QUICK_TIERUP
unless --only names workloads (each such process takes tens of seconds).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import torch

from benchmarks import ddp, guard_overhead, overhead, report
from benchmarks.compilers import kiln_capture_status, kiln_status
from benchmarks.measure import bench_workload
from benchmarks.timing import copy_bandwidth_gbs

WORKLOADS = (
    "pointwise_chain",
    "layernorm_gelu",
    "softmax",
    "softmax_vocab",
    "attention_softmax",
    "mlp_inference",
    "mlp_training",
    "gpt_block_forward",
    "gpt_block_training",
    "varying_batch",
    "gpt_training", "resnet18_inference", "resnet18_training", "bert_encoder_inference",
    "graph_break",
    "adamw_step", "adam_step", "sgd_step", "checkpoint_training", "efficientnet_training",
)
QUICK_SKIPPED = ("adam_step", "sgd_step")  # --quick: the compiled-optimizer workload is adamw_step
# --quick without --only: the tier-up table for a plain training step and the three training kinds
QUICK_TIERUP = ("mlp_training", "adamw_step", "checkpoint_training", "efficientnet_training")
ALL_NAMES = WORKLOADS + (guard_overhead.NAME, overhead.NAME, ddp.NAME)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few samples")
    parser.add_argument("--only", action="append", default=[], help=f"workload name(s), of: {', '.join(ALL_NAMES)}")
    parser.add_argument("--no-startup", action="store_true", help="skip cold/warm compile-time subprocesses")
    parser.add_argument("--no-tierup", action="store_true", help="skip the before-tier-up subprocesses")
    parser.add_argument("--json", default="bench_results.json", help="where to write the results")
    parser.add_argument("--threads", default="1,all", help="thread counts, comma-separated ('all': torch's default)")
    args = parser.parse_args(argv)
    try:
        args.threads = [torch.get_num_threads() if t == "all" else int(t) for t in args.threads.split(",") if t]
    except ValueError:
        parser.error("--threads takes positive integers or 'all', comma-separated")
    if not args.threads or min(args.threads) < 1:
        parser.error("--threads takes positive integers or 'all', comma-separated")
    args.threads = list(dict.fromkeys(args.threads))
    args.only = [name for item in args.only for name in item.split(",") if name]
    unknown = sorted(set(args.only) - set(ALL_NAMES))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(ALL_NAMES)}")
    return args


def selected_workloads(args: argparse.Namespace) -> list[str]:
    """What --only names, else every workload (under --quick, less QUICK_SKIPPED)."""
    return args.only or [n for n in ALL_NAMES if not (args.quick and n in QUICK_SKIPPED)]


def tierup_workloads(args: argparse.Namespace) -> list[str]:
    """The workloads whose tier-up is measured: none under --no-tierup, QUICK_TIERUP under --quick
    without --only, else every selected one."""
    if args.no_tierup:
        return []
    if args.quick and not args.only:
        return list(QUICK_TIERUP)
    return selected_workloads(args)


def machine_info() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = selected_workloads(args)
    tierup = tierup_workloads(args)
    opts = {"quick": args.quick, "startup": not args.no_startup, "tierup": tierup,
            "warmup": 2 if args.quick else 5, "samples": 5 if args.quick else 21}
    info = machine_info()
    print(f"Kiln bench: torch {info['torch']}, {info['cpu_count']} CPUs, {info['torch_threads']} torch threads"
          f"{', quick' if args.quick else ''}")
    unavailable = kiln_status()
    if unavailable:
        print(f"kiln (default backend): not available: {unavailable}")
    copy_mib = 64 if args.quick else 256
    copy_gbs = copy_bandwidth_gbs(copy_mib << 20)
    scratch = tempfile.mkdtemp(prefix="kiln-bench-")
    rows: list[dict] = []
    errors: dict[str, str] = {}
    passes: dict[int, list[dict]] = {}  # thread count -> that pass's rows
    started = time.perf_counter()
    default_threads = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            print(f"  -- {threads} thread(s)", flush=True)
            first_pass = not passes
            pass_opts = dict(opts, startup=opts["startup"] and first_pass, threads=threads)
            rows = passes[threads] = []
            for name in WORKLOADS:
                if name not in selected:
                    continue
                print(f"  {name} ...", flush=True)
                try:
                    module = importlib.import_module(f"benchmarks.{name}")
                    row = bench_workload(module, dict(pass_opts, tierup=first_pass and name in tierup), unavailable, scratch)
                    rows.append(dict(row, threads=threads))
                except Exception as exc:  # a broken workload is reported; the others still run
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    print(f"  {name} failed in eager or setup: {errors[name]}", flush=True)
        torch.set_num_threads(default_threads)
        guard = None
        if guard_overhead.NAME in selected:
            print(f"  {guard_overhead.NAME} ...", flush=True)
            # backend="eager": this needs Kiln's capture only, not its lowering
            guard = guard_overhead.run(args.quick, kiln_capture_status())
        tiny = None
        if overhead.NAME in selected and not unavailable:
            print(f"  {overhead.NAME} ...", flush=True)
            tiny = overhead.run(args.quick)
        ddp_rows = None
        if ddp.NAME in selected and not unavailable:
            print(f"  {ddp.NAME} ...", flush=True)
            try:
                ddp_rows = ddp.run(args.quick)  # its own 2-process table, printed as it finishes
            except Exception as exc:
                errors[ddp.NAME] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    totals = report.summary(rows)
    first = passes.get(args.threads[0], [])
    for threads, pass_rows in passes.items():
        if not pass_rows:
            continue
        print(f"\n== speed at {threads} thread(s) (one process, median of repeated runs) ==")
        report.print_speed_table(pass_rows, report.summary(pass_rows))
        print(f"\n== peak memory per step at {threads} thread(s) ==")
        report.print_memory_table(pass_rows)
    if first:
        print(f"\n== compile time (cold and warm start, fresh processes at {default_threads} threads) ==")
        report.print_compile_table(first, report.summary(first))
        print_warm_ratios(first)
        if any("tierup" in r for r in first):
            print(f"\n== before tier-up and time to full speed (fresh process, empty caches, {args.threads[0]} thread(s)) ==")
            report.print_tierup_table(first, report.summary(first))
    if rows:
        print(f"\n== memory bandwidth of the memory-bound workloads at {args.threads[-1]} thread(s) ==")
        report.print_bandwidth_table(rows, copy_gbs, copy_mib)
    if guard is not None:
        print("\n== guard overhead (backend='eager') ==")
        report.print_guard_overhead(guard)
    if tiny is not None:
        print("\n== tiny-call overhead (x + 1 on 1k float32, thread CPU time) ==")
        overhead.print_result(tiny)
    if unavailable:
        print(f"\nkiln (default backend): not available: {unavailable}")
    report.print_notes(rows, unavailable)
    for name, error in errors.items():
        print(f"{name}: not measured: {error}")
    info["load_after"] = os.getloadavg()[0]
    if max(info["load_before"], info["load_after"]) > 1.5:
        print(f"\nwarning: the machine was busy (1-minute load {info['load_before']:.1f} before, "
              f"{info['load_after']:.1f} after, on {info['cpu_count']} CPUs): timings are noisy")
    results = {"machine": dict(info, copy_bandwidth_gbs=copy_gbs), "options": opts,
               "tierup": {r["name"]: r["tierup"] for r in first if "tierup" in r},  # also in by_threads' first pass
               "tierup_summary": report.tierup_summary(first), "kiln_unavailable": unavailable,
               "workloads": rows, "errors": errors, "summary": totals, "threads": args.threads,
               "by_threads": {str(t): {"workloads": r, "summary": report.summary(r)} for t, r in passes.items()}, "guard_overhead": guard, "overhead": tiny,
               "ddp": ddp_rows,
               "wall_s": time.perf_counter() - started}
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nresults written to {args.json} ({time.perf_counter() - started:.0f} s)")
    return 0


def print_warm_ratios(rows: list[dict]) -> None:
    """Kiln's warm start over torch.compile's, per workload (the target is at most 0.1)."""
    ratios = []
    for r in rows:
        k, t = r.get("kiln", {}).get("warm_s"), r.get("torch", {}).get("warm_s")
        if k and t:
            ratios.append(f"{r['name']} {k / t:.3f}")
    if ratios:
        print("  warm start kiln/torch: " + ", ".join(ratios))


if __name__ == "__main__":
    sys.exit(main())
