"""nn.Module programs, part e: grad modes around the call (none, no_grad, inference_mode, enable_grad
inside no_grad) x parameters that require grad or not, for modules whose state or fast path depends on
them (BatchNorm's running statistics, Embedding's max_norm renorm, LSTM, MultiheadAttention's and
TransformerEncoderLayer's fast paths in eval, spectral norm's power iteration). Each program runs two
calls, the second under another mode, and returns the outputs, their requires_grad and
is_inference, and the module's state. Same conventions as part a.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from modules3_programs_a import X, d

_MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "plain": contextlib.nullcontext, "no_grad": torch.no_grad, "inference": torch.inference_mode,
}


def _modules() -> dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]]:
    def mha():
        return nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def tel():
        return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True).eval()

    def emb():
        m = nn.Embedding(6, 3, max_norm=1.0)
        with torch.no_grad():
            m.weight.mul_(3)
        return m
    q = X(2, 4, 8)
    return {
        "batchnorm": (lambda: nn.BatchNorm1d(3), lambda: (X(4, 3),)),
        "embedding_max_norm": (emb, lambda: (torch.tensor([0, 2, 2, 5]),)),
        "lstm": (lambda: nn.LSTM(3, 4, batch_first=True), lambda: (X(2, 3, 3),)),
        "mha_eval": (mha, lambda: (q, q, q)),
        "encoder_layer_eval": (tel, lambda: (X(2, 4, 8),)),
        "spectral_norm": (lambda: nn.utils.parametrizations.spectral_norm(nn.Linear(3, 3)), lambda: (X(2, 3),)),
    }


def _state(m: nn.Module) -> list:
    return [d(t) for t in m.buffers()] + [d(p) for p in m.parameters()]


def _flat(y) -> list:
    ts = [y] if isinstance(y, torch.Tensor) else [t for t in (y[0], y[1]) if isinstance(t, torch.Tensor)] \
        if isinstance(y[1], torch.Tensor) or y[1] is None else [y[0], *y[1]]
    return [t for t in ts if isinstance(t, torch.Tensor)]


def _program(module: str, first: str, second: str, frozen: bool) -> Callable:
    def program(C):
        make, args = _modules()[module]
        torch.manual_seed(1)
        m = make()
        if frozen:
            m.requires_grad_(False)
        cm = C(m); out = []
        for mode in (first, second):
            a = args()
            with _MODES[mode]():
                y = cm(*a)
            out += [[(d(t), t.requires_grad, t.is_inference()) for t in _flat(y)], _state(m)]
        return out
    program.__name__ = f"modes_{module}_{first}_then_{second}{'_frozen' if frozen else ''}"
    return program


PROGRAMS_E = [_program(module, first, second, frozen)
              for module in ("batchnorm", "embedding_max_norm", "lstm", "mha_eval", "encoder_layer_eval", "spectral_norm")
              for first, second in (("plain", "no_grad"), ("no_grad", "inference"), ("inference", "plain"))
              for frozen in (False, True)]
