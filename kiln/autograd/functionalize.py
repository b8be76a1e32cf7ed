"""Functionalization: run a function on C++ FunctionalTensorWrappers so the traced graph has no mutation.

The wrappers turn every in-place op and every view-then-mutate into functional ops (`add_` -> `add`,
`x[0:2].mul_(k)` -> `slice, mul, slice_scatter`) before the dispatch tracer sees them. Afterwards we
read, per input, whether its data was mutated (its new value becomes an extra graph output that the
runtime copies back once) and, per output, whether it aliases an input or another output (the
runtime rebuilds it as a view). PyTorch counterpart: torch/_functorch/_aot_autograd/
collect_metadata_analysis.py and functional_utils.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch

from kiln.autograd.decompose import batch_norm_as_functional
from kiln.autograd.tracer import AtenTracer, is_symbolic
from kiln.errors import Unsupported, VerificationError


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """What the traced function did to one flat input."""

    is_tensor: bool
    requires_grad: bool
    mutates_data: bool = False
    mutates_metadata: bool = False


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """How the runtime produces one flat user output.

    kind: "graph" (a graph output, index `graph_index`), "input" (the input object `base` itself),
    "input_view" (a view of input `base` rebuilt with as_strided), "base" (intermediate base
    `base` itself, a graph output after the user outputs), "base_view" (a view of intermediate
    base `base`), "same_as" (the same object as user output `base`),
    "constant" (`value`, a non-tensor such as None or a Python number).
    """

    kind: str
    base: int | None = None
    graph_index: int | None = None
    requires_grad: bool = False
    value: Any = None
    # size/stride/storage_offset of a view output, as traced (ints or SymInts), then its dtype
    # when that differs from its base's (view_as_complex, view_as_real, view(dtype))
    view: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class FunctionalMeta:
    """Mutation and aliasing facts of one traced function; decides the runtime's epilogue."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]
    num_graph_outputs: int  # user outputs produced by the graph, intermediate bases included
    num_intermediate_bases: int

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, info in enumerate(self.inputs) if info.mutates_data)


class FunctionalSession:
    """Owns the wrappers of one trace: makes placeholders, runs under functionalization, reads back."""

    def __init__(self, tracer: AtenTracer) -> None:
        self.tracer = tracer
        self.wrappers: list[Any] = []  # the functional wrapper per input (or the non-tensor value)
        self.originals: list[Any] = []  # the unwrapped value the placeholder was bound to
        self.visible: list[Any] = []  # what the traced function receives (a clone, see visible_inputs)
        self.initial: list[Any] = []  # the inner value of `visible` before the function ran
        self.duplicate_of: dict[int, int] = {}  # input index -> earlier index of the same tensor

    def add_input(self, name: str, value: Any) -> Any:
        """A placeholder for `value`; returns its wrapper (a leaf requiring grad if `value` does)."""
        node = self.tracer.placeholder(name, value)
        self.originals.append(value)
        self.initial.append(value)
        if isinstance(value, torch.Tensor):
            for j, earlier in enumerate(self.originals[:-1]):
                if earlier is value:
                    # the same tensor passed twice: one wrapper, so a mutation through either
                    # argument is seen through both, and only the first one reports it
                    self.duplicate_of[len(self.originals) - 1] = j
                    self.wrappers.append(self.wrappers[j])
                    self.visible.append(self.visible[j])
                    return self.wrappers[j]
            wrapper = torch._to_functional_tensor(value)
            if value.requires_grad:
                wrapper.requires_grad_(True)
            self.wrappers.append(wrapper)
            self.visible.append(wrapper)
            return wrapper
        if isinstance(value, int) and not is_symbolic(value):
            node.meta["val"] = value  # a static int input: the graph keeps the placeholder unused
        self.wrappers.append(value)
        self.visible.append(value)
        return value

    def visible_inputs(self, clone: frozenset[int] = frozenset()) -> list[Any]:
        """The values the function runs on. Inputs in `clone` (mutated in place while requiring grad:
        in eager they are non-leaf tensors, which autograd lets you mutate) get a traced clone, so
        the in-place op hits a non-leaf and the gradient still reaches the leaf placeholder."""
        for i in sorted(clone - self.duplicate_of.keys()):
            copy = self.wrappers[i].clone()
            self.visible[i] = copy
            self.initial[i] = self.unwrap(copy)
        for i, first in self.duplicate_of.items():
            self.visible[i] = self.visible[first]
        return list(self.visible)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        torch._enable_functionalization(reapply_views=True)
        try:
            with batch_norm_as_functional():
                yield
        finally:
            torch._disable_functionalization()

    def unwrap(self, value: Any) -> Any:
        """The traced (inner) value for a wrapper, with pending view updates applied first."""
        if isinstance(value, torch.Tensor) and torch._is_functional_tensor(value):
            torch._sync(value)
            return torch._from_functional_tensor(value)
        return value

    def input_infos(self) -> tuple[InputInfo, ...]:
        infos = []
        for i, (wrapper, original, start) in enumerate(zip(self.visible, self.originals, self.initial)):
            if not isinstance(original, torch.Tensor):
                infos.append(InputInfo(is_tensor=False, requires_grad=False))
                continue
            if i in self.duplicate_of:
                infos.append(InputInfo(True, original.requires_grad))
                continue
            torch._sync(wrapper)
            inner = torch._from_functional_tensor(wrapper)
            # torch's stubs lack this binding (its metadata sibling is declared)
            has_data_mutation = torch._functionalize_has_data_mutation  # type: ignore[attr-defined]
            mutated = inner is not start or has_data_mutation(wrapper)
            # A data mutation of a strided input (`x[::2].mul_(k)` passed in) leaves a new value
            # with its own strides; the runtime copies it back into the input, so only a change
            # of strides without one is a metadata mutation.
            metadata = (tuple(inner.shape) != tuple(original.shape)
                        or (not mutated and tuple(inner.stride()) != tuple(original.stride())))
            if torch._functionalize_has_metadata_mutation(wrapper) or metadata:
                raise Unsupported("an in-place op changed the shape or strides of a graph input "
                                  "(t_, unsqueeze_, resize_, as_strided_)", kind="input_metadata_mutation",
                                  hint="use the out-of-place op (x = x.t()) instead")
            infos.append(InputInfo(True, original.requires_grad, mutates_data=mutated))
        return tuple(infos)

    def classify_outputs(self, outs: list[Any]) -> tuple[list[OutputInfo], list[Any], list[Any]]:
        """Split user outputs into what the graph returns and what the runtime rebuilds.

        Returns (infos, graph_outputs, intermediate_bases): graph_outputs are the wrappers the graph
        must return for kind "graph"; intermediate_bases are extra wrappers returned after them.
        """
        input_index = {id(w): i for i, w in enumerate(self.visible) if isinstance(w, torch.Tensor)}
        base_index: dict[int, int] = {}
        bases: list[Any] = []
        for out in outs:
            if isinstance(out, torch.Tensor) and id(out) not in input_index:
                base = out._base
                if base is not None and id(base) not in input_index and _shares_with_other(out, base, outs):
                    if id(base) not in base_index:
                        base_index[id(base)] = len(bases)
                        bases.append(base)
        seen: dict[int, int] = {}
        infos: list[OutputInfo] = []
        graph_outputs: list[Any] = []
        for k, out in enumerate(outs):
            if not isinstance(out, torch.Tensor):
                if is_symbolic(out):
                    infos.append(OutputInfo("graph", graph_index=len(graph_outputs)))
                    graph_outputs.append(out)
                else:
                    infos.append(OutputInfo("constant", value=out))
                continue
            grad = out.requires_grad
            if id(out) in seen:
                infos.append(OutputInfo("same_as", base=seen[id(out)], requires_grad=grad))
                continue
            seen[id(out)] = k
            if id(out) in input_index:
                infos.append(OutputInfo("input", base=input_index[id(out)], requires_grad=grad))
                continue
            if id(out) in base_index:
                infos.append(OutputInfo("base", base=base_index[id(out)], requires_grad=grad))
                continue
            view: tuple[Any, ...] = (tuple(out.shape), tuple(out.stride()), out.storage_offset())
            base = out._base
            if base is not None and base.dtype != out.dtype:
                # view_as_complex / view_as_real / view(dtype): as_strided cannot change the dtype,
                # so the view records it and the runtime reinterprets the base first; a base whose
                # layout cannot be reinterpreted gives a copy instead (aliasing lost, values kept).
                if not _reinterpretable(base, out.dtype):
                    infos.append(OutputInfo("graph", graph_index=len(graph_outputs), requires_grad=grad))
                    graph_outputs.append(out)
                    continue
                view = (*view, out.dtype)
            if base is not None and id(base) in input_index:
                infos.append(OutputInfo("input_view", base=input_index[id(base)], requires_grad=grad,
                                        view=view))
            elif base is not None and id(base) in base_index:
                infos.append(OutputInfo("base_view", base=base_index[id(base)], requires_grad=grad,
                                        view=view))
            else:
                infos.append(OutputInfo("graph", graph_index=len(graph_outputs), requires_grad=grad))
                graph_outputs.append(out)
        return infos, graph_outputs, bases


def _reinterpretable(base: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `base.view(dtype)` works: same element size, or a unit-stride last dim whose size
    (and every other stride) the size ratio divides."""
    old, new = base.dtype.itemsize, dtype.itemsize
    if old == new:
        return True
    if base.dim() == 0 or base.stride(-1) != 1:
        return False
    if new < old:
        return True
    ratio = new // old
    return all(isinstance(s, int) and s % ratio == 0 for s in (*base.stride()[:-1], base.shape[-1]))


def _shares_with_other(out: torch.Tensor, base: torch.Tensor, outs: list[Any]) -> bool:
    """A view output needs its base returned only if another output aliases the same base."""
    for other in outs:
        if other is out or not isinstance(other, torch.Tensor):
            continue
        if other is base or other._base is base:
            return True
    return False


_STAGE = "aot_autograd"  # the producer named by a VerificationError of this seam


def functionalize_fresh_fills(gm: torch.fx.GraphModule) -> None:
    """An in-place op on a tensor that nothing else reads, made inside the graph by an op that
    returns new memory (`empty_like(x).fill_(1).sub_(y)`, left by a decomposition that ran below
    functionalization), becomes its out-of-place variant: the same values, and the graph keeps the
    no-mutation promise. Done in program order, so a chain of such updates unrolls link by link."""
    changed = False
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        fresh = node.args[0]
        if not _returns_new_memory(fresh) or len(fresh.users) != 1:
            continue
        name = target._schema.name.split("::")[-1]
        packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
        functional = getattr(packet, target._overloadname, None) if packet is not None else None
        if isinstance(functional, torch._ops.OpOverload) and not functional._schema.is_mutable:
            node.target = functional
            changed = True
    if changed:
        gm.recompile()


def _returns_new_memory(node: torch.fx.Node) -> bool:
    """A functional ATen op whose result aliases none of its arguments (not a view, not an input)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def verify_aten_graph(gm: torch.fx.GraphModule) -> None:
    """The promise of the autograd -> lower seam, checked: ATen overloads (or getitem and symbolic
    arithmetic) only, none mutating, every value traced (`meta["val"]`), a tuple returned.
    Runs on every graph before a compiler sees it (one pass over the nodes); raises VerificationError
    naming the first offending node."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        if node.op == "output":
            if not isinstance(node.args[0], tuple):
                raise VerificationError(_STAGE, f"ATen graph must return a tuple, returns {node.args[0]!r}")
            continue
        if node.op != "call_function":
            raise VerificationError(_STAGE, f"ATen graph node {node.name} is a {node.op}; "
                                            "only call_function is allowed")
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                raise VerificationError(_STAGE, f"ATen graph node {node.name} mutates its input ({target})")
        elif getattr(target, "__module__", None) not in ("_operator", "torch", "math"):  # math: floor/ceil of a float
            raise VerificationError(_STAGE, f"ATen graph node {node.name} calls {target}, not an ATen overload")
        if "val" not in node.meta:
            raise VerificationError(_STAGE, f"ATen graph node {node.name} has no traced value (meta['val'])")
