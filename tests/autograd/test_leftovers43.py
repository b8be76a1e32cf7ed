"""Leftovers found by probes, each a class of cases compared with eager (values, gradients, version
counters, aliasing) on every backend, with the real torch.compile as a second oracle where it agrees:

- an as_strided in a view chain that holds a `detach()` (`y.detach().view(-1).as_strided(...)`), then
  an in-place op, compiles (it ran eagerly) and updates the input as eager's does;
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import kiln

BACKENDS = ["default", "aot_eager", "eager"]


def compiled(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    kiln.reset()
    return kiln.compile(fn) if backend == "default" else kiln.compile(fn, backend=backend)


def flat(out: Any) -> list[Any]:
    if isinstance(out, dict):
        return list(out.values())
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_quietly(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), failing on a KilnWarning that ran the frame eagerly (an internal error)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args)
    errors = [str(w.message) for w in seen if "running it eagerly" in str(w.message)]
    assert not errors, errors
    return out


def facts(outs: list[Any], inputs: list[torch.Tensor]) -> list[Any]:
    """What eager and Kiln must agree on beyond values: versions, grad, and which storage each
    output shares (an input's, or an earlier output's)."""
    storages = [t.untyped_storage().data_ptr() for t in inputs]
    found = []
    for o in outs:
        if not isinstance(o, torch.Tensor):
            found.append(o)
            continue
        ptr = o.untyped_storage().data_ptr()
        shares = storages.index(ptr) if ptr in storages else None
        version = None if o.is_inference() else o._version
        found.append((version, o.requires_grad, o.is_leaf, shares, o.shape, o.stride(), o.storage_offset()))
        storages.append(ptr)
    return found


# ------------------------------------------------------------------ detach in an as_strided view chain

def detach_view_strided(y):
    y.detach().view(-1).as_strided((2,), (2,), 1).mul_(2)
    return y + 1


def detach_strided(y):
    y.detach().as_strided((2,), (2,), 1).mul_(2)
    return y + 1


def view_detach_strided(y):
    y.view(-1).detach().as_strided((2,), (2,), 1).mul_(2)
    return y + 1


def detach_slice_strided(y):
    y.detach().view(-1)[1:].as_strided((2,), (2,), None).add_(10)
    return y * 1


def detach_returned(y):
    z = y.detach()
    w = z.view(-1).as_strided((2, 2), (1, 3), 1)
    w.mul_(2)
    return z, w, y


def detach_twice(y):
    y.detach()[1:].detach().as_strided((3,), (1,), 2).sub_(1)
    return y.sum()


def detach_of_intermediate(y):
    t = y * 3
    t.detach().view(-1).as_strided((2,), (3,), 0).fill_(-1)
    return t


def detach_in_container(y):
    box = {"d": y.detach(), "l": [y.view(-1)]}
    box["d"].view(-1).as_strided((2,), (1,), 4).mul_(5)
    box["l"][0].detach().as_strided((1,), (1,), 0).add_(1)
    return {"d": box["d"], "v": box["l"][0]}


DETACH_CHAINS = [detach_view_strided, detach_strided, view_detach_strided, detach_slice_strided,
                 detach_returned, detach_twice, detach_of_intermediate, detach_in_container]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", ["plain", "nonleaf", "no_grad", "inference"])
@pytest.mark.parametrize("fn", DETACH_CHAINS, ids=lambda f: f.__name__)
def test_detach_in_an_as_strided_chain_then_updated(fn, grad, backend):
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        leaf = torch.arange(6.).reshape(2, 3).requires_grad_(grad != "plain")
        return leaf, (leaf * 1 if grad == "nonleaf" else leaf)

    def call(f: Callable[..., Any], y: torch.Tensor) -> Any:
        if grad == "no_grad":
            with torch.no_grad():
                return f(y)
        if grad == "inference":
            with torch.inference_mode():
                return f(y)
        return f(y)

    e_leaf, e_y = make()
    want = flat(call(fn, e_y))
    k_leaf, k_y = make()
    got = flat(run_quietly(lambda y: call(compiled(fn, backend), y), k_y))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(k_y, e_y) and k_y._version == e_y._version
    assert facts(got, [k_y]) == facts(want, [e_y])
    assert kiln.stats()["fallbacks"] == 0
    if grad == "nonleaf":
        sum(o.sum() for o in got if o.requires_grad).backward()
        sum(o.sum() for o in want if o.requires_grad).backward()
        assert torch.equal(k_leaf.grad, e_leaf.grad)
