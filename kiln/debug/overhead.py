"""How much a cached call of a compiled function costs on top of calling its graph directly.

`call_overhead()` compiles a function of two tensors with the "eager" backend, keeps the callable
the backend returned, and times both: the compiled function (bind arguments, check guards, run the
glue) and the backend's callable alone. The difference is the entry's cost per call, which Kiln
aims to keep under 10 µs (benchmarks/ report it beside the real torch.compile's).
benchmarks/ calls this; it is also runnable: `python -m kiln.debug.overhead`.
"""
from __future__ import annotations

import timeit
from typing import Any, Callable, Sequence

import torch


def _add_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y + x


def call_overhead(fn: Callable[..., Any] | None = None, inputs: Sequence[Any] | None = None, *,
                  number: int = 20000, repeat: int = 7) -> dict[str, float]:
    """Time a cached call of `kiln.compile(fn, backend=...)` against its graph's callable, in µs.

    Returns `{"compiled_us", "graph_us", "overhead_us", "eager_us", "graphs"}`; each time is the
    best of `repeat` runs of `number` calls (the minimum is the least disturbed by other load).
    `fn` must compile to exactly one graph whose inputs are `inputs` in order (the default does).
    """
    from kiln import api  # the package imports this module only on demand

    fn = fn or _add_mul
    inputs = list(inputs) if inputs is not None else [torch.randn(16), torch.randn(16)]
    callables: list[Callable[..., Any]] = []

    def keep_callable(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        callables.append(gm.forward)
        return gm.forward

    compiled = api.compile(fn, backend=keep_callable)
    compiled(*inputs)
    compiled(*inputs)
    if len(callables) != 1:
        raise ValueError(f"call_overhead needs a function that compiles to one graph, got {len(callables)}")
    graph = callables[0]

    def best(call: Callable[[], Any]) -> float:
        return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6

    compiled_us = best(lambda: compiled(*inputs))
    graph_us = best(lambda: graph(*inputs))
    eager_us = best(lambda: fn(*inputs))
    return {"compiled_us": compiled_us, "graph_us": graph_us, "overhead_us": compiled_us - graph_us,
            "eager_us": eager_us, "graphs": float(len(callables))}


def guard_check_time(n_tensors: int = 2, *, number: int = 50000, repeat: int = 7) -> float:
    """The generated check function alone for `n_tensors` tensor arguments plus grad mode, in µs."""
    from kiln.capture.guards import Guard, compile_guards, tensor_guard

    L = {f"x{i}": torch.randn(8, 4) for i in range(n_tensors)}
    guards = [Guard("", "check_grad_mode", torch.is_grad_enabled())]
    guards += [tensor_guard(f"L['x{i}']", t) for i, t in enumerate(L.values())]
    check = compile_guards(guards).fn
    return min(timeit.repeat(lambda: check(L, {}, None), number=number, repeat=repeat)) / number * 1e6


if __name__ == "__main__":
    print(f"guard check, 2 tensors: {guard_check_time():.2f} us")
    result = call_overhead()
    print(", ".join(f"{k}={v:.2f}" for k, v in result.items()))
