"""The Python dispatcher as Kiln's symbolic traces use it, with eager's choice of kernel for the
composite ops where PyTorch's Python decomposition chooses another.

Under symbolic sizes a trace turns on the Python dispatcher (torch._refs' meta kernels take
symbols), which also routes CompositeImplicitAutograd ops to their Python decompositions in
torch._decomp. For most ops that is eager's computation written in Python; `aten.lstm.input` is an
exception: eager on CPU runs oneDNN (one `mkldnn_rnn_layer` per layer and direction) whenever oneDNN
takes the input, where the Python version takes that path for inference only and otherwise unrolls
the cells in plain ops. Besides computing otherwise, the unrolled cells escape autocast's rule for
`mkldnn_rnn_layer` (every argument, the float32 hidden state too, cast to the lower precision): an
LSTM under autocast with an input requiring grad gave a float32 result under dynamic=True where
eager's is bfloat16. Here the oneDNN path is taken exactly when eager takes it, and the original
decomposition runs otherwise. The override lives only inside `python_dispatcher()`: torch's own
table is restored on exit, so code outside Kiln's traces (torch.compile included) never sees it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch
from torch._C import DispatchKey
from torch._dispatch.python import enable_python_dispatcher

aten = torch.ops.aten

# the Python-dispatcher keys torch._decomp registers its lstm decomposition under
_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
_ONEDNN_LSTM = 2  # oneDNN's rnn kind for an LSTM, mkldnn_rnn_layer's `mode`


def _onednn_takes(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> bool:
    """Whether eager's CPU lstm runs oneDNN for these arguments (ATen's use_mkldnn), projections aside."""
    if not torch._C._get_mkldnn_enabled():
        return False
    if any(t.device.type != "cpu" for t in (input, *hx, *params)):
        return False
    if input.dtype == torch.float32:
        dtype_ok = True
    elif input.dtype == torch.bfloat16:
        dtype_ok = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    elif input.dtype == torch.float16:
        dtype_ok = not torch.is_grad_enabled() and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    else:
        dtype_ok = False
    return dtype_ok and input.numel() != 0 and hx[0].size(2) == hx[1].size(2)


def _lstm(original: Callable[..., Any], input: torch.Tensor, hx: Sequence[torch.Tensor],
          params: Sequence[torch.Tensor], has_biases: bool, num_layers: int, dropout: float, train: bool,
          bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.lstm.input as eager's oneDNN path computes it: time-major contiguous input, one
    mkldnn_rnn_layer per layer and direction (biases of zeros where there are none), directions
    joined on the last dim, dropout between layers in training; else `original`."""
    if len(hx) != 2 or not _onednn_takes(input, hx, params):
        return original(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    hidden_size = hx[0].size(2)
    h0, c0 = hx
    layer_input = (input.transpose(0, 1) if batch_first else input).contiguous()
    hy, cy = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = list(params[index * per_layer:(index + 1) * per_layer])
            if not has_biases:
                weights += [torch.zeros(w.shape, dtype=w.dtype, device=w.device) for w in weights]
            out, h, c, _ = aten.mkldnn_rnn_layer.default(
                layer_input, *weights, h0[index], c0[index], direction > 0, [], _ONEDNN_LSTM, hidden_size,
                num_layers, has_biases, bidirectional, batch_first, train)
            outputs.append(out)
            hy.append(h)
            cy.append(c)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(hy, 0), torch.stack(cy, 0)


@contextlib.contextmanager
def python_dispatcher() -> Iterator[None]:
    """enable_python_dispatcher() with aten.lstm.input decomposed as eager computes it (see above)."""
    op = aten.lstm.input
    saved = {key: op.py_kernels[key] for key in _KEYS if key in op.py_kernels}
    fallback = saved.get(DispatchKey.CompositeImplicitAutograd)
    try:
        if fallback is not None:
            kernel = lambda *args, **kwargs: _lstm(fallback, *args, **kwargs)  # noqa: E731
            for key in saved:
                op.py_kernels[key] = kernel
            op._dispatch_cache.clear()
        with enable_python_dispatcher():
            yield
    finally:
        for key, kernel in saved.items():
            op.py_kernels[key] = kernel
        op._dispatch_cache.clear()


__all__ = ["python_dispatcher"]
