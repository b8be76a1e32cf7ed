"""Compare one program eager against kiln.compile: what it returned or raised, what it left in its
arguments (values, shapes, strides, offsets, requires_grad), which tensors alias which (the same
object, the same storage, the same data pointer) among outputs and arguments, and the grads a
backward through its outputs leaves on its leaf arguments (or the error that backward raises).

Used by test_dynrepros_programs.py over the programs of dynrepros_programs.py. `snapshot` turns one
run into plain data, so the two runs compare with `==` after the tensors' values are compared with
a tolerance.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

import kiln


def _tensors(value: Any, out: list) -> None:
    """Every tensor in value (nested lists, tuples, dicts, a module's parameters and buffers, an
    object's __dict__ one level down), in a fixed order."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            _tensors(value[k], out)
    elif isinstance(value, torch.nn.Module):
        for _, p in sorted(value.named_parameters(), key=lambda kv: kv[0]):
            out.append(p)
        for _, b in sorted(value.named_buffers(), key=lambda kv: kv[0]):
            out.append(b)
    elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value):
        for k in sorted(vars(value)):
            v = vars(value)[k]
            if isinstance(v, (torch.Tensor, list, tuple, dict)):
                _tensors(v, out)


def _structure(value: Any) -> Any:
    """The value with tensors replaced by a marker: containers, Python scalars and None kept."""
    if isinstance(value, torch.Tensor):
        return "T"
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_structure(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((str(k), _structure(value[k])) for k in sorted(value, key=str)))
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, (int, float, bool, str, type(None), complex)):
        return value
    return type(value).__name__


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, tuple(t.stride()) if t.numel() else None, t.storage_offset(), t.requires_grad,
            t.is_leaf, t.grad_fn is None, "inference" if t.is_inference() else t._version, t._is_view())


def _aliasing(ts: list[torch.Tensor]) -> tuple:
    """For each tensor, the first index holding the same object, the same storage, the same data
    pointer: the relationships among outputs and arguments, independent of addresses."""
    objs: dict[int, int] = {}
    stores: dict[int, int] = {}
    ptrs: dict[tuple, int] = {}
    rel = []
    for i, t in enumerate(ts):
        if t.numel() == 0:  # empty tensors' pointers say nothing
            rel.append((objs.setdefault(id(t), i), -1, -1))
            continue
        sp = t.untyped_storage().data_ptr()
        base = t._base
        rel.append((objs.setdefault(id(t), i), stores.setdefault(sp, i), ptrs.setdefault((sp, t.data_ptr()), i),
                    None if base is None else next((j for j, u in enumerate(ts) if u is base), "other")))
    return tuple(rel)


def _values(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in ts]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
    return torch.equal(a, b)


def snapshot(fn: Callable[..., Any], args: tuple, backward: bool = True, output_versions: bool = True) -> dict:
    """Run fn(*args) and describe everything a user could observe afterwards (the outputs' version
    counters left out where not `output_versions`)."""
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared with the other run's
        return {"raised": type(exc).__name__, "text": str(exc)[:200], "args": _arg_state(args)}
    out_ts: list = []
    _tensors(result, out_ts)
    arg_ts: list = []
    _tensors(args, arg_ts)
    snap: dict[str, Any] = {
        "structure": _structure(result),
        "out_meta": [_meta(t) if output_versions else _meta(t)[:7] + _meta(t)[8:] for t in out_ts],
        "out_values": _values(out_ts),
        "aliasing": _aliasing(out_ts + arg_ts),
        "args": _arg_state(args),
    }
    if backward:
        snap["grads"] = _backward(out_ts, arg_ts)
    return snap


def _arg_state(args: tuple) -> tuple:
    ts: list = []
    _tensors(args, ts)
    return ([_meta(t) for t in ts], _values(ts), _structure(args))


def _backward(out_ts: list[torch.Tensor], arg_ts: list[torch.Tensor]) -> Any:
    """Backward through the sum of every differentiable output (each weighted by its position, so
    a swap of two outputs shows), then the .grad of each argument tensor; or the error's type."""
    diff = [t for t in out_ts if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)]
    if not diff:
        return None
    loss = sum((t.real if t.is_complex() else t).sum() * (i + 1) for i, t in enumerate(diff))
    try:
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - compared
        return ("raised", type(exc).__name__)
    return [None if t.grad is None else t.grad.detach().clone() for t in arg_ts]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and _close(got, want)
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return bool(got == want)


def differences(got: dict, want: dict) -> list[str]:
    """What differs between two snapshots, by key (empty when they agree)."""
    if ("raised" in got) != ("raised" in want):
        return [f"outcome: compiled {got.get('raised', 'returned')} {got.get('text', '')!r}, "
                f"eager {want.get('raised', 'returned')} {want.get('text', '')!r}"]
    keys = ("raised", "args") if "raised" in want else ("structure", "out_meta", "out_values", "aliasing", "args", "grads")
    return [f"{k}: compiled {got.get(k)!r}\n   eager {want.get(k)!r}" for k in keys if not _same(got.get(k), want.get(k))]


def compare(fn: Callable[..., Any], make: Callable[[], tuple], *, backend: str, dynamic: bool | None = None,
            calls: int = 1, backward: bool = True, reset: Callable[[], None] | None = None) -> tuple[list[str], int, int]:
    """Each of `calls` calls eager and compiled on fresh arguments (seeded alike); the differences
    found, Kiln's graph count and its fallback count."""
    def run(f: Callable[..., Any]) -> list[dict]:
        if reset is not None:
            reset()
        snaps = []
        for i in range(calls):
            torch.manual_seed(i)
            # the inductor's matmuls write their results with out= (a version counter of 1 where
            # eager's is 0): a fresh output's counter is not compared there
            snaps.append(snapshot(f, make(), backward, output_versions=backend != "inductor"))
        return snaps

    want = run(fn)
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter, dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fallback's warning: the count is reported instead
        got = run(compiled)
    diffs = [f"call {i}: {d}" for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w)]
    return diffs, counter.frame_count, int(kiln.stats()["fallbacks"])
