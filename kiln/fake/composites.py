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
decomposition runs otherwise. `aten.matmul.default`'s Python version ends in a view (squeeze of a
1-d operand's product, `.view` of a broadcast bmm) where eager's C++ ends in an in-place squeeze_
or an _unsafe_view, so the traced result was an autograd view where eager's is not (a result made
under no_grad then refused an in-place op with grad on); such a result is un-viewed here.
`aten.dropout.default`'s Python version calls native_dropout, which draws from the generator for
p == 1 where eager's CPU dropout draws nothing; the multi-layer RNNs' Python versions (gru, rnn_tanh,
rnn_relu, lstm off oneDNN; `.input` and `.data`) never apply the dropout between layers.
The overrides (one table, `@eager_composite`) live only inside `python_dispatcher()`: torch's own
kernels are restored on exit, so code outside Kiln's traces (torch.compile included) never sees them.
Where a composite op reaches a mode whole (under inference_mode autograd's keys are off), the fake
mode and AOT's tracer decompose it with `eager_decomposition(op)`, the same overrides.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Sequence

import torch
from torch._C import DispatchKey
from torch._decomp.decompositions import should_fold
from torch._dispatch.python import enable_python_dispatcher

aten = torch.ops.aten

# the Python-dispatcher keys torch registers its decompositions under (lstm's both, matmul's the first)
_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
_ONEDNN_LSTM = 2  # oneDNN's rnn kind for an LSTM, mkldnn_rnn_layer's `mode`

# op -> its implementation in traces, called as impl(torch's Python decomposition, *args, **kwargs)
Composite = Callable[..., Any]
_OVERRIDES: dict[Any, Composite] = {}
_ORIGINALS: dict[Any, Composite] = {}  # op -> torch's Python decomposition, as registered at import


def eager_composite(op: Any) -> Callable[[Composite], Composite]:
    """Decorator: `impl(original, *args, **kwargs)` decomposes `op` in Kiln's symbolic traces."""
    def register(impl: Composite) -> Composite:
        if op in _OVERRIDES:
            raise ValueError(f"{op} already has an eager composite: {_OVERRIDES[op].__name__}")
        _OVERRIDES[op] = impl
        original = op.py_kernels.get(DispatchKey.CompositeImplicitAutograd)
        if original is not None:
            _ORIGINALS[op] = original
        return impl
    return register


def eager_decomposition(op: Any) -> Callable[..., Any] | None:
    """`op`'s eager composite bound to torch's Python decomposition, or None where it has none. For
    the paths where a composite op reaches a mode whole and is decomposed there: under inference_mode
    autograd's keys are off, so `aten.dropout` or `aten.gru.input` arrive packed, and `op.decompose()`
    or torch's decomposition table would take the Python versions this module corrects."""
    impl, original = _OVERRIDES.get(op), _ORIGINALS.get(op)
    return None if impl is None or original is None else functools.partial(impl, original)


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


@eager_composite(aten.lstm.input)
def lstm(original: Callable[..., Any], input: torch.Tensor, hx: Sequence[torch.Tensor],
          params: Sequence[torch.Tensor], has_biases: bool, num_layers: int, dropout: float, train: bool,
          bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.lstm.input as eager's oneDNN path computes it: time-major contiguous input, one
    mkldnn_rnn_layer per layer and direction (biases of zeros where there are none), directions
    joined on the last dim, dropout between layers in training; else `original`."""
    if len(hx) != 2 or not _onednn_takes(input, hx, params):
        return _rnn_layers(original, input, None, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                           batch_first)
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


@eager_composite(aten.matmul.default)
def matmul(original: Callable[..., Any], tensor1: torch.Tensor, tensor2: torch.Tensor) -> torch.Tensor:
    """torch's Python matmul, its result no autograd view where eager's is none: every path but the
    folded one that multiplies by the larger operand transposed (`.mT.contiguous()`, a view in
    eager too when the transpose is already contiguous)."""
    out = original(tensor1, tensor2)
    if not isinstance(out, torch.Tensor) or not out._is_view():
        return out
    folded_transposed = tensor2.dim() > tensor1.dim() and tensor2.dim() >= 3 and should_fold(tensor1, tensor2, False)
    return out if folded_transposed else aten._unsafe_view.default(out, out.shape)


@contextlib.contextmanager
def python_dispatcher() -> Iterator[None]:
    """enable_python_dispatcher() with the ops of `_OVERRIDES` decomposed as eager computes them."""
    saved: list[tuple[Any, Any, Any]] = []  # (op, key, torch's kernel)
    try:
        for op, impl in _OVERRIDES.items():
            original = op.py_kernels.get(DispatchKey.CompositeImplicitAutograd)
            if original is None:
                continue
            kernel = functools.partial(impl, original)
            for key in _KEYS:
                if key in op.py_kernels:
                    saved.append((op, key, op.py_kernels[key]))
                    op.py_kernels[key] = kernel
            op._dispatch_cache.clear()
        with enable_python_dispatcher():
            yield
    finally:
        for op, key, kernel in reversed(saved):
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()


def _rnn_layers(original: Callable[..., Any], input: torch.Tensor, batch_sizes: torch.Tensor | None, hx: Any,
                params: Sequence[torch.Tensor], has_biases: bool, num_layers: int, dropout: float, train: bool,
                bidirectional: bool, batch_first: bool = False) -> tuple:
    """A multi-layer RNN op (gru, rnn_tanh, rnn_relu, lstm; `batch_sizes` for the packed `.data`
    overloads) as eager's layer stack runs it: one layer at a time, time-major, with
    `dropout(output, p, train=True)` between layers when training. torch's Python decompositions
    never apply that dropout (their test of the layer index is never true): under the Python
    dispatcher a multi-layer RNN in training lost its dropout and drew nothing. Each layer is
    `original` with one layer and no dropout; other calls are `original` as they are."""
    def call(x: torch.Tensor, h: Any, weights: Sequence[torch.Tensor], layers: int, p: float, first: bool) -> Any:
        if batch_sizes is not None:
            return original(x, batch_sizes, h, weights, has_biases, layers, p, train, bidirectional)
        return original(x, h, weights, has_biases, layers, p, train, bidirectional, first)

    if not train or dropout == 0 or num_layers < 2:
        return call(input, hx, params, num_layers, dropout, batch_first)
    directions = 2 if bidirectional else 1
    per_layer = len(params) // num_layers
    lstm = isinstance(hx, (list, tuple))
    x = input.transpose(0, 1) if batch_first and batch_sizes is None else input
    hidden: list[list[torch.Tensor]] = [[] for _ in (hx if lstm else (hx,))]
    for layer in range(num_layers):
        rows = slice(layer * directions, (layer + 1) * directions)
        h = [t[rows] for t in hx] if lstm else hx[rows]
        out = call(x, h, params[layer * per_layer:(layer + 1) * per_layer], 1, 0.0, False)
        x = out[0]
        for k, final in enumerate(out[1:]):
            hidden[k].append(final)
        if layer < num_layers - 1:
            x = torch.dropout(x, dropout, True)
    if batch_first and batch_sizes is None:
        x = x.transpose(0, 1)
    return (x, *(torch.cat(h, 0) for h in hidden))


def _register_rnn_layers() -> None:
    for packet in (aten.gru, aten.rnn_tanh, aten.rnn_relu):
        eager_composite(packet.input)(_rnn_input_layers)
        eager_composite(packet.data)(_rnn_data_layers)
    eager_composite(aten.lstm.data)(_rnn_data_layers)


def _rnn_input_layers(original: Callable[..., Any], input: torch.Tensor, hx: Any, params: Sequence[torch.Tensor],
                      has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
                      batch_first: bool) -> tuple:
    return _rnn_layers(original, input, None, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                       batch_first)


def _rnn_data_layers(original: Callable[..., Any], data: torch.Tensor, batch_sizes: torch.Tensor, hx: Any,
                     params: Sequence[torch.Tensor], has_biases: bool, num_layers: int, dropout: float, train: bool,
                     bidirectional: bool) -> tuple:
    return _rnn_layers(original, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)


_register_rnn_layers()


def _fused_dropout_takes(input: torch.Tensor, p: float) -> bool:
    """Whether eager's `dropout` runs the fused native_dropout kernel (ATen's is_fused_kernel_acceptable)."""
    return input.device.type in ("cuda", "xpu", "privateuseone") and 0 < p < 1 and input.numel() > 0


@eager_composite(aten.dropout.default)
def dropout(original: Callable[..., Any], input: torch.Tensor, p: float, train: bool | None) -> torch.Tensor:
    """aten.dropout.default as eager computes it off the fused kernel (on CPU): nothing drawn for
    p == 1 (the input times a zero) as for p == 0, else a noise tensor laid out like the input,
    drawn with `bernoulli(1 - p)` then divided by 1 - p. torch's Python version always calls native_dropout,
    which draws for p == 1 too: the generator advanced where eager's does not."""
    if not train or p == 0 or input.numel() == 0 or _fused_dropout_takes(input, p):
        return original(input, p, train)
    if p == 1:
        return input * torch.zeros((), dtype=input.dtype, device=input.device)
    # functional ops only: a mode below functionalization (AOT's tracer under inference_mode) runs
    # this too. bernoulli.p draws as `empty_like(input).bernoulli_(p)` in eager's memory order
    # (kiln.autograd.decompose's bernoulli_p, in every AOT trace)
    noise = aten.bernoulli.p(torch.empty_like(input), 1 - p)  # empty_like: no autograd through the draw
    return input * noise.div(1 - p)


__all__ = ["eager_composite", "eager_decomposition", "python_dispatcher"]
