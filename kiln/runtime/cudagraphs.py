"""mode="reduce-overhead": compiled graphs replayed as CUDA graphs, with cudagraph-tree semantics.

`CudaGraphed(fn, pool=...)` wraps one compiled graph (a forward or a backward wrapper of kiln.lower).
Per distinct input signature (shapes, strides, dtypes, int arguments) it runs eagerly once (warm-up:
lazy initialisation, first-call allocations), then records `fn` into a CUDA graph over static copies
of its inputs, and from then on copies the new inputs in and replays. Parameters (and inputs named
static) are read in place: their addresses are recorded and checked at each replay. The forward and
the backward of one compiled frame allocate from one memory pool (`new_pool()`). The outputs handed
out are views of the graph's own memory, which the next replay of the same recording overwrites: the
old ones are then poisoned, and reading one raises an error saying to clone it, as torch's does.
A graph is not recorded (with the reason under KILN_LOGS=cudagraphs, and `fn` runs as before) for
CPU tensors, inputs it mutates, ops that sync with the host or draw random numbers, or more
signatures than `MAX_RECORDINGS`. Corresponds to torch/_inductor/cudagraph_trees.py.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kiln import log
from kiln.runtime.overlap import copy_into, may_overlap

MAX_RECORDINGS = 8  # distinct input signatures recorded per graph before it stops recording
STALE_OUTPUT = ("kiln: this tensor is an output of a compiled function run as a CUDA graph "
                "(mode='reduce-overhead'), and a later call of that function has overwritten it. "
                "Clone outputs you keep across calls (`out = fn(x).clone()`), or read them before the next call.")


def new_pool() -> Any:
    """A memory pool handle for the recordings of one compiled frame (forward and backward share it)."""
    return torch.cuda.graph_pool_handle()


# what mode="reduce-overhead" (kiln.runtime.plan's cuda_graphs) does for a graph on CPU tensors, in words
SKIPPED_ON_CPU = ("mode='reduce-overhead' records CUDA graphs only for CUDA tensors; on CPU the graph runs "
                  "through the native wrapper instead (one C++ function per graph: kiln.runtime.native)")


def _poisoner() -> Callable[[torch.Tensor, str], None] | None:
    # a CUDA build of torch can make a tensor's storage raise on access with a message of ours
    return getattr(torch._C, "_set_storage_access_error_msg", None)


@dataclass
class _Recording:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[Any]  # the graph's input tensors: static copies, or the caller's own for static inputs
    static_ptrs: dict[int, int]  # input position -> data_ptr the graph reads in place
    outputs: tuple[Any, ...]
    handed_out: list[torch.Tensor] = field(default_factory=list)
    replays: int = 0
    # static copies whose elements share memory (an expanded input): filled by overlap.copy_into,
    # as copy_ refuses to write such a tensor
    shared: frozenset[int] = frozenset()


_LIVE: "weakref.WeakSet[CudaGraphed]" = weakref.WeakSet()


def live_graphs() -> list["CudaGraphed"]:
    """Every CudaGraphed still alive (tests and reports read their recordings and replay counts)."""
    return list(_LIVE)


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else
                 ("value", a) for a in args)


class CudaGraphed:
    """`fn` recorded as CUDA graphs per input signature and replayed (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, name: str, pool: Any = None,
                 static_inputs: frozenset[int] = frozenset(), max_recordings: int = MAX_RECORDINGS) -> None:
        self.fn = fn
        self.name = name
        self.pool = pool
        self.static_inputs = static_inputs
        self.max_recordings = max_recordings
        self.recordings: dict[tuple, _Recording] = {}
        self.warmed: set[tuple] = set()
        self.skipped: str | None = None  # why this graph is not recorded (it then just runs `fn`)
        _LIVE.add(self)

    @property
    def replays(self) -> int:
        return sum(r.replays for r in self.recordings.values())

    def _skip(self, reason: str) -> None:
        self.skipped = reason
        log.artifact("cudagraphs", f"{self.name}: not recorded as a CUDA graph: {reason}")

    def _refusal(self, args: Sequence[Any]) -> str | None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type != "cuda" for t in tensors):
            return "it has CPU tensors (a CUDA graph replays GPU work only)"
        program = getattr(self.fn, "program", None)
        if program is not None and getattr(program.ir, "seed_needed", False):
            return "it draws random numbers (the seed would be recorded into the graph and repeat)"
        if _poisoner() is None:
            return "this torch build cannot mark overwritten outputs (torch._C._set_storage_access_error_msg)"
        return None

    def __call__(self, *args: Any) -> Any:
        if self.skipped is None:
            reason = self._refusal(args)
            if reason is not None:
                self._skip(reason)
        if self.skipped is not None:
            return self.fn(*args)
        key = _signature(args)
        rec = self.recordings.get(key)
        if rec is not None and any(args[i].data_ptr() != p for i, p in rec.static_ptrs.items()):
            log.artifact("cudagraphs", f"{self.name}: a static input moved; recording again")
            del self.recordings[key]
            rec = None
        if rec is None:
            if key not in self.warmed:
                return self._warm_up(key, args)
            if len(self.recordings) >= self.max_recordings:
                self._skip(f"more than {self.max_recordings} distinct input shapes")
                return self.fn(*args)
            rec = self._record(key, args)
            if rec is None:
                return self.fn(*args)
        return self._replay(rec, args)

    def _warm_up(self, key: tuple, args: Sequence[Any]) -> Any:
        """The first call of a signature runs eagerly; an input it mutates rules recording out
        (a replay would write into the static copy, not into the caller's tensor)."""
        versions = {i: a._version for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        out = self.fn(*args)
        mutated = [i for i, v in versions.items() if args[i]._version != v and i not in self.static_inputs
                   and not isinstance(args[i], torch.nn.Parameter)]
        if mutated:
            self._skip(f"it mutates input(s) {mutated}, which are not static")
        self.warmed.add(key)
        return out

    def _is_static(self, i: int, a: Any) -> bool:
        return i in self.static_inputs or isinstance(a, torch.nn.Parameter)

    def _record(self, key: tuple, args: Sequence[Any]) -> _Recording | None:
        inputs: list[Any] = []
        static_ptrs: dict[int, int] = {}
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                inputs.append(a)
            elif self._is_static(i, a):
                inputs.append(a)
                static_ptrs[i] = a.data_ptr()
            else:
                inputs.append(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn(*inputs)
        except RuntimeError as e:  # a host sync (.item(), nonzero) cannot be captured
            torch.cuda.synchronize()
            self._skip(f"an op syncs with the host while recording ({str(e).splitlines()[0][:120]})")
            return None
        shared = frozenset(i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and i not in static_ptrs
                           and may_overlap(tuple(a.shape), a.stride()))
        rec = _Recording(graph, inputs, static_ptrs, tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,),
                         shared=shared)
        self.recordings[key] = rec
        log.artifact("cudagraphs", f"{self.name}: recorded signature #{len(self.recordings)} "
                                   f"({', '.join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))})")
        return rec

    def _replay(self, rec: _Recording, args: Sequence[Any]) -> tuple:
        poison = _poisoner()
        assert poison is not None
        # inputs first: one may be an output of the previous replay (`x = f(x)` in a loop)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in rec.static_ptrs:
                if i in rec.shared:
                    copy_into(rec.inputs[i], a)
                else:
                    rec.inputs[i].copy_(a)
        for t in rec.handed_out:  # what the previous replay returned is about to be overwritten
            poison(t, STALE_OUTPUT)
        rec.handed_out = []
        rec.graph.replay()
        rec.replays += 1
        return tuple(self._hand_out(rec, o, args) for o in rec.outputs)

    def _hand_out(self, rec: _Recording, out: Any, args: Sequence[Any]) -> Any:
        """A fresh view of an output's memory (the one that gets poisoned later), or the caller's own
        tensor when the output is one of the inputs."""
        if not isinstance(out, torch.Tensor):
            return out
        base = out.untyped_storage().data_ptr()
        for i, a in enumerate(rec.inputs):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == base:
                user = args[i]  # the same place in the caller's tensor (ours may start elsewhere in its storage)
                return user.as_strided(out.shape, out.stride(),
                                       user.storage_offset() + out.storage_offset() - a.storage_offset())
        storage = torch._C._construct_storage_from_data_pointer(base, out.device, out.untyped_storage().nbytes())
        view = torch.empty((), dtype=out.dtype, device=out.device).set_(storage, out.storage_offset(), out.shape,
                                                                         out.stride())
        rec.handed_out.append(view)
        return view


def wrap_compiler(compiler: Callable[..., Any], pool_holder: dict[str, Any], name: str) -> Callable[..., Any]:
    """A fw/bw compiler whose compiled graphs on CUDA tensors replay as CUDA graphs; the two halves of
    one frame share the pool made on first use (`pool_holder`)."""
    def compile_with_cudagraphs(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        compiled = compiler(gm, example_inputs)
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        if not tensors or tensors[0].device.type != "cuda":
            log.artifact("cudagraphs", f"{name}: {SKIPPED_ON_CPU}")
            return compiled
        if "pool" not in pool_holder:
            pool_holder["pool"] = new_pool()
        return CudaGraphed(compiled, name=f"{name} graph", pool=pool_holder["pool"])
    return compile_with_cudagraphs
