"""Recompiles after a size change (automatic dynamic) with the calls made under torch.inference_mode:
the same graph and break counts as under no_grad and plain grad mode, no frame run eagerly, eager's
values. The class found: under inference_mode autograd's keys are off, so a composite op such as
`t.to(device, dtype)` reaches the fake mode as aten.to.device with its Device argument positional;
the mode put only a `device=` keyword on meta, and on symbolic sizes the Python decomposition then
copied meta to cpu by calling `to` again without end (RecursionError: `torch.tensor(x.size(-1))`
broke every recompile of held-out DeBERTa, whose frames then ran eagerly). The same door let a
CompositeImplicitAutograd op in whole (cross_entropy, take_along_dim): its C++ kernel run on meta
refused symbolic sizes, a break only under inference_mode; it is now decomposed in the mode.

Oracles: eager for values; the same program's counts in the other grad modes; torch.compile
(backend counting graphs) for a few programs. A model-level check (DeBERTa) is slow.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.backends import CountingBackend
from kiln.capture import entry

MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "grad": contextlib.nullcontext,
}
LENGTHS = (5, 7, 9)


def tensor_of_size(x):
    return x / torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 2) + torch.tensor(x.shape[-1])


def tensor_of_sizes(x):
    return x + torch.tensor([x.size(0), x.size(1) + 1]).sum()


def to_device_and_dtype(x):
    return (x > 0).to(x.device, torch.float32) * x.size(1)


def to_device_string(x):
    return x.to("cpu", torch.float64).sum(-1) + x.new_tensor(x.size(1))


def to_other(x):
    mask = torch.ones(x.size(1), x.size(1)).tril()
    return x @ mask.to(x) + mask.to(x.device).sum()


def relative_buckets(x):
    # DeBERTa's relative positions: arange over a size, a scaled log bucket, torch.where, clamp, gather
    n = x.size(-1)
    q = torch.arange(n, dtype=torch.long, device=x.device)
    rel = q[:, None] - q[None, :]
    scale = torch.tensor(n, dtype=torch.float)
    bucket = torch.where(rel.abs() < 2, rel.float(), torch.sign(rel) * torch.log(rel.abs().float() + 1) * scale)
    idx = torch.clamp(rel + n - 1, 0, 2 * n - 2)
    table = torch.arange(2 * n - 1, dtype=x.dtype)
    return x @ bucket.to(x.dtype) + torch.gather(table.expand(n, -1), -1, idx).sum()


def masked_item(x):
    m = x > 0
    k = int(m.sum().item())  # a break, in every mode
    return x.masked_fill(~m, torch.finfo(x.dtype).min).softmax(-1) * k


def new_zeros_in_place(x):
    z = x.new_zeros(x.size(0), x.size(1) + 1)
    z[:, 1:] = x
    v = z[:, : x.size(1) // 2]
    v.add_(torch.tensor(x.size(1)).to(x.device, x.dtype))
    return z


def cross_entropy(x):
    # composite ops whose C++ kernel, run whole on meta, refuses symbolic sizes
    labels = torch.arange(x.size(0)) % x.size(1)
    return torch.nn.functional.cross_entropy(x.reshape(-1, x.size(1)).repeat(1, 2), labels)


def take_along(x):
    return torch.take_along_dim(x, x.argsort(-1), -1) + x.index_select(1, torch.arange(x.size(1)).flip(0))


def composite_mix(x):
    h = torch.nn.functional.log_softmax(x, -1).flatten().unflatten(0, (x.size(0), -1))
    return torch.einsum("bn,cn->bc", h, x) + torch.cdist(x, x) + x.std(1, keepdim=True)


PROGRAMS = [tensor_of_size, tensor_of_sizes, to_device_and_dtype, to_device_string, to_other,
            relative_buckets, masked_item, new_zeros_in_place, cross_entropy, take_along, composite_mix]
TORCH_CHECKED = [tensor_of_size, to_device_and_dtype, relative_buckets]


def _fresh(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    # Kiln's caches are per code object: a copy per mode keeps one mode's entries from serving another
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{tag}"), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def _inputs(n: int, made_inside: bool, mode: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if made_inside:
        with MODES[mode]():
            return torch.randn(3, n, generator=g)
    return torch.randn(3, n, generator=g)


def _kiln_counts(fn: Callable[..., Any], mode: str, made_inside: bool = False,
                 dynamic: bool | None = None) -> tuple[int, int, list[str]]:
    fn = _fresh(fn, f"{mode}_{made_inside}_{dynamic}")
    counter = CountingBackend()
    compiled = kiln.compile(fn, backend=counter, dynamic=dynamic)
    events: list[entry.CaptureEvent] = []
    with entry.observing(events.append):
        for n in LENGTHS:
            x = _inputs(n, made_inside, mode)
            with MODES[mode]():
                want, got = fn(x), compiled(x)
            torch.testing.assert_close(got, want)
            assert got.is_inference() == want.is_inference()
    breaks = sum(len(e.result.breaks) for e in events if e.result is not None)
    fallbacks = [f"{e.fn.__qualname__}: {e.fallback_reason}" for e in events
                 if e.result is None and e.fallback_reason and "no tensor ops" not in e.fallback_reason]
    return counter.frame_count, breaks, fallbacks


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_grad_modes_agree(fn: Callable[..., Any]) -> None:
    counts = {}
    for mode in MODES:
        graphs, breaks, fallbacks = _kiln_counts(fn, mode)
        assert not fallbacks, (mode, fallbacks)
        counts[mode] = (graphs, breaks)
    assert counts["inference_mode"] == counts["no_grad"] == counts["grad"], counts


@pytest.mark.parametrize("fn", [tensor_of_size, to_device_and_dtype, new_zeros_in_place], ids=lambda f: f.__name__)
def test_inputs_made_under_inference_mode(fn: Callable[..., Any]) -> None:
    inside = _kiln_counts(fn, "inference_mode", made_inside=True)
    outside = _kiln_counts(fn, "inference_mode")
    assert not inside[2], inside[2]
    assert inside == outside


@pytest.mark.parametrize("fn", [tensor_of_size, relative_buckets, to_other, cross_entropy], ids=lambda f: f.__name__)
def test_dynamic_true_one_graph(fn: Callable[..., Any]) -> None:
    for mode in ("inference_mode", "no_grad"):
        graphs, breaks, fallbacks = _kiln_counts(fn, mode, dynamic=True)
        assert (graphs, breaks, fallbacks) == (1, 0, []), mode


@pytest.mark.parametrize("fn", TORCH_CHECKED, ids=lambda f: f.__name__)
def test_counts_match_torch_compile(fn: Callable[..., Any]) -> None:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    graphs, _, _ = _kiln_counts(fn, "inference_mode")
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(_fresh(fn, "torch"), backend=counter)
    try:
        for n in LENGTHS:
            x = _inputs(n, False, "inference_mode")
            with torch.inference_mode():
                compiled(x)
    finally:
        torch._dynamo.reset()
    assert graphs <= counter.frame_count, (graphs, counter.frame_count)


def test_fake_to_device_positional_on_symbols() -> None:
    # the fake mode itself: aten.to.device with a positional cpu device on a fake of symbolic size
    fn = _fresh(to_device_and_dtype, "direct")
    compiled = kiln.compile(fn, backend="eager", dynamic=True, fullgraph=True)
    with torch.inference_mode():
        x = torch.randn(2, 6)
        torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.slow
def test_deberta_three_lengths_inference_mode() -> None:
    # held-out DeBERTa (disentangled attention: torch.tensor(size), relative positions, .item()) over
    # three sequence lengths: 22 frames ran eagerly under inference_mode before; now none, and the
    # counts are no_grad's
    import os
    import sys

    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
    from held_out_models9 import HELD_OUT9
    from real_models import BATCH, VOCAB

    model = HELD_OUT9["deberta"].build().eval()
    counts = {}
    for mode in ("inference_mode", "no_grad"):
        kiln.reset()  # the second mode compiles afresh, not from the first one's entries
        counter = CountingBackend()
        compiled = kiln.compile(model, backend=counter)
        events: list[entry.CaptureEvent] = []
        with entry.observing(events.append):
            for n in (8, 11, 14):
                ids = torch.randint(1, VOCAB, (BATCH, n), generator=torch.Generator().manual_seed(n))
                with MODES[mode]():
                    want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                    got = compiled(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        fallbacks = [f"{e.fn.__qualname__}: {e.fallback_reason}" for e in events
                     if e.result is None and e.fallback_reason and "no tensor ops" not in e.fallback_reason]
        assert not fallbacks, (mode, fallbacks[:3])
        counts[mode] = (counter.frame_count, sum(len(e.result.breaks) for e in events if e.result is not None))
    kiln.reset()
    assert counts["inference_mode"] == counts["no_grad"], counts
