"""Where a call of Kiln's Python tier goes: its guard checks timed alone, per real model.

The Python tier is what runs before tier-up: the boundary extension is not built yet (a cold cache),
so guards are the generated Python check functions and graphs run their Python wrappers. This
script gives Kiln an empty cache and never tiers up (native_wrapper_after=0), so the extension is
neither built nor found; it checks that it stayed unloaded.

For each model and mode it records the (L, G, F) of every guard check one step makes, then times
those checks alone (CPU time of this thread, the minimum of several rounds: other processes on the
machine add wall time, not this thread's CPU time), beside the whole step timed the same way, and
counts the guards by kind. "all us" and "step all": the same checks generated as before this
module's savings (nothing left out by kiln.capture.guards.static, the conjugate bit of real tensors
checked), and the whole step calling those, each timed in turn with the checks as they are ("guard
us", "step us").

    OMP_NUM_THREADS=1 python -m benchmarks.guard_cost --only mistral,bert,gpt2 [--modes infer,train]
"""
from __future__ import annotations

import os
import tempfile

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-guard-cost-")  # before kiln reads its config
os.environ["KILN_NATIVE_WRAPPER_AFTER"] = "0"  # no tier-up: nothing builds the boundary extension

import argparse  # noqa: E402
import collections
import sys
import time
from typing import Any, Callable

import torch


def _cpu_min(fn: Callable[[], Any], rounds: int, inner: int) -> float:
    """The least CPU seconds of this thread per call of `fn`, over `rounds` rounds of `inner` calls."""
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.thread_time() - start) / inner)
    return best


def _record_checks() -> tuple[list, Callable[[], None]]:
    """Wrap every cache entry's check function to record the arguments of each call; and the undo."""
    from kiln.capture import entry as entry_mod

    calls: list[tuple[Any, tuple]] = []
    undo = []
    for cache in entry_mod._CACHES.values():
        for ce in cache.entries:
            original = ce.check_fn

            def recorder(L: Any, G: Any, F: Any, _fn: Any = original, _ce: Any = ce) -> bool:
                calls.append((_ce, (L, G, F)))
                return _fn(L, G, F)  # type: ignore[no-any-return]
            object.__setattr__(ce, "check_fn", recorder)
            undo.append((ce, original))

    def restore() -> None:
        for ce, original in undo:
            object.__setattr__(ce, "check_fn", original)
    return calls, restore


def measure(name: str, training: bool, rounds: int) -> dict:
    import kiln
    from benchmarks.models import _corpus, _models, _step
    from kiln.runtime import boundary

    rm = _corpus()
    entry = _models()[name]
    kiln.reset()
    model = entry.build()
    step = _step(rm, entry, model, kiln.compile(model), training)
    for _ in range(3):
        step()
    calls, restore = _record_checks()
    step()
    restore()
    fns = [(ce.check_fn, args) for ce, args in calls]
    passed = [fn(*args) for fn, args in fns]

    def guards() -> None:
        for fn, args in fns:
            fn(*args)

    # the same checks generated without leaving out the guards others fix (kiln.capture.guards.static),
    # timed in turn with them: the saving in one run
    from kiln.capture.guards import compile as guard_compile, static

    from kiln.capture.guards import native as guard_native
    from kiln.capture.guards.kinds import Check

    def with_conj(spec: Any, name: str, em: Any) -> list:
        # the conjugate bit checked on real tensors too, as before it was left out
        return [Check("{v}.is_conj() is False and " + c.code, c.why) if c.code.startswith("{v}.is_neg()") else c
                for c in tensor_checks(spec, name, em)]

    keep = static.fixed_guards, static.repeated_functions
    tensor_checks = guard_native._tensor_checks
    static.fixed_guards = static.repeated_functions = lambda *args: set()  # type: ignore[assignment]
    guard_native._tensor_checks = with_conj  # type: ignore[assignment]
    try:
        whole = [(guard_compile.compile_guards(ce.check.guards, native=None).fn, args) for ce, args in calls]
    finally:
        static.fixed_guards, static.repeated_functions = keep
        guard_native._tensor_checks = tensor_checks
    assert [fn(*args) for fn, args in whole] == passed

    def guards_whole() -> None:
        for fn, args in whole:
            fn(*args)

    guard_s, whole_s = float("inf"), float("inf")
    for _ in range(rounds):  # in turn: a burst of load hits both
        guard_s = min(guard_s, _cpu_min(guards, 1, 20))
        whole_s = min(whole_s, _cpu_min(guards_whole, 1, 20))
    # the whole step on each variant of the checks, in turn
    swap = [(ce, ce.check_fn, fn) for (ce, _), (fn, _) in zip(calls, whole)]
    step_s, step_whole_s = float("inf"), float("inf")
    for _ in range(rounds):
        step_s = min(step_s, _cpu_min(step, 1, 3))
        for ce, _, fn in swap:
            object.__setattr__(ce, "check_fn", fn)
        try:
            step_whole_s = min(step_whole_s, _cpu_min(step, 1, 3))
        finally:
            for ce, fn, _ in swap:
                object.__setattr__(ce, "check_fn", fn)
    kinds: collections.Counter = collections.Counter()
    for ce, _ in calls:
        kinds.update(g.kind for g in ce.check.guards)
    return {"model": name, "mode": "train" if training else "infer", "checks": len(fns),
            "failed_then_passed": passed.count(False), "guards": sum(kinds.values()),
            "guard_us": guard_s * 1e6, "whole_us": whole_s * 1e6,
            "left_out": sum(len((static.recorded(ce.check.source) or [()])[0]) for ce, _ in calls),
            "step_us": step_s * 1e6, "step_whole_us": step_whole_s * 1e6, "boundary_loaded": bool(boundary._loaded),
            "kinds": dict(kinds.most_common(8))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="mistral,bert,gpt2")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"guard cost, Python tier (no boundary extension), CPU time of this thread, min of {args.rounds} rounds")
    print(f"{'model':<10}{'mode':<6}{'checks':>7}{'guards':>7}{'left out':>9}{'all us':>8}{'guard us':>10}"
          f"{'step all':>10}{'step us':>10}{'share':>7}  kinds")
    for name in args.only.split(","):
        for mode in args.modes.split(","):
            r = measure(name, mode == "train", args.rounds)
            assert not r["boundary_loaded"], "the boundary extension loaded: not the Python tier"
            print(f"{name:<10}{mode:<6}{r['checks']:>7}{r['guards']:>7}{r['left_out']:>9}{r['whole_us']:>8.1f}"
                  f"{r['guard_us']:>10.1f}{r['step_whole_us']:>10.1f}{r['step_us']:>10.1f}"
                  f"{r['guard_us'] / r['step_us']:>7.1%}  {r['kinds']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
