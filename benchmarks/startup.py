"""Compile-time measurement in a fresh process: `python -m benchmarks.startup WORKLOAD COMPILER`.

The runner starts this twice per workload and compiler with the same cache directory in the
environment (KILN_CACHE_DIR or TORCHINDUCTOR_CACHE_DIR): the first run starts from an empty
directory (a cold start: nothing in memory, nothing on disk), the second finds what the first left
there (a warm start, what a user sees when re-running a script). Timed: importing the compiler's
package, wrapping the workload and its first step (forward, and backward for training workloads),
after one eager step has paid PyTorch's own one-time costs. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback

import torch

from benchmarks.workload import make_step


def first_step_seconds(workload: str, compiler: str, quick: bool) -> dict:
    module = importlib.import_module(f"benchmarks.{workload}")
    case = module.build(quick)
    fn = case.make_fn()
    make_step(case, fn, fn)()  # PyTorch's one-time costs (oneDNN, allocator) are not the compiler's
    start = time.perf_counter()
    if compiler == "kiln":
        import kiln

        compiled = kiln.compile(fn)
    else:
        compiled = torch.compile(fn)
    make_step(case, compiled, fn)()
    result: dict = {"first_call_s": time.perf_counter() - start}
    if compiler == "kiln":
        result["stats"] = dict(kiln.stats())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("compiler", choices=["kiln", "torch"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = first_step_seconds(args.workload, args.compiler, args.quick)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        message = str(exc).splitlines()[0] if str(exc) else ""
        result = {"error": f"{type(exc).__name__}: {message}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
