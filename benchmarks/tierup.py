"""Speed before tier-up and the seconds until full speed, from a cold start:
`python -m benchmarks.tierup WORKLOAD [--quick] [--threads N]`, started by the runner in a fresh
process whose KILN_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR are empty folders.

Kiln runs a graph's Python wrapper first; a graph called kiln.config.native_wrapper_after times
(KILN_NATIVE_WRAPPER_AFTER, 100 by default) has its native C++ wrapper built on a background thread
(in an empty cache that first builds the precompiled header and the boundary extension) and runs it
from the next call after the build finished. A short job never gets past the first tier, so it is
measured here as a user's loop sees it:

- the Python tier: the median time of calls 2, 3, ... up to the one in which a graph asked for its
  native build (at most 100 calls), each followed by one eager step (timed, left out of the
  timeline), so that the ratio to eager is taken under the same load;
- full speed: the loop keeps calling the compiled step, and after each call reads every tiered
  wrapper's state (a step faster than CHECK_EVERY_S: once per that many seconds of steps;
  `TieredWrapper.after` is None once it settled, native or not; `calls` grows while
  an unsettled one runs) and Kiln's compile counters. Full speed is reached at the call after the
  last one in which something changed (a compile, a wrapper settling) or an unsettled wrapper ran,
  once nothing has for `steady` calls; its second on the timeline (from `import kiln`, with the
  probe's own time left out) is the number reported. Graphs that stopped being called (a version
  for a guard no longer met) do not hold it back;
- then the steady speeds of eager and Kiln (`alternate_medians`: single calls in turn, as in the
  Python tier); with --torch also torch.compile's first call and speed, in this same process
  (after Kiln, so its first call finds what Kiln imported already loaded: if anything this
  flatters torch.compile's first-call seconds). The runner passes --torch except under --quick
  (benchmarks.measure.measure_tierup).

Prints one JSON line with the numbers above; `with_ratios` adds the ratios the report prints (Kiln's
Python tier as a speedup over eager and as a ratio to torch.compile's speedup; full-speed seconds
over torch.compile's first-call seconds, where the target is 0.2 or less).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import weakref
from typing import Any, Callable, Mapping

import torch

from benchmarks.workload import Case, make_step

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_TIER_CALLS = 100  # "the first ~100 calls": Kiln's default native_wrapper_after
# a step faster than this is checked once per this many seconds of steps, not after every call: the
# check (kiln.stats() and each wrapper's state) costs tens of microseconds, a pointwise step a few
CHECK_EVERY_S = 0.002
# counters that grow on every call (a cache hit, an eager fallback) are not a change of state
_PER_CALL_COUNTERS = frozenset({"cache_hits", "fallbacks"})


class TierProbe:
    """The state of every tiered graph wrapper in this process (kiln.runtime.native.TieredWrapper),
    found by walking the garbage collector's objects again whenever Kiln compiled something, read
    directly in between. Kiln has no public counter for it (kiln.stats() counts compiles only)."""

    def __init__(self, wrapper_type: type, earlier: weakref.WeakSet | None = None) -> None:
        self.wrapper_type = wrapper_type
        self.earlier = earlier if earlier is not None else weakref.WeakSet()  # left out: made before
        self.wrappers: weakref.WeakSet = weakref.WeakSet()
        self.calls: dict[int, int] = {}  # id(wrapper) -> its call count at the last check
        self.compiles: dict[str, Any] = {}
        self.settled = self.native = 0
        self.hot = 0  # wrappers that asked for their native build (settled since, or building)
        self.building = 0  # wrappers whose native build runs now (on the background thread)
        self.scans = 0

    @staticmethod
    def existing(wrapper_type: type) -> weakref.WeakSet:
        """The wrappers alive now (made for earlier workloads of this process)."""
        return weakref.WeakSet(obj for obj in gc.get_objects() if type(obj) is wrapper_type)

    def _scan(self) -> None:
        self.scans += 1
        for obj in gc.get_objects():
            if type(obj) is self.wrapper_type and obj not in self.earlier:
                self.wrappers.add(obj)

    def check(self, stats: dict[str, Any]) -> tuple[bool, bool]:
        """(whether something changed since the last check: a compile, a wrapper settling; whether a
        wrapper that has not settled ran since the last check)."""
        compiles = {k: v for k, v in stats.items() if k not in _PER_CALL_COUNTERS}
        compiled = compiles != self.compiles
        if compiled:
            self.compiles = compiles
            self._scan()
        settled = native = hot = building = 0
        unsettled_ran = False
        for w in list(self.wrappers):
            if w.after is None:
                settled += 1
                native += w.current is not w.python
            else:
                unsettled_ran |= w.calls != self.calls.get(id(w))
                self.calls[id(w)] = w.calls
            hot += w.after is None or w.future is not None
            building += w.after is not None and w.future is not None
        changed = compiled or (settled, native) != (self.settled, self.native)
        self.settled, self.native, self.hot, self.building = settled, native, hot, building
        return changed, unsettled_ran

    def counts(self) -> dict[str, int]:
        tiered = len(self.wrappers)
        return {"tiered": tiered, "native": self.native, "python": self.settled - self.native,
                "unsettled": tiered - self.settled}


def _median_ms(seconds: list[float]) -> float | None:
    return statistics.median(seconds) * 1e3 if seconds else None


def kiln_timeline(case: Case, eager_step: Callable[[], object], steady: int, timeout_s: float) -> tuple[dict, Callable]:
    """Kiln from its import to full speed (module docstring); returns the result and Kiln's step."""
    start = time.perf_counter()
    left_out = 0.0  # seconds of eager steps and probe checks, not on the user's timeline
    import kiln  # timed: importing the compiler is part of a cold first call, as in benchmarks.startup
    from kiln.runtime import native

    fn = case.make_fn()
    begin = time.perf_counter()
    earlier = TierProbe.existing(native.TieredWrapper)  # another workload's, still alive: not this one's
    left_out += time.perf_counter() - begin
    step = make_step(case, kiln.compile(fn), fn)
    step()
    first_call_s = time.perf_counter() - start - left_out
    probe = TierProbe(native.TieredWrapper, earlier)
    begin = time.perf_counter()
    probe.check(kiln.stats())
    left_out += time.perf_counter() - begin
    # the tier before tier-up: calls 2 .. PYTHON_TIER_CALLS + 1, up to the one in which a graph's
    # native build started (it still ran on Python; from the next call on a build competes for the
    # CPU). A graph whose plan ran from its first call (kiln.config.native_plan, the boundary
    # extension built) builds nothing: the window then times the plans, what a short job runs.
    python_open = not probe.building
    starts, seconds, python_s, eager_s = [0.0, 0.0], [0.0, first_call_s], [], []  # indexed by call number
    last_change, first_native, call = 1, None, 1
    unchecked_s = 0.0  # step seconds since the last check: a fast step is checked once per CHECK_EVERY_S
    status = "ok"
    while True:
        call += 1
        begin = time.perf_counter()
        step()
        end = time.perf_counter()
        starts.append(begin - start - left_out)
        seconds.append(end - begin)
        unchecked_s += end - begin
        in_window = python_open and call <= PYTHON_TIER_CALLS + 1
        if in_window:
            python_s.append(end - begin)
            eager_begin = time.perf_counter()
            eager_step()
            eager_s.append(time.perf_counter() - eager_begin)
        if unchecked_s >= CHECK_EVERY_S or in_window:
            unchecked_s = 0.0
            changed, unsettled_ran = probe.check(kiln.stats())
            if changed or unsettled_ran:
                last_change = call
            if first_native is None and probe.native:
                first_native = call
            python_open = in_window and not probe.building
            if call - last_change >= steady and not python_open:
                break
        left_out += time.perf_counter() - end
        if starts[-1] > timeout_s:
            status = f"not at full speed after {timeout_s:.0f} s ({probe.counts()['unsettled']} graph(s) not settled)"
            break
    full_call = last_change + 1 if status == "ok" else None
    python_ms, eager_ms = _median_ms(python_s), _median_ms(eager_s)
    result = {
        "status": status,
        "first_call_s": first_call_s,
        "native_wrapper_after": kiln.config.native_wrapper_after,
        "python_calls": len(python_s),
        "python_ms": python_ms,
        "python_eager_ms": eager_ms,
        "python_speedup": eager_ms / python_ms if python_ms and eager_ms else None,
        "first_native_call": first_native,
        "full_speed_call": full_call,
        "full_speed_s": starts[full_call] if full_call is not None else None,
        "full_speed_ms": _median_ms(seconds[-steady:]) if full_call is not None else None,
        "calls": call,
        "wrappers": probe.counts(),
        "background_s": native.BACKGROUND.seconds,
        "probe_scans": probe.scans,
        "left_out_s": left_out,
        "stats": {k: v for k, v in kiln.stats().items() if not k.startswith("compile_time.")},
    }
    return result, step


def measure_tierup(workload: str, quick: bool, steady: int, timeout_s: float, with_torch: bool) -> dict:
    case = importlib.import_module(f"benchmarks.{workload}").build(quick)
    eager_fn = case.make_fn()
    eager_step = make_step(case, eager_fn, eager_fn)
    for _ in range(2):  # PyTorch's one-time costs (oneDNN, the allocator) are no compiler's
        eager_step()
    result, kiln_step = kiln_timeline(case, eager_step, steady, timeout_s)
    steps = {"eager": eager_step, "kiln": kiln_step}
    if with_torch:
        try:
            fn = case.make_fn()
            begin = time.perf_counter()
            torch_step = make_step(case, torch.compile(fn), fn)
            torch_step()
            result["torch_first_call_s"] = time.perf_counter() - begin
            steps["torch"] = torch_step
        except Exception as exc:
            result["torch_error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    result.update({f"{name}_ms": ms for name, ms in alternate_medians(steps, 30 if quick else 100).items()})
    return result


def alternate_medians(steps: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, float | None]:
    """Median milliseconds of single calls of each step, the steps called in turn `rounds` times:
    timed as the Python tier's calls are (one call at a time, eager beside it), so that its ratios
    and these compare like with like. On a busy machine a median of single calls leaves out the
    calls the scheduler preempted, which an average over calls back to back (benchmarks.timing)
    keeps: the two give different milliseconds there, not different ratios."""
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            begin = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - begin)
    return {name: _median_ms(values) for name, values in seconds.items()}


def with_ratios(result: dict, torch_speedup: float | None = None, torch_first_call_s: float | None = None) -> dict:
    """`result` with Kiln's Python tier against torch.compile (each as a speedup over eager timed
    beside it, so a change of load between the two measurements cancels out), Kiln's full speed
    over eager, and full-speed seconds over torch.compile's first-call seconds. torch.compile's
    speedup and first call come from the child when it measured them, else from the arguments (the
    runner's interleaved timing and its cold start in a fresh process)."""
    out = dict(result)
    eager, kiln_ms, torch_ms = out.get("eager_ms"), out.get("kiln_ms"), out.get("torch_ms")
    out["kiln_speedup"] = eager / kiln_ms if eager and kiln_ms else None
    out["torch_speedup"] = eager / torch_ms if eager and torch_ms else torch_speedup
    if out.get("torch_first_call_s") is None:
        out["torch_first_call_s"] = torch_first_call_s
    python, torch_x = out.get("python_speedup"), out["torch_speedup"]
    out["python_over_torch"] = python / torch_x if python and torch_x else None
    full, first = out.get("full_speed_s"), out["torch_first_call_s"]
    out["full_speed_over_torch_first"] = full / first if full is not None and first else None
    return out


def tierup_seconds(workload: str, quick: bool, threads: int, scratch: str, with_torch: bool,
                   seed_header: Callable[[str], None] | None = None) -> dict:
    """Run this module on `workload` in a fresh process with empty Kiln and Inductor caches under
    `scratch` (`seed_header(cache_dir)`, when given, puts the precompiled header in Kiln's first);
    its JSON result, or {"status": why not}."""
    kiln_cache = os.path.join(scratch, f"{workload}-tierup-kiln")
    torch_cache = os.path.join(scratch, f"{workload}-tierup-torch")
    os.makedirs(kiln_cache, exist_ok=True)
    if seed_header is not None:
        seed_header(kiln_cache)
    env = dict(os.environ, KILN_CACHE_DIR=kiln_cache, TORCHINDUCTOR_CACHE_DIR=torch_cache)
    limit = _timeout(quick) + (900 if with_torch else 300)  # the wait for full speed, then the rest
    cmd = [sys.executable, "-m", "benchmarks.tierup", workload, "--threads", str(threads)]
    cmd += (["--quick"] if quick else []) + (["--torch"] if with_torch else [])
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {limit:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"exit {proc.returncode}: {tail}"}


def _timeout(quick: bool) -> float:
    return 300.0 if quick else 900.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steady", type=int, default=None, help="calls without a change that mean full speed")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for full speed")
    parser.add_argument("--torch", action="store_true", help="also torch.compile's first call and speed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steady = args.steady or (20 if args.quick else 50)
    try:
        result = measure_tierup(args.workload, args.quick, steady, args.timeout or _timeout(args.quick), args.torch)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result = {"status": f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    result["threads"] = args.threads
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
