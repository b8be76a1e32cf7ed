"""The `fuse_attention` pass: attention written out by hand (q @ k.transpose(-2, -1), a scale,
softmax, @ v) becomes one call of ATen's fused CPU attention kernel.

Runs on the ATen graph after `fold_batch_norm`, before `decompose`. A model that spells attention out
(a ViT block, a CLIP text encoder, a decoder layer with a cache) reaches the lowering as two bmms
around a softmax, each bmm over `expand`/`view`s of the 4-d q, k, v; ATen's
`_scaled_dot_product_flash_attention_for_cpu` computes the same result in blocks that stay in cache,
never writing the [B, H, L, S] scores, and reads q, k, v as strided views of the projection's output
(no copies into bmm operands). A ViT's attention (8 x 4 heads, 65 tokens of 16) took 476 us against
503 us for Kiln's own bmm + softmax + bmm at 1 thread; longer sequences gain more (128 tokens of
contiguous q, k, v: 1.4x). Matched only where every intermediate has one reader (so never in a
training forward, where the softmax is saved for the backward), on CPU float32/float64, for a query
longer than one row (a decode step's single row is a vector product Kiln's loops compute better, extern.
vector_bmm). Corresponds to Inductor's fx_passes/fuse_attention.py (its patterns are matched
before autograd, cover training and attention masks too).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln import log

aten = torch.ops.aten
flash_attention = aten._scaled_dot_product_flash_attention_for_cpu.default

_DTYPES = (torch.float32, torch.float64)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _single_use(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and len(node.users) == 1


def _shape(node: Any) -> tuple | None:
    v = _val(node)
    if not isinstance(v, torch.Tensor) or not all(isinstance(s, int) for s in v.shape):
        return None
    return tuple(v.shape)


def _bmm_operand(node: Any, shape4: tuple) -> Any:
    """The 4-d tensor x of bmm's operand view(expand(x, shape4), [B*H, m, n]) (a strided x is copied
    contiguous first: view(clone(expand(x)))), when the expand changes nothing (x's shape is shape4
    already), else None."""
    if not _single_use(node) or node.target not in _VIEWS:
        return None
    inner = node.args[0]
    if _single_use(inner) and inner.target is aten.clone.default:
        inner = inner.args[0]
    if _single_use(inner) and inner.target is aten.expand.default:
        inner = inner.args[0]
    return inner if _shape(inner) == shape4 else None


def _transposed_key(node: Any) -> Any:
    """k of k.transpose(-2, -1) (a 4-d transpose of the last two dimensions), else None."""
    if not _single_use(node) or node.target is not aten.transpose.int:
        return None
    dims = {d % 4 for d in node.args[1:3]}
    return node.args[0] if dims == {2, 3} else None


@dataclass(frozen=True)
class _Match:
    q: Any  # FX nodes (their args are untyped)
    k: Any
    v: Any
    scale: float
    out: Any  # the [B, H, L, D] view of the second bmm, which the fused call replaces


def _scores_and_scale(node: Any) -> tuple[Any, float] | None:
    """(scores, scale) of scores * c, scores / c or scores itself."""
    if _single_use(node) and node.target in (aten.mul.Tensor, aten.div.Tensor) and not node.kwargs:
        base, c = node.args
        if isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0:
            return base, float(c) if node.target is aten.mul.Tensor else 1.0 / float(c)
        return None
    return node, 1.0


def _match(out: Any) -> _Match | None:
    if out.target not in _VIEWS or not _single_use(out.args[0]) or out.args[0].target is not aten.bmm.default:
        return None
    shape = _shape(out)
    if shape is None or len(shape) != 4:
        return None
    b, h, l, d = shape
    bmm2 = out.args[0]
    probs_view, v_view = bmm2.args
    # probs: view(expand(softmax(x, -1), [B, H, L, S]), [B*H, L, S])
    if not _single_use(probs_view) or probs_view.target not in _VIEWS:
        return None
    probs = probs_view.args[0]
    if _single_use(probs) and probs.target is aten.expand.default:
        probs = probs.args[0]
    if not _single_use(probs) or probs.target is not aten._softmax.default or probs.args[2] is not False:
        return None
    pshape = _shape(probs)
    if pshape is None or len(pshape) != 4 or pshape[:3] != (b, h, l) or probs.args[1] % 4 != 3:
        return None
    s = pshape[3]
    v = _bmm_operand(v_view, (b, h, s, d))
    # an additive mask (softmax(scores + mask)) is not matched: a CLIP text encoder's causal attention
    # (16 tokens) ran 0.77-0.93x of the unfused graph end to end at 1 thread, though alone it was faster
    x = probs.args[0]
    scaled = _scores_and_scale(x)
    if scaled is None:
        return None
    scores, scale = scaled
    if not _single_use(scores) or scores.target not in _VIEWS or _shape(scores) != pshape:
        return None
    bmm1 = scores.args[0]
    if not _single_use(bmm1) or bmm1.target is not aten.bmm.default:
        return None
    q = _bmm_operand(bmm1.args[0], (b, h, l, d))
    kt = _bmm_operand(bmm1.args[1], (b, h, d, s))
    k = _transposed_key(kt)
    if q is None or k is None or v is None or _shape(k) != (b, h, s, d):
        return None
    vals = [_val(t) for t in (q, k, v)]
    dtype = vals[0].dtype
    if dtype not in _DTYPES or any(t.dtype != dtype or t.device.type != "cpu" for t in vals):
        return None
    if l == 1 or s == 0 or d == 0 or b * h == 0:
        return None
    return _Match(q, k, v, scale, out)


def _query_contiguous(q: Any) -> bool:
    v = _val(q)
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _erase_unused_chain(graph: torch.fx.Graph, out: Any) -> None:
    """Erase the replaced view and the nodes only it read, back to q, k, v (a node read
    elsewhere stays; nothing outside the matched chain has lost a reader)."""
    stack = [out]
    while stack:
        node = stack.pop()
        if node.users or node.op != "call_function":
            continue
        inputs = [a for a in node.all_input_nodes]
        graph.erase_node(node)
        stack.extend(inputs)


def fuse_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite each written-out attention of `gm` into the fused ATen kernel, in place."""
    graph = gm.graph
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _VIEWS:
            continue
        m = _match(node)
        if m is None:
            continue
        b, h, l, _d = _shape(m.out)  # type: ignore[misc]
        s = _shape(m.k)[2]  # type: ignore[index]
        with graph.inserting_before(m.out):
            call = graph.call_function(flash_attention, (m.q, m.k, m.v, 0.0, False), {"scale": m.scale})
            out = graph.call_function(operator.getitem, (call, 0))
            result = out
            if not _query_contiguous(m.q):
                # the fused kernel's output follows the query's layout; the view it replaces was contiguous
                result = graph.call_function(aten.clone.default, (out,), {"memory_format": torch.contiguous_format})
        m.out.replace_all_uses_with(result)
        _erase_unused_chain(graph, m.out)
        fused += 1
    if fused:
        graph.lint()
        gm.recompile()
        log.debug("lower", lambda: f"fuse_attention: {fused} attention(s) fused into one call each")
    return gm
