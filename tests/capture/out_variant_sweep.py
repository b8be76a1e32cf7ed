"""OpInfo ops called with `out=` inside a compiled function, on every backend, against eager.

For each op with an out= form (`opinfo.supports_out`), its first CPU float32 samples are called
with out= tensors of the shape eager's result has, then with empty out= tensors (eager resizes
them; capture breaks there, since a graph cannot resize its inputs), all in one function
compiled with kiln.compile on backend "eager", "aot_eager" and "inductor". The out tensors'
contents, the returned values, and `returned is out` must equal eager's, eager's exceptions
must be raised, and no frame may fall back (kiln.stats()["fallbacks"], no KilnWarning).
Shared by tests/capture/test_out_variants.py (a CI slice and the full sweep, @slow) and
`python tests/capture/out_variant_sweep.py [names...]`, which prints the pass count.
"""
from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

import kiln
from kiln.log import KilnWarning

def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds in tests


BACKENDS = ("eager", "aot_eager", "inductor")
MAX_SAMPLES = 3
TOLERANCE = dict(atol=1e-4, rtol=1e-4, equal_nan=True)
# Results that are random or uninitialized, whatever computes them.
_SKIP = {"bernoulli", "normal", "multinomial", "randn", "empty", "torch._scaled_mm", "torch._scaled_mm_v2",
         "sparse.sampled_addmm", "hash_tensor"}


@functools.lru_cache(maxsize=None)
def out_ops() -> dict[str, Any]:
    """Every OpInfo entry that has an out= form, by name (variant names joined with a dot)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {(f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name): o
            for o in op_db if o.supports_out}


def _samples(opinfo: Any) -> list[tuple[Any, tuple, dict]]:
    torch.manual_seed(0)
    found = []
    for s in opinfo.sample_inputs("cpu", torch.float32):
        found.append((s.input, tuple(s.args), dict(s.kwargs)))
        if len(found) >= MAX_SAMPLES:
            break
    return found


def _out_like(result: Any, empty: bool) -> Any:
    """Out tensors for `result`: same shape filled with a marker value, or empty (to be resized)."""
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if empty:
            return torch.empty(0, dtype=t.dtype)
        return torch.full_like(t, 7) if t.dtype != torch.bool else torch.zeros_like(t)
    if isinstance(result, (tuple, list)):
        return tuple(one(t) for t in result)
    return one(result)


def build_program(opinfo: Any) -> tuple[Callable[..., Any], Callable[[], list[Any]]] | None:
    """A function `f(*inputs, *outs)` calling the op with out= on every sample, and a maker of
    fresh arguments for it (each run gets its own out tensors). None when no sample runs eagerly."""
    calls = []
    for inp, args, kwargs in _samples(opinfo):
        try:
            result = opinfo.op(inp, *args, **kwargs)
        except Exception:
            continue
        if isinstance(result, torch.Tensor) or (isinstance(result, (tuple, list)) and result
                                                 and all(isinstance(t, torch.Tensor) for t in result)):
            for empty in (False, True):
                calls.append(((inp, args, kwargs), result, empty))
    if not calls:
        return None
    specs = []
    for sample, result, empty in calls:
        flat, spec = pytree.tree_flatten(sample)
        specs.append((spec, flat, result, empty))

    def make_args() -> list[Any]:
        values: list[Any] = []
        for spec, flat, result, empty in specs:
            values += [x.clone() if isinstance(x, torch.Tensor) else x for x in flat]
            values.append(_out_like(result, empty))
        return values

    sizes = [len(flat) for _, flat, _, _ in specs]
    op = opinfo.op

    def program(*values: Any) -> list[Any]:
        returned = []
        at = 0
        for (spec, _, _, _), n in zip(specs, sizes):
            inp, args, kwargs = pytree.tree_unflatten(list(values[at:at + n]), spec)
            out = values[at + n]
            at += n + 1
            got = op(inp, *args, **kwargs, out=out)
            same = got is out if isinstance(out, torch.Tensor) else all(g is o for g, o in zip(got, out))
            returned.append((got, same))
        return returned

    return program, make_args


def _run(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args), None
    except Exception as exc:  # eager's exception is part of what must match
        return None, exc


def _compare(expected: Any, got: Any) -> str | None:
    exp_flat, got_flat = pytree.tree_leaves(expected), pytree.tree_leaves(got)
    if len(exp_flat) != len(got_flat):
        return f"{len(got_flat)} values, expected {len(exp_flat)}"
    for e, g in zip(exp_flat, got_flat):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != e.dtype or g.shape != e.shape:
                return f"got {type(g).__name__} {getattr(g, 'dtype', '')} {tuple(getattr(g, 'shape', ()))}, " \
                       f"expected {e.dtype} {tuple(e.shape)}"
            try:
                torch.testing.assert_close(g, e, **TOLERANCE)
            except AssertionError as err:
                return "mismatch: " + str(err).splitlines()[0][:160]
        elif e != g:
            return f"got {g!r}, expected {e!r}"
    return None


def check_out_op(name: str, backends: tuple[str, ...] = BACKENDS) -> str:
    """'pass', 'skip: why' or 'fail: backend: why' for one op of the OpInfo database."""
    opinfo = out_ops()[name]
    if opinfo.name in _SKIP:
        return "skip: random or uninitialized output"
    if torch.float32 not in opinfo.supported_dtypes("cpu"):
        return "skip: dtype"
    built = build_program(opinfo)
    if built is None:
        return "skip: no sample runs eagerly"
    program, make_args = built
    eager_args = make_args()
    expected, eager_exc = _run(program, eager_args)
    for backend in backends:
        kiln.reset()
        args = make_args()
        compiled = kiln.compile(program, backend=backend, options=_options(backend))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, exc = _run(compiled, args)
        kiln_warnings = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
        if kiln_warnings or kiln.stats()["fallbacks"]:
            return f"fail: {backend}: fell back: {kiln_warnings[:1]}"
        if eager_exc is not None or exc is not None:
            if type(exc) is not type(eager_exc):
                return f"fail: {backend}: raised {exc!r}, eager raised {eager_exc!r}"
            continue
        why = _compare((expected, eager_args), (got, args))
        if why is not None:
            return f"fail: {backend}: {why}"
    return "pass"


def main() -> None:
    names = sys.argv[1:] or sorted(out_ops())
    results = {n: check_out_op(n) for n in names}
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    for n, r in sorted(results.items()):
        if r != "pass":
            print(f"{n:40s} {r}")
    passed = sum(r == "pass" for r in tried.values())
    print(f"\nout= sweep: {passed}/{len(tried)} ops pass on {', '.join(BACKENDS)}; "
          f"{len(results) - len(tried)} skipped")


if __name__ == "__main__":
    main()
