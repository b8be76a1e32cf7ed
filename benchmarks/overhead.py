"""Micro-benchmark: the tiny call, `x + 1` on 1,000 float32 elements, compiled by Kiln's default
backend against eager and torch.compile, and what each layer of Kiln's call path costs.

The layers, outermost first, each timed by calling it directly (a layer's cost is its time minus the
time of the layer it calls):
  frame entry   kiln.compile's closure: bind arguments to names, try the cache entries
  guards        the entry's check function over the bound locals
  glue          the generated function that feeds the graph and unpacks its outputs
  runtime       AotRuntime: lifted module tensors, mutated inputs, output aliasing (and the
                autograd.Function, only when an input requires grad: none here)
  wrapper       the generated Python wrapper (thread check, argument list, allocation, return)
  allocation    torch.empty_strided of the output
  kernel        one ctypes call of the C++ kernel, with its two data_ptr() calls
Times are CPU time of the calling thread (time.thread_time_ns; every step here runs on it alone,
1k elements being far below any parallel grain), so that other processes on a shared machine do not
count; each is the median of samples taken in turn. Differences of a few tenths of a microsecond are
within the noise. Target: Kiln's compiled call at most 5 us above eager. Also timed: the call under
mode="reduce-overhead", whose wrapper is one C++ function (kiln.runtime.native), and that wrapper alone.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

NAME = "overhead"
DESCRIPTION = "x + 1 on 1k float32: compiled call vs eager, per layer"


def add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _kiln_layers(x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """Each layer of Kiln's cached call of add_one(x), callable alone."""
    import kiln
    from kiln.capture.entry import frames_of

    # The layers of the Python wrapper: a graph of one kernel runs its plan from the first call by
    # default (timed by _native_layers), so plans are off while this one is compiled.
    saved, kiln.config.native_plan = kiln.config.native_plan, False
    try:
        compiled = kiln.compile(add_one)
        for _ in range(3):
            compiled(x)
    finally:
        kiln.config.native_plan = saved
    (entry,) = frames_of(compiled).entries
    L, G, F = {"x": x}, add_one.__globals__, add_one
    graph_names = [k for k in entry.glue.__globals__ if k.startswith("__graph")]  # type: ignore[attr-defined]
    (runtime,) = [entry.glue.__globals__[k] for k in graph_names]  # type: ignore[attr-defined]
    forward = runtime.forward
    wrapper = getattr(forward, "fn", forward)  # a CompiledGraph, or the wrapper rebuilt from disk
    generated = wrapper.steal
    env = generated.__globals__
    kernel = next(v for k, v in env.items() if k.startswith("kernel"))
    out = torch.empty(1000)  # the lambda below holds it: the kernel must never write to freed memory
    empty_strided, f32 = torch.empty_strided, torch.float32
    for name, got in (("compiled", compiled(x)), ("glue", entry.glue(L, G, F)), ("runtime", runtime(x)),
                      ("wrapper", wrapper(x))):
        got = got[0] if isinstance(got, tuple) else got
        torch.testing.assert_close(got, x + 1, msg=f"{name} returned another result")
    xg = x.clone().requires_grad_()
    for _ in range(3):
        compiled(xg)  # a second entry: the graph inside an autograd.Function
    torch.testing.assert_close(compiled(xg), xg + 1)
    return {
        "with grad": lambda: compiled(xg),
        "frame entry": lambda: compiled(x),
        "guards": lambda: entry.check_fn(L, G, F),
        "glue": lambda: entry.glue(L, G, F),
        "runtime": lambda: runtime(x),
        "wrapper": lambda: wrapper(x),
        "generated wrapper": lambda: generated([x]),
        "allocation": lambda: empty_strided((1000,), (1,), dtype=f32),
        "kernel": lambda: kernel(x.data_ptr(), out.data_ptr()),
    }


def _native_layers(x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """mode="reduce-overhead" on CPU: the compiled call and its native wrapper (one C++ call)."""
    import kiln
    from kiln.capture.entry import frames_of

    def add_one_again(x: torch.Tensor) -> torch.Tensor:  # its own code object: its own cache entries
        return x + 1

    compiled = kiln.compile(add_one_again, mode="reduce-overhead")
    for _ in range(3):
        compiled(x)
    (entry,) = frames_of(compiled).entries
    (runtime,) = [v for k, v in entry.glue.__globals__.items() if k.startswith("__graph")]  # type: ignore[attr-defined]
    wrapper = getattr(runtime.forward, "fn", runtime.forward)
    torch.testing.assert_close(compiled(x), x + 1)
    torch.testing.assert_close(wrapper(x)[0], x + 1)
    return {"reduce-overhead": lambda: compiled(x), "native wrapper": lambda: wrapper(x)}


def run(quick: bool) -> dict:
    x = torch.randn(1000)
    xg = x.clone().requires_grad_()
    steps: dict[str, Callable[[], Any]] = {"eager": lambda: add_one(x), "eager with grad": lambda: add_one(xg)}
    result: dict = {"threads": torch.get_num_threads()}
    try:
        steps.update(_kiln_layers(x))
        steps.update(_native_layers(x))
    except Exception as exc:
        result["kiln_status"] = f"failed: {type(exc).__name__}: {exc}"
    try:
        torch._dynamo.reset()
        compiled_torch = torch.compile(add_one)
        for _ in range(3):
            compiled_torch(x)
        steps["torch.compile"] = lambda: compiled_torch(x)
    except Exception as exc:
        result["torch_status"] = f"failed: {type(exc).__name__}: {exc}"
    result["us"] = thread_time_us(steps, samples=7 if quick else 21, number=2000 if quick else 10000)
    torch._dynamo.reset()
    return result


def thread_time_us(steps: dict[str, Callable[[], Any]], *, samples: int, number: int) -> dict[str, float]:
    """Median CPU microseconds of the calling thread per call of each step, samples taken in turn."""
    per_call: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(50):
            step()
    for _ in range(samples):
        for name, step in steps.items():
            start = time.thread_time_ns()
            for _ in range(number):
                step()
            per_call[name].append((time.thread_time_ns() - start) / number / 1e3)
    return {name: statistics.median(values) for name, values in per_call.items()}


# (layer, the time that includes it, the time of what it calls)
_BREAKDOWN = (
    ("frame entry (bind, entry loop)", "frame entry", "glue", "guards"),
    ("guards", "guards", None, None),
    ("glue", "glue", "runtime", None),
    ("runtime (AotRuntime, CompiledGraph)", "runtime", "wrapper", None),
    ("wrapper: call(*args) -> list", "wrapper", "generated wrapper", None),
    ("wrapper: generated body", "generated wrapper", "allocation", "kernel"),
    ("allocation (empty_strided)", "allocation", None, None),
    ("kernel (ctypes call)", "kernel", None, None),
)


def print_result(result: dict) -> None:
    us = result.get("us", {})
    print(f"eager x + 1 (1k float32): {us['eager']:.2f} us; torch threads {result['threads']}")
    for key in ("kiln_status", "torch_status"):
        if key in result:
            print(f"  {key.split('_')[0]}: {result[key]}")
    if "frame entry" in us:
        print(f"kiln compiled call:       {us['frame entry']:.2f} us  ({us['frame entry'] - us['eager']:+.2f} us "
              f"over eager; target at most +5)")
    if "torch.compile" in us:
        print(f"torch.compile call:       {us['torch.compile']:.2f} us  ({us['torch.compile'] - us['eager']:+.2f} us "
              f"over eager)")
    if "frame entry" not in us:
        return
    if "with grad" in us:
        print(f"with an input requiring grad: eager {us['eager with grad']:.2f} us, kiln {us['with grad']:.2f} us "
              f"(the autograd.Function and its graph node: {us['with grad'] - us['frame entry']:+.2f} us over "
              f"kiln's call without grad, which skips the Function)")
    if "reduce-overhead" in us:
        print(f"mode='reduce-overhead':   {us['reduce-overhead']:.2f} us  (native wrapper {us['native wrapper']:.2f} us, "
              f"the Python wrapper {us['wrapper']:.2f} us)")
    print("  kiln's layers (each: its time minus what it calls):")
    for label, outer, inner, also in _BREAKDOWN:
        cost = us[outer] - (us[inner] if inner else 0.0) - (us[also] if also else 0.0)
        print(f"    {label:<38}{cost:7.2f} us")
