"""`mode="max-autotune"` on CPU: the graph compiled more than one way, each timed, the fastest kept.

Variants (each one only where it changes the graph):
- "default": Kiln's usual lowering (a Linear is ATen's addmm, its activation fused into the next
  generated kernel).
- "linear_onednn": every float32 `addmm(bias, x, t(w))` whose weight is a graph input becomes oneDNN's
  linear with the activation after it fused in (mkldnn::_linear_pointwise: relu, gelu, tanh,
  sigmoid, silu), instead of addmm plus a kernel.
- "onednn_convolutions": small convolutions stay oneDNN calls (kiln.lower.conv_layout's limits at 0)
  instead of Kiln's GEMM and depthwise loops.
Each variant is compiled as its own graph (the variant is part of its cache key). On the first call
each runs on copies of the real inputs (so input mutations happen once, on the real ones, by the
winner) and the one with the lowest median time wins; the winner's compiled graph is then stored
under the max-autotune graph's own cache key, so a later process loads it without timing again.
KILN_LOGS=autotune prints the times. Corresponds to Inductor's max-autotune choice between ATen
and template kernels (torch/_inductor/select_algorithm.py), made here per graph rather than per op.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx

from kiln import log
from kiln.lower import conv_layout
from kiln.runtime import artifact
from kiln.runtime.overlap import strided_copy

aten = torch.ops.aten
linear_pointwise = torch.ops.mkldnn._linear_pointwise.default

# activation op -> (oneDNN post-op, algorithm) for those whose arguments are only the input
_FUSABLE: dict[Any, tuple[str, str | None]] = {
    aten.relu.default: ("relu", None), aten.tanh.default: ("tanh", None), aten.sigmoid.default: ("sigmoid", None),
    aten.silu.default: ("swish", None),
}
VARIANTS = ("default", "linear_onednn", "onednn_convolutions")
TIMED_SECONDS = 0.2  # per variant, after two warm-up calls
MAX_RUNS = 50


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _activation(node: torch.fx.Node) -> tuple[str, str | None] | None:
    if node.op != "call_function" or len(node.kwargs) > 1:
        return None
    if node.target is aten.gelu.default:
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return ("gelu", str(approximate)) if approximate in ("none", "tanh") else None
    return _FUSABLE.get(node.target) if len(node.args) == 1 and not node.kwargs else None


def _linear_candidates(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """addmm(bias, x, t(w)) nodes with float32 CPU tensors, w and bias graph inputs, a 1-d bias."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.addmm.default or node.kwargs:
            continue
        bias, x, wt = node.args
        if not (isinstance(wt, torch.fx.Node) and wt.target is aten.t.default and isinstance(wt.args[0], torch.fx.Node)
                and wt.args[0].op == "placeholder" and isinstance(bias, torch.fx.Node) and bias.op == "placeholder"):
            continue
        vals = [_val(bias), _val(x), _val(wt.args[0]), _val(node)]
        if all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.device.type == "cpu" for v in vals) \
                and vals[0].dim() == 1 and all(isinstance(s, int) for v in vals for s in v.shape):
            out.append(node)
    return out


def linear_onednn_rewrite(gm: torch.fx.GraphModule) -> int:
    """The "linear_onednn" variant's rewrite, in place; returns how many Linears it rewrote."""
    rewritten = 0
    for node in _linear_candidates(gm):
        bias, x, wt = node.args
        weight = wt.args[0]  # type: ignore[union-attr]
        users = list(node.users)
        act = _activation(users[0]) if len(users) == 1 else None
        target = users[0] if act is not None else node
        attr, algorithm = act if act is not None else ("none", None)
        with gm.graph.inserting_before(target):
            fused = gm.graph.call_function(linear_pointwise, (x, weight, bias, attr, [], algorithm))
        fused.meta["val"] = _val(target)
        target.replace_all_uses_with(fused)
        if target is not node:
            gm.graph.erase_node(target)
        gm.graph.erase_node(node)
        if not wt.users:  # type: ignore[union-attr]
            gm.graph.erase_node(wt)  # type: ignore[arg-type]
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _has_small_convolution(gm: torch.fx.GraphModule) -> bool:
    """Whether a convolution, or a convolution's backward, is computed by Kiln rather than oneDNN."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.convolution.default:
            x, w, out, groups, transposed = _val(node.args[0]), _val(node.args[1]), _val(node), node.args[8], node.args[6]
            backward = False
        elif node.target is aten.convolution_backward.default:
            out, x, w, groups, transposed = _val(node.args[0]), _val(node.args[1]), _val(node.args[2]), node.args[9], node.args[7]
            backward = True
        else:
            continue
        if all(isinstance(v, torch.Tensor) for v in (x, w, out)) and isinstance(groups, int) and \
                conv_layout.small_conv_kind(tuple(x.shape), tuple(w.shape), tuple(out.shape), groups,
                                            bool(transposed), out.dtype, out.device, backward=backward) is not None:
            return True
    return False


def variants_for(gm: torch.fx.GraphModule) -> list[str]:
    """The variants that would compile to something other than the default for this graph."""
    out = ["default"]
    if _linear_candidates(gm):
        out.append("linear_onednn")
    if _has_small_convolution(gm):
        out.append("onednn_convolutions")
    return out


@contextlib.contextmanager
def variant_settings(variant: str | None) -> Iterator[None]:
    """What a variant changes while its graph compiles (the conv limits are in the cache key)."""
    if variant != "onednn_convolutions":
        yield
        return
    names = ("SMALL_CONV_GEMM_MACS", "SMALL_CONV_DEPTHWISE_MACS", "SMALL_CONV_BACKWARD_MACS",
             "SMALL_CONV_BACKWARD_ROWS_PER_CHANNEL")
    saved = {n: getattr(conv_layout, n) for n in names}
    try:
        for n in names:
            setattr(conv_layout, n, 0)
        yield
    finally:
        for n, v in saved.items():
            setattr(conv_layout, n, v)


def _copy(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):  # with the argument's strides, an expanded one's too
        return strided_copy(arg, arg.stride())
    return arg


def time_call(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    """Median seconds of fn on fresh copies of args (copying not timed)."""
    times: list[float] = []
    spent = 0.0
    for run in range(MAX_RUNS + 2):
        copies = [_copy(a) for a in args]
        start = time.perf_counter()
        fn(*copies)
        took = time.perf_counter() - start
        if run >= 2:
            times.append(took)
            spent += took
            if spent > TIMED_SECONDS:
                break
    return statistics.median(times)


class AutotunedGraph:
    """Calls the fastest of its candidates, chosen on the first call (see the module docstring)."""

    def __init__(self, candidates: dict[str, Any], store: Callable[[str], None]) -> None:
        self.candidates = candidates  # variant -> CompiledGraph
        self.store = store
        self.winner: str | None = None
        self.times: dict[str, float] = {}

    def __call__(self, *args: Any) -> tuple:
        if self.winner is None:
            self.choose(args)
        assert self.winner is not None
        return self.candidates[self.winner].fn(*args)

    def artifact_recipe(self) -> Any:
        """The winner's recipe once chosen (kiln.runtime.artifact); before the first call, none."""
        if self.winner is None:
            return None
        return artifact.describe(self.candidates[self.winner].fn)

    def choose(self, args: Sequence[Any]) -> None:
        for name, compiled in self.candidates.items():
            try:
                self.times[name] = time_call(compiled.fn, args)
            except Exception as e:  # noqa: BLE001 - a variant that cannot run is not chosen
                log.artifact("autotune", f"graph variant {name} failed: {type(e).__name__}: {e}")
        if not self.times:
            self.winner = "default"
            return
        self.winner = min(self.times, key=self.times.__getitem__)
        log.artifact("autotune", lambda: "graph variants: " + ", ".join(
            f"{n} {t * 1e6:.1f} us" for n, t in sorted(self.times.items(), key=lambda kv: kv[1]))
            + f" -> {self.winner}")
        self.store(self.winner)


__all__ = ["AutotunedGraph", "VARIANTS", "linear_onednn_rewrite", "variants_for", "variant_settings", "time_call"]
