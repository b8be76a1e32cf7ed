"""Run a program eagerly and through kiln.compile and compare what each did: the value returned or
the exception raised, the arguments as the call left them, and the graphs Kiln made.

Shared by the probe test files (test_probe15_lang.py, ...): `run` for a list of calls of one
compiled function, checked for fallbacks and breaks; `check` for one call on fresh arguments, the
exception compared with its text; `outcome` and `same_outcome` for tests that compare calls
themselves; `dynamo_graphs` for the real torch.compile's graph count (the oracle of counts);
`one_graph_eager_values` and `grads_match_eager` for a function compiled whole (fullgraph=True).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import kiln
from semantics_oracle import same


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """("ok", the value) or ("raised", the exception's type, its text)."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc), str(exc))


def same_outcome(got: Any, want: Any, *, text: bool) -> bool:
    """Both returned equal values (semantics_oracle.same), or both raised the same exception type
    (and the same text where `text`)."""
    if got[0] != want[0]:
        return False
    if want[0] == "ok":
        return bool(same(got[1], want[1]))
    return got[1:] == want[1:] if text else got[1] is want[1]


def run(fn: Callable[..., Any], calls: Sequence[tuple], graphs: int | None = None, breaks: bool = False,
        fresh: Callable[[], tuple] | None = None) -> None:
    """Each call eager then compiled (on fresh arguments from `fresh` when given, so mutations of
    an argument do not leak between the two), the exception compared by type; no fallback to
    eager, no graph break unless `breaks`; `graphs`: how many graphs Kiln makes."""
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for i, args in enumerate(calls):
        want = outcome(fn, *(fresh() if fresh else args))
        got = outcome(compiled, *(fresh() if fresh else args))
        assert same_outcome(got, want, text=False), f"call {i}: compiled gave {got!r}, eager {want!r}"
    assert kiln.stats()["fallbacks"] == 0 and (breaks or kiln.stats()["graph_breaks"] == 0), kiln.stats()
    if graphs is not None:
        assert backend.frame_count == graphs, f"{backend.frame_count} graphs, expected {graphs}"


def check(fn: Callable[..., Any], make_args: Callable[[], tuple], backend: str = "eager") -> None:
    """One call eager and one compiled, each on its own `make_args()`: the same value or the same
    exception with the same text, and the arguments left the same."""
    kiln.reset()
    eager_args = make_args()
    want = outcome(fn, *eager_args)
    kiln_args = make_args()
    got = outcome(kiln.compile(fn, backend=backend), *kiln_args)
    assert same_outcome(got, want, text=True), (got, want)
    assert same(kiln_args, eager_args), (kiln_args, eager_args)


def dynamo_graphs(fn: Callable[..., Any], call: Callable[[Callable[..., Any]], Any]) -> int:
    """How many graphs the real torch.compile (Dynamo, graphs counted by a backend) makes of fn while
    `call(compiled)` runs it."""
    import torch._dynamo

    counter = kiln.backends.CountingBackend()
    torch._dynamo.reset()
    call(torch.compile(fn, backend=counter))
    return counter.frame_count


def one_graph_eager_values(fn: Callable[..., Any], backend: str, *args: Any) -> None:
    """kiln.compile(fn, backend=backend, fullgraph=True) returns eager's value (a tensor or a
    structure of them) from one graph, with no fallback to eager."""
    import torch

    kiln.reset()
    got = kiln.compile(fn, backend=backend, fullgraph=True)(*args)
    torch.testing.assert_close(got, fn(*args))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def grads_match_eager(fn: Callable[..., Any], backend: str, *args: Any) -> None:
    """kiln.compile(fn, fullgraph=True) and fn on copies of `args` (tensors requiring grad): the
    gradients of the sum of squares of their outputs (a tensor or a tuple of them) agree."""
    import torch

    copies = [a.detach().clone().requires_grad_() for a in args]

    def flat(out: Any) -> list:
        return list(out) if isinstance(out, (tuple, list)) else [out]

    got = flat(kiln.compile(fn, backend=backend, fullgraph=True)(*args))
    sum(o.square().sum() for o in got).backward()
    sum(o.square().sum() for o in flat(fn(*copies))).backward()
    for a, c in zip(args, copies):
        torch.testing.assert_close(a.grad, c.grad)


def under_grad_mode(mode: str, body: Callable[[], Any]) -> Any:
    """body() inside an outer grad mode: "no_grad", "inference_mode", or "enable_grad_in_no_grad"."""
    import torch

    if mode == "no_grad":
        with torch.no_grad():
            return body()
    if mode == "inference_mode":
        with torch.inference_mode():
            return body()
    with torch.no_grad(), torch.enable_grad():
        return body()
