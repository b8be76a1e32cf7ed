"""`make bench`: every workload under eager, Kiln (default backend) and the real torch.compile, in one
run, with speedups, cold and warm compile times, bandwidth of the memory-bound workloads, the
guard-overhead micro-benchmark, a geomean row, and everything written to bench_results.json.

    python -m benchmarks.run                    # the full suite (several minutes on 2 cores)
    python -m benchmarks.run --quick            # small sizes, few samples
    python -m benchmarks.run --only softmax     # one workload (repeat or comma-separate for more)
    python -m benchmarks.run --no-startup       # skip the cold/warm subprocess measurements
    python -m benchmarks.run --only ddp         # the 2-process DDP training step (benchmarks/ddp.py)
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
    "mlp_inference",
    "mlp_training",
    "gpt_block_forward",
    "gpt_block_training",
    "varying_batch",
    "gpt_training", "resnet18_inference", "resnet18_training", "bert_encoder_inference",
)
ALL_NAMES = WORKLOADS + (guard_overhead.NAME, overhead.NAME, ddp.NAME)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few samples")
    parser.add_argument("--only", action="append", default=[], help=f"workload name(s), of: {', '.join(ALL_NAMES)}")
    parser.add_argument("--no-startup", action="store_true", help="skip cold/warm compile-time subprocesses")
    parser.add_argument("--json", default="bench_results.json", help="where to write the results")
    args = parser.parse_args(argv)
    args.only = [name for item in args.only for name in item.split(",") if name]
    unknown = sorted(set(args.only) - set(ALL_NAMES))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(ALL_NAMES)}")
    return args


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
    selected = args.only or list(ALL_NAMES)
    opts = {"quick": args.quick, "startup": not args.no_startup, "warmup": 2 if args.quick else 5,
            "samples": 5 if args.quick else 21}
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
    started = time.perf_counter()
    try:
        for name in WORKLOADS:
            if name not in selected:
                continue
            print(f"  {name} ...", flush=True)
            try:
                rows.append(bench_workload(importlib.import_module(f"benchmarks.{name}"), opts, unavailable, scratch))
            except Exception as exc:  # a broken workload is reported; the others still run
                errors[name] = f"{type(exc).__name__}: {exc}"
                print(f"  {name} failed in eager or setup: {errors[name]}", flush=True)
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
    if rows:
        print("\n== speed (one process, median of repeated runs) ==")
        report.print_speed_table(rows, totals)
        print("\n== compile time ==")
        report.print_compile_table(rows, totals)
        print("\n== memory bandwidth of the memory-bound workloads ==")
        report.print_bandwidth_table(rows, copy_gbs, copy_mib)
        print("\n== peak memory per step ==")
        report.print_memory_table(rows)
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
    results = {"machine": dict(info, copy_bandwidth_gbs=copy_gbs), "options": opts, "kiln_unavailable": unavailable,
               "workloads": rows, "errors": errors, "summary": totals, "guard_overhead": guard, "overhead": tiny,
               "ddp": ddp_rows,
               "wall_s": time.perf_counter() - started}
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nresults written to {args.json} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
