"""Decomposition tables for the AOT tracer, and the batch-norm rewrite functionalization needs.

`native_batch_norm` updates its running statistics without declaring the mutation in its schema,
so functionalization cannot see it: the update would silently vanish from the graph. We route
batch norm through `_native_batch_norm_legit`, whose schema marks running_mean/var as mutated
(functionalization turns it into `_native_batch_norm_legit_functional` and an input mutation).
Eager's update of the running statistics leaves their version counters alone (the op is neither an
in-place nor an out= op, so autograd does not count it); the rewrite reports the update to its
`untracked` hook so that the runtime's copy back does not count it either.
Tables: `resolve_decompositions(None | "core" | table)` -> {OpOverload: fn} for the AOT tracer.
PyTorch counterpart: torch/_decomp (the tables) and aot_autograd's pre-dispatch batch-norm handling.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

DecompositionTable = Mapping[Any, Callable]

# Around an op that updates the given tensors the way eager's batch norm updates its running
# statistics: in place, without moving their version counters (see kiln.autograd.functionalize).
UntrackedUpdate = Callable[[Sequence[torch.Tensor]], ContextManager[None]]


def _no_hook(tensors: Sequence[torch.Tensor]) -> ContextManager[None]:
    return contextlib.nullcontext()


def _batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                training: bool, momentum: float, eps: float, untracked: UntrackedUpdate = _no_hook) -> torch.Tensor:
    """Batch norm through ops whose schemas tell functionalization what they mutate."""
    if training:
        if running_mean is None or running_var is None:
            return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)[0]
        if isinstance(momentum, torch.SymFloat):
            return _batch_norm_symbolic_momentum(input, weight, bias, running_mean, running_var,
                                                 momentum, eps, untracked)
        with untracked((running_mean, running_var)):
            return aten._native_batch_norm_legit.default(
                input, weight, bias, running_mean, running_var, True, momentum, eps)[0]
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean must be defined in evaluation mode")  # eager's error
    return aten._native_batch_norm_legit_no_training.default(
        input, weight, bias, running_mean, running_var, momentum, eps)[0]


def _batch_norm_symbolic_momentum(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                                  running_mean: torch.Tensor, running_var: torch.Tensor,
                                  momentum: Any, eps: float, untracked: UntrackedUpdate) -> torch.Tensor:
    """Training batch norm whose momentum is a symbolic float (BatchNorm's cumulative average,
    `1 / num_batches_tracked`): the ATen op takes its momentum as a Python number, which would
    guard the value (a recompile per call), so the normalization runs without statistics and the
    running statistics' update is spelled out with the momentum as a graph value, as eager's
    kernel computes it: running = momentum * batch + (1 - momentum) * running, the variance
    unbiased."""
    out, mean, _ = aten._native_batch_norm_legit.no_stats(input, weight, bias, True, 0.0, eps)
    dims = [0, *range(2, input.dim())]
    with torch.no_grad():
        batch_var = torch.var(input.detach(), dims, correction=1)
        new_mean = mean.detach() * momentum + running_mean * (1.0 - momentum)
        new_var = batch_var * momentum + running_var * (1.0 - momentum)
        with untracked((running_mean, running_var)):
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
    return out


def _functional_batch_norm(input, running_mean, running_var, weight=None, bias=None,
                           training=False, momentum=0.1, eps=1e-5, *, untracked=_no_hook):
    if training:
        size = input.shape
        reduced = size[0]
        for s in size[2:]:
            reduced = reduced * s
        if isinstance(reduced, int) and reduced == 1:
            # eager's F.batch_norm raises this exact error; keep it so exceptions match
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, untracked)


def _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                      cudnn_enabled=True, *, untracked=_no_hook):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, untracked)


def _torch_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                         eps, cudnn_enabled=True):
    """Instance norm is batch norm over a (1, b*c, ...) view with running stats repeated b times;
    eager then writes the mean over b back into the running stats. Spelled out here so the update
    goes through functionalization instead of hiding in native_batch_norm."""
    b, c = input.shape[0], input.shape[1]
    folded = input.reshape(1, b * c, *input.shape[2:])
    repeat = [None if t is None else t.repeat(b) for t in (weight, bias, running_mean, running_var)]
    out = _batch_norm(folded, *repeat, use_input_stats, momentum, eps)
    for stat, repeated in ((running_mean, repeat[2]), (running_var, repeat[3])):
        if stat is not None:
            with torch.no_grad():
                stat.copy_(repeated.view(b, c).mean(0))
    return out.view(input.shape)


def _functional_instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                              use_input_stats=True, momentum=0.1, eps=1e-5):
    if use_input_stats:
        spatial = 1
        for s in input.shape[2:]:
            spatial = spatial * s
        if isinstance(spatial, int) and spatial == 1:
            raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                             f"{list(input.shape)}")
    return _torch_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
                                momentum, eps)


def _one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """one_hot with a given class count, as eager's CPU kernel computes it (zeros, then a scatter).

    ATen's composite checks the values' range with `.item()` first, which a traced tensor cannot
    answer; the scatter's index check raises on the same inputs (a value below 0 or at least
    num_classes), with the scatter's message. (torch.compile's trace takes ATen's fake-tensor path,
    an `eq` against an arange, which gives a row of zeros for such a value instead of the error.)
    An inferred class count (-1) depends on the data: the original op, which breaks the graph."""
    if (num_classes <= 0 or tensor.dtype != torch.long or tensor.is_sparse
            or tensor.numel() == 0):
        return F.one_hot(tensor, num_classes)  # eager's own errors and its empty-tensor result
    out = torch.zeros((*tensor.shape, num_classes), dtype=torch.long, device=tensor.device)
    return out.scatter_(-1, tensor.unsqueeze(-1), 1)


class _BatchNormRewrite(TorchFunctionMode):
    """Catches, at the torch level above autograd and functionalization, the calls whose ATen path
    would hide something from the AOT tracer: batch and instance norm (their running statistics'
    update) and one_hot (its data-dependent range check)."""

    table = {F.batch_norm: _functional_batch_norm, torch.batch_norm: _torch_batch_norm,
             F.instance_norm: _functional_instance_norm, torch.instance_norm: _torch_instance_norm,
             F.one_hot: _one_hot}
    # instance norm's running statistics are written by a visible copy_ (eager counts it too)
    reports_untracked = frozenset({F.batch_norm, torch.batch_norm})

    def __init__(self, untracked: UntrackedUpdate) -> None:
        super().__init__()
        self.untracked = untracked

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        replacement = self.table.get(func)
        if replacement is None:
            return func(*args, **kwargs)
        if func in self.reports_untracked:
            return replacement(*args, untracked=self.untracked, **kwargs)
        return replacement(*args, **kwargs)


@contextlib.contextmanager
def batch_norm_as_functional(untracked: UntrackedUpdate = _no_hook) -> Iterator[None]:
    """While active, every batch norm call goes through `_native_batch_norm_legit*`; `untracked`
    is entered around each update of running statistics."""
    with _BatchNormRewrite(untracked):
        yield


# Kiln's own decompositions, always on in the AOT tracer; an entry returns NotImplemented when it
# does not apply, and the op is recorded as is.
KILN_DECOMPOSITIONS: dict[Any, Callable] = {}


def register_decomposition(*ops: Any) -> Callable[[Callable], Callable]:
    """Put a function in KILN_DECOMPOSITIONS for each of `ops` (the decorator the table is filled by)."""
    def register(fn: Callable) -> Callable:
        for op in ops:
            KILN_DECOMPOSITIONS[op] = fn
        return fn
    return register


def _example(x: int | torch.SymInt) -> int | None:
    """x's value at the example inputs (a symbol's hint; None without one), read without a guard."""
    if isinstance(x, int):
        return x
    hint = getattr(x.node, "hint", None)
    return hint if isinstance(hint, int) else None


def _memory_order(t: torch.Tensor) -> list[int] | None:
    """The permutation making `t` contiguous, if it is a dense non-overlapping permuted layout.
    Decided on the example's sizes and strides without guards: with symbolic sizes the layout's
    family (a transpose of dense sizes) is what the input guards keep, and the order only decides
    which element each draw lands on (eager's masks under kiln.config.fallback_random)."""
    sizes, strides = [_example(s) for s in t.shape], [_example(s) for s in t.stride()]
    if any(v is None for v in (*sizes, *strides)):
        return None
    order = sorted(range(t.dim()), key=lambda d: (-strides[d], -d))  # type: ignore[operator]
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return None
        expected *= sizes[d]  # type: ignore[operator]
    return order


def _is_sorted(dims: list[int]) -> bool:
    return dims == sorted(dims)


def _draw_in_memory_order(op: Any, self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    order = _memory_order(self)
    # Size-1 dims have any stride and take no part in the order elements are drawn in: only the
    # others must be permuted (otherwise a (1, C, 1, 1) noise tensor permutes forever).
    if order is None or _is_sorted([d for d in order if _example(self.shape[d]) != 1]):
        return NotImplemented
    inverse = [order.index(d) for d in range(self.dim())]
    return op(self.permute(order), *args, **kwargs).permute(inverse)


@register_decomposition(aten.bernoulli.p)
def bernoulli_p(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Eager dropout is `empty_like(x).bernoulli_(p)`: it draws in the memory order of x's layout.
    Functionalization turns it into `bernoulli.p`, which allocates a contiguous output and draws
    in logical order; for a transposed x the masks would differ from eager's under the same seed.
    Drawing on the permuted-contiguous view and permuting back keeps eager's masks."""
    return _draw_in_memory_order(aten.bernoulli.p, self, *args, **kwargs)


@register_decomposition(aten.bernoulli.default)
def bernoulli_default(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Same as bernoulli_p, for probabilities given as a tensor."""
    return _draw_in_memory_order(aten.bernoulli.default, self, *args, **kwargs)


@register_decomposition(getattr(aten.random, "from"))
def random_from(self: torch.Tensor, low: Any, high: Any = None, *, generator: Any = None) -> Any:
    """`x.random_(low, high)` is functionalized to `aten.random.from`, whose overload name is a
    Python keyword: torch.fx prints `torch.ops.aten.random.from(...)`, code that does not parse, and
    the frame fell back to eager. `randint_like(x, low, high)` is eager's `empty_like(x).random_(low,
    high)`: the same draws into the same layout, under a name that prints. (Without `high`, or
    with a generator, the op stays as it is.)"""
    if high is None or generator is not None:
        return NotImplemented
    return aten.randint_like.low_dtype(self, low, high)


def core_aten_decompositions() -> dict[Any, Callable]:
    """PyTorch's Core ATen table plus the entries the lowering wants and the core table lacks."""
    from torch._decomp import core_aten_decompositions as core, get_decompositions

    table = dict(core())
    table.update(get_decompositions([
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit.no_stats,
    ]))
    return table


def resolve_decompositions(decompositions: str | DecompositionTable | None) -> dict[Any, Callable]:
    """None -> no decomposition (ATen as autograd leaves it); "core" -> Core ATen; a table -> itself."""
    if decompositions is None:
        return {}
    if isinstance(decompositions, str):
        if decompositions != "core":
            raise ValueError(f"unknown decomposition set {decompositions!r}; use 'core' or a table")
        return core_aten_decompositions()
    return dict(decompositions)
