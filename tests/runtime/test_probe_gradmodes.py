"""Grad modes x externs x inputs that are views with storage offsets, on the default backend.

A program saves an input for its backward, then changes that input in place under no_grad: eager's
backward refuses (autograd's version check), and Kiln's joint trace meets the same refusal and runs
the captured graph op by op. Under symbolic sizes (mark_dynamic, dynamic=True) autograd builds that
refusal's message from the saved tensor's `sizes()`, an `aten.size.default` whose answer C++ takes as
`int[]`: the fake answered symbols, pybind could not cast them and the frame fell back to eager with
an internal error. The answer is now the sizes' values, specialized (guarded) as `int(s)` is.

The sweep beside it: each extern on an input that is a view with a storage offset (a slice, a
transpose, as_strided, narrow, unfold windows, channels_last), under the grad modes (grad on,
no_grad inside and around, set_grad_enabled toggled in the middle, detach inside, views of the input
returned); two calls, then a backward: values, requires_grad/grad_fn, whether an output shares the
input's storage (and its strides and offset where it does), the input after the call and whether its
version moved, and the gradients of the input's base and of the parameters are eager's.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp


def _saved_then_changed(op: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = op(x)
        with torch.no_grad():
            x.mul_(2)
        return y * 1.5
    return program


SAVED_THEN_CHANGED = {
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "mm": lambda x: x.flatten(0, 1) @ x[0].t(),
    "mul": lambda x: x * x,
    "softmax": lambda x: torch.softmax(x, -1),
    "cumprod": lambda x: torch.cumprod(x, 1),
}


@pytest.mark.parametrize("name, dynamic", [(name, "mark_dynamic") for name in SAVED_THEN_CHANGED]
                         + [("layer_norm", "dynamic=True")])
def test_input_saved_then_changed_under_symbolic_sizes(name: str, dynamic: str) -> None:
    """No fallback; the result and the input are eager's, and so is the backward: the version check's
    error where x was saved (layer_norm, mm, mul, cumprod), the gradient where it was not (softmax)."""
    kiln.reset()
    program = _saved_then_changed(SAVED_THEN_CHANGED[name])
    compiled = kiln.compile(program, dynamic=True if dynamic == "dynamic=True" else None)
    for n in (4, 6):
        x = torch.randn(n, 5, 8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        if dynamic == "mark_dynamic":
            kiln.mark_dynamic(x2, 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", KilnWarning)
            got = compiled(x2)
        want = program(x)
        assert not [w for w in caught if issubclass(w.category, KilnWarning)], [str(w.message) for w in caught]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x2.detach(), x.detach())
        assert (got.requires_grad, got.grad_fn is not None) == (want.requires_grad, want.grad_fn is not None)
        outcomes = []
        for out, leaf in ((want, x), (got, x2)):
            try:
                out.sum().backward()
                outcomes.append(leaf.grad)
            except RuntimeError as exc:  # the version check: x was saved, then changed
                outcomes.append(str(exc).split(":")[0])
        if isinstance(outcomes[0], str):
            assert outcomes[1] == outcomes[0]
        else:
            torch.testing.assert_close(outcomes[1], outcomes[0])
    assert kiln.stats()["fallbacks"] == 0


# ------------------------------------------------------------------------------ the sweep

def _p(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


IDX = torch.tensor([2, 0, 1, 2])

# name: (parameters, the input's shape, the program over (parameters, x))
EXTERNS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Callable[[Any, torch.Tensor], Any]]] = {
    "mm": (lambda: nn.ParameterDict({"w": _p(8, 6)}), (5, 8), lambda m, x: torch.mm(x, m["w"])),
    "addmm": (lambda: nn.ParameterDict({"w": _p(8, 6), "b": _p(6)}), (5, 8),
              lambda m, x: torch.addmm(m["b"], x, m["w"])),
    "baddbmm": (lambda: nn.ParameterDict({"w": _p(3, 8, 5), "b": _p(3, 4, 5)}), (3, 4, 8),
                lambda m, x: torch.baddbmm(m["b"], x, m["w"], alpha=0.5, beta=2)),
    "matmul_broadcast": (lambda: nn.ParameterDict({"w": _p(3, 8, 5)}), (2, 1, 4, 8), lambda m, x: x @ m["w"]),
    "linear": (lambda: nn.Linear(8, 6), (2, 5, 8), lambda m, x: m(x)),
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), (2, 4, 16), lambda m, x: m(x)),
    "conv2d_depthwise": (lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), (2, 4, 8, 8), lambda m, x: m(x)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1),
                         (2, 4, 5, 5), lambda m, x: m(x)),
    "sdpa": (lambda: nn.ParameterDict({"k": _p(2, 2, 6, 8), "v": _p(2, 2, 6, 8)}), (2, 2, 6, 8),
             lambda m, x: F.scaled_dot_product_attention(x, m["k"], m["v"])),
    "embedding": (lambda: nn.Module(), (6, 8), lambda m, x: F.embedding(IDX, x)),
    "index_put": (lambda: nn.ParameterDict({"v": _p(5)}), (6, 5),
                  lambda m, x: x.index_put((torch.tensor([1, 3]),), m["v"])),
    "gather": (lambda: nn.Module(), (4, 5),
               lambda m, x: torch.gather(x, 1, torch.tensor([[0, 2], [1, 1], [4, 0], [3, 3]]))),
    "sort": (lambda: nn.Module(), (4, 7), lambda m, x: torch.sort(x, dim=0, descending=True)),
    "topk": (lambda: nn.Module(), (4, 7), lambda m, x: torch.topk(x, 3)),
    "cumsum": (lambda: nn.Module(), (4, 7), lambda m, x: torch.cumsum(x, 1)),
    "linalg_solve": (lambda: nn.ParameterDict({"b": _p(4, 2)}), (5, 5),
                     lambda m, x: torch.linalg.solve(x[:4, :4] @ x[:4, :4].t() + 4 * torch.eye(4), m["b"])),
    "fft": (lambda: nn.Module(), (4, 16), lambda m, x: torch.fft.rfft(x).abs()),
    "batch_norm_train": (lambda: nn.BatchNorm2d(4), (3, 4, 5, 5), lambda m, x: m(x)),
    "group_norm": (lambda: nn.GroupNorm(2, 4), (3, 4, 5, 5), lambda m, x: m(x)),
    "max_pool2d": (lambda: nn.Module(), (2, 3, 9, 9), lambda m, x: F.max_pool2d(x, 3, 2, 1, return_indices=True)),
    "adaptive_avg_pool2d": (lambda: nn.Module(), (2, 3, 9, 7), lambda m, x: F.adaptive_avg_pool2d(x, (4, 3))),
    "interpolate": (lambda: nn.Module(), (2, 3, 5, 5),
                    lambda m, x: F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False)),
}


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.insert(0, acc)
        acc *= s
    return strides


# a view kind: (the base's shape for the input's shape, the view of the base)
VIEWS: dict[str, tuple[Callable[[tuple[int, ...]], tuple[int, ...]], Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]]] = {
    "slice0": (lambda s: (s[0] + 1, *s[1:]), lambda b, s: b[1:]),
    "slice_last": (lambda s: (*s[:-1], s[-1] + 2), lambda b, s: b[..., 2:]),
    "step": (lambda s: (2 * s[0], *s[1:]), lambda b, s: b[1::2]),
    "transposed": (lambda s: tuple(reversed(s)), lambda b, s: b.permute(*reversed(range(len(s))))),
    "as_strided": (lambda s: (torch.Size(s).numel() + 7,), lambda b, s: b.as_strided(s, _strides(s), 5)),
    "narrow": (lambda s: (*s[:-1], s[-1] + 3), lambda b, s: b.narrow(-1, 1, s[-1])),
    "unfold": (lambda s: (torch.Size(s).numel() + 1,),
               lambda b, s: b[1:].unfold(0, s[-1], s[-1]).view(s)),
    "expand": (lambda s: (1, *s[1:]), lambda b, s: b.expand(*s)),
}


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _toggle(fn: Callable[..., Any], m: Any, x: torch.Tensor) -> Any:
    torch.set_grad_enabled(False)
    frozen = _first(fn(m, x))
    torch.set_grad_enabled(True)
    return _first(fn(m, x)), frozen


def _no_grad_inside(fn: Callable[..., Any], m: Any, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return fn(m, x)


def _detach_inside(fn: Callable[..., Any], m: Any, x: torch.Tensor) -> Any:
    y = _first(fn(m, x))
    return y.detach() * 2 + y, y.detach()


def _views_out(fn: Callable[..., Any], m: Any, x: torch.Tensor) -> Any:
    return _first(fn(m, x)), x[1:], x.transpose(0, 1), x.detach()


# name: (the context around each call, the program)
MODES: dict[str, tuple[Callable[[], Any], Callable[..., Any]]] = {
    "grad": (contextlib.nullcontext, lambda fn, m, x: fn(m, x)),
    "no_grad_inside": (contextlib.nullcontext, _no_grad_inside),
    "no_grad_around": (torch.no_grad, lambda fn, m, x: fn(m, x)),
    "toggle": (contextlib.nullcontext, _toggle),
    "detach_inside": (contextlib.nullcontext, _detach_inside),
    "views_out": (contextlib.nullcontext, _views_out),
}


def _facts(t: Any, x: torch.Tensor) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    shares = t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return (tuple(t.shape), t.dtype, t.requires_grad, t.grad_fn is not None, t.is_leaf, shares,
            (t.stride(), t.storage_offset()) if shares else None)


def _run(program: Callable[..., Any], fn: Callable[..., Any], m: nn.Module, x: torch.Tensor,
         around: Callable[[], Any], leaves: list[torch.Tensor]) -> list[Any]:
    record: list[Any] = []
    for _ in range(2):
        version = x._version
        with around():
            out = program(fn, m, x)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        record.append([_facts(o, x) for o in out])
        record.append([o.detach().clone() for o in out])
        record.append((x.detach().clone(), x._version > version))
        losses = [o.sum() * (k + 1) for k, o in enumerate(out) if o.requires_grad and o.is_floating_point()]
        if losses and torch.is_grad_enabled():
            torch.stack(losses).sum().backward()
        record.append([None if p.grad is None else p.grad.clone() for p in leaves])
        record.append([b.clone() for b in m.buffers()])
    return record


def _input(shape: tuple[int, ...], view: str, grads: bool) -> tuple[torch.Tensor, torch.Tensor]:
    base_shape, make = VIEWS[view]
    base = torch.randn(*base_shape(shape)).requires_grad_(grads)
    return base, make(base, shape)


def check(name: str, view: str, mode: str, grads: bool) -> None:
    kiln.reset()
    factory, shape, fn = EXTERNS[name]
    around, program = MODES[mode]
    torch.manual_seed(0)
    model = factory().requires_grad_(grads)
    base, x = _input(shape, view, grads)
    compiled_model = copy.deepcopy(model)
    compiled_base = base.detach().clone().requires_grad_(grads)
    compiled_x = VIEWS[view][1](compiled_base, shape)
    want = _run(program, fn, model, x, around, [base, *model.parameters()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", KilnWarning)
        got = _run(kiln.compile(program), fn, compiled_model, compiled_x, around,
                   [compiled_base, *compiled_model.parameters()])
    where = f"{name}/{view}/{mode}/grads={grads}"
    assert not [w for w in caught if issubclass(w.category, KilnWarning)], where
    assert kiln.stats()["fallbacks"] == 0, where
    assert len(want) == len(got)
    for k, (a, b) in enumerate(zip(want, got)):
        if k % 5 == 0:  # facts
            assert a == b, f"{where} call {k // 5}: compiled {b}, eager {a}"
        elif k % 5 == 2:  # the input and whether its version moved
            torch.testing.assert_close(b[0], a[0], msg=lambda s: f"{where}: input {s}")
            assert a[1] == b[1], f"{where}: input version moved {b[1]}, eager {a[1]}"
        else:
            assert len(a) == len(b), where
            for u, w in zip(a, b):
                assert (u is None) == (w is None), f"{where} [{k}]: compiled {w}, eager {u}"
                if u is not None:
                    torch.testing.assert_close(w, u, rtol=1e-3, atol=1e-4, msg=lambda s: f"{where} [{k}]: {s}")


@pytest.mark.ci_slice({"name": "mm", "view": "slice0", "mode": "views_out", "grads": True})
@pytest.mark.parametrize("grads", [True, False])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("name", list(EXTERNS))
def test_extern_on_offset_view_under_grad_mode(name: str, view: str, mode: str, grads: bool) -> None:
    check(name, view, mode, grads)
