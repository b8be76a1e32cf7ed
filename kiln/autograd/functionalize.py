"""Functionalization: run a function on C++ FunctionalTensorWrappers so the traced graph has no mutation.

The wrappers turn every in-place op and every view-then-mutate into functional ops (`add_` -> `add`,
`x[0:2].mul_(k)` -> `slice, mul, slice_scatter`) before the dispatch tracer sees them. Afterwards we
read, per input, whether its data was mutated (its new value becomes an extra graph output that the
runtime copies back once) and, per output, whether it aliases an input or another output (the
runtime replays its view ops on the real base, kiln.runtime.views). PyTorch counterpart:
torch/_functorch/_aot_autograd/collect_metadata_analysis.py and functional_utils.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Sequence

import operator

import sympy
import torch
import torch.fx as fx

from kiln.autograd.decompose import batch_norm_as_functional
from kiln.autograd.tracer import AtenTracer, expr_of, is_symbolic, size_hint
from kiln.autograd.trace_modes import (_AsStridedFromBase, _DataAliasUpdates, _expression, _expressions, _InputLayouts,
                                      _IntermediateLayouts, _LayoutUpdates, _same_expressions, _storage)
from kiln.errors import Unsupported, VerificationError
from kiln.runtime.views import UNREADABLE, ViewStep, apply_chain, replays_on, view_steps
from kiln.symbolic.node import sym_floordiv


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """What the traced function did to one flat input."""

    is_tensor: bool
    requires_grad: bool
    mutates_data: bool = False
    mutates_metadata: bool = False
    steps: tuple[ViewStep, ...] | None = None  # a metadata mutation: the view ops that make it
    # every data mutation was one eager does not count in the version counter (batch norm's update
    # of its running statistics): the runtime's copy back leaves the counter where it was
    untracked: bool = False
    # how many in-place ops eager applies to the input, through any view of it, its layout
    # changes (t_, squeeze_ of a view) included: its version counter moves by that many (the
    # runtime's one copy back and its one re-layout move it by one each, then the rest)
    version_bumps: int = 0
    # the input was given another storage (`w.data = v`, recorded as set_ under no_grad): the
    # runtime gives the caller's tensor the new value's storage, as eager's shallow copy does, not
    # a copy of its elements (a tensor sharing v's storage must see w's later updates, and w v's)
    storage_set: bool = False


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """How the runtime produces one flat user output.

    kind: "graph" (a graph output, index `graph_index`), "input" (the input object `base` itself),
    "input_view" (a view of input `base`, its view ops replayed), "base" (intermediate base
    `base` itself, a graph output after the user outputs), "base_view" (a view of intermediate
    base `base`), "same_as" (the same object as user output `base`),
    "constant" (`value`, a non-tensor such as None or a Python number).
    """

    kind: str
    base: int | None = None
    graph_index: int | None = None
    requires_grad: bool = False
    value: Any = None
    # the view ops from the base to a view output (kiln.runtime.views), replayed on the real base
    steps: tuple[ViewStep, ...] | None = None
    # a "graph" output that eager gives as an autograd view (of an intermediate nothing else returns):
    # the runtime leaves a wrapper's view as it is only for these (kiln.runtime.aot.not_views)
    view: bool = False
    # a view made with grad mode off of a base that requires grad (`with torch.no_grad(): v = x[1:]`):
    # eager's is a leaf without history, so the runtime replays its view ops under no_grad
    no_grad: bool = False


@dataclasses.dataclass(frozen=True)
class FunctionalMeta:
    """Mutation and aliasing facts of one traced function; decides the runtime's epilogue."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]
    num_graph_outputs: int  # user outputs produced by the graph, intermediate bases included
    num_intermediate_bases: int
    # (graph output position, n): eager's tensor was updated in place n times (`y = x * 2; y.add_(1)`)
    output_versions: tuple[tuple[int, int], ...] = ()

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, info in enumerate(self.inputs) if info.mutates_data)

    @property
    def untracked_mutations(self) -> tuple[int, ...]:
        return tuple(i for i, info in enumerate(self.inputs) if info.mutates_data and info.untracked)

    @property
    def storage_sets(self) -> tuple[int, ...]:
        return tuple(i for i, info in enumerate(self.inputs) if info.mutates_data and info.storage_set)

    @property
    def extra_version_bumps(self) -> tuple[tuple[int, int], ...]:
        """(input index, bumps beyond the copy back's one) for inputs that eager updates in place more
        than once: add_ then mul_ moves the version counter by two."""
        extra = []
        for i, info in enumerate(self.inputs):
            done = int(info.mutates_data and not info.untracked) + int(info.mutates_metadata)
            if not info.untracked and info.version_bumps > done:
                extra.append((i, info.version_bumps - done))
        return tuple(extra)

    @property
    def metadata_mutations(self) -> tuple[tuple[int, tuple[ViewStep, ...]], ...]:
        return tuple((i, info.steps) for i, info in enumerate(self.inputs)
                     if info.mutates_metadata and info.steps is not None)


class FunctionalSession:
    """Owns the wrappers of one trace: makes placeholders, runs under functionalization, reads back."""

    def __init__(self, tracer: AtenTracer) -> None:
        self.tracer = tracer
        self.wrappers: list[Any] = []  # the functional wrapper per input (or the non-tensor value)
        self.originals: list[Any] = []  # the unwrapped value the placeholder was bound to
        self.visible: list[Any] = []  # what the traced function receives (a clone, see visible_inputs)
        self.initial: list[Any] = []  # the inner value of `visible` before the function ran
        self.duplicate_of: dict[int, int] = {}  # input index -> earlier index of the same tensor
        self._watch: list[int] | None = None  # inputs whose layout a new value may lose
        self._seen: dict[int, int] = {}  # watched input -> its storage's mutation count, last looked at
        self._as_strided: set[int] = set()  # inputs an as_strided view was taken of
        # functional storage -> the mutations of it that eager leaves out of the version counter
        self._untracked: dict[int | None, int] = {}
        # functional storage -> the updates this session made itself (a layout given back)
        self._internal: dict[int | None, int] = {}
        # functional storage -> the in-place layout changes of it or its views (see _LayoutUpdates)
        self._layout_updates: dict[int | None, int] = {}

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
            self._keep_layout(i)  # a clone of a strided input is contiguous; eager mutates the input
            self.initial[i] = self.unwrap(copy)
        for i, first in self.duplicate_of.items():
            self.visible[i] = self.visible[first]
        return list(self.visible)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        torch._enable_functionalization(reapply_views=True)
        try:
            layouts = _InputLayouts(self) if self._watched() else contextlib.nullcontext()
            with batch_norm_as_functional(self.untracked_update), _DataAliasUpdates(self), layouts, \
                    _IntermediateLayouts(self), _AsStridedFromBase(), _LayoutUpdates(self):
                yield
        except RuntimeError as exc:
            if "mutated that has internal overlap" not in str(exc):
                raise
            # eager updates such a view element by element (unfold, expand: an element counted
            # twice takes both updates); the functional form cannot say so
            raise Unsupported("an in-place update of a view whose elements overlap (unfold, expand)",
                              kind="overlapping_write", hint="clone() the view before updating it") from exc
        finally:
            torch._disable_functionalization()

    @contextlib.contextmanager
    def untracked_update(self, tensors: Sequence[torch.Tensor]) -> Iterator[None]:
        """Count the mutations the enclosed op makes of `tensors`' storages as untracked ones."""
        wrappers = {_storage(t): t for t in tensors if torch._is_functional_tensor(t)}
        before = {key: torch._functionalize_mutation_counter(t) for key, t in wrappers.items()}
        yield
        for key, t in wrappers.items():
            made = torch._functionalize_mutation_counter(t) - before[key]
            self._untracked[key] = self._untracked.get(key, 0) + made

    def note_as_strided(self, t: torch.Tensor) -> None:
        """An as_strided view of an input's memory: its offset and strides address the input's
        storage, which a graph value replacing the input does not have (see input_infos)."""
        storage = _storage(t)
        for i in self._watched():
            if _storage(self.visible[i]) == storage:
                self._as_strided.add(i)

    def keep_layouts(self) -> None:
        """Give each watched input whose functional value was replaced since the last look its own
        layout back (see _InputLayouts)."""
        for i in self._watched():
            count = torch._functionalize_mutation_counter(self.visible[i])
            if self._seen.get(i) != count:
                self._keep_layout(i)
                self._seen[i] = torch._functionalize_mutation_counter(self.visible[i])

    def _watched(self) -> list[int]:
        if self._watch is None:
            # a contiguous input at offset 0 has the layout of its new values; the others may not
            self._watch = [i for i, v in enumerate(self.originals) if isinstance(v, torch.Tensor)
                           and i not in self.duplicate_of and v.layout == torch.strided
                           and not (_row_major(v) and _expression(v.storage_offset()) == 0)]
        return self._watch

    def _keep_layout(self, i: int) -> None:
        wrapper, original = self.visible[i], self.originals[i]
        if torch._functionalize_has_metadata_mutation(wrapper):
            return  # t_, unsqueeze_ ...: the new layout is eager's, the runtime sets it
        torch._sync(wrapper)
        inner = torch._from_functional_tensor(wrapper)
        if inner.dim() != original.dim() or not _same_expressions(inner.shape, original.shape) \
                or _same_expressions(inner.stride(), original.stride()):
            return
        # The same value with the input's strides: a new fake that the tracer takes for the node
        # of the replaced value, so the graph gains no op and later ops see eager's layout.
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
            restrided = torch.empty_strided(original.shape, original.stride(), dtype=inner.dtype,
                                            device=inner.device)
        self.tracer.alias_value(restrided, inner)
        self._replace_internally(wrapper, restrided)

    def keep_intermediate_layout(self, base: torch.Tensor, strides: list[Any]) -> None:
        """Give an intermediate (not an input) updated in place, itself or through a view, the
        strides it had before (see _IntermediateLayouts): a traced copy into a tensor of those."""
        torch._sync(base)
        inner = torch._from_functional_tensor(base)
        if len(strides) != inner.dim() or _expressions(inner.stride()) == _expressions(strides):
            return
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
            restrided = torch.ops.aten.empty_strided.default(inner.shape, strides, dtype=inner.dtype,
                                                             device=inner.device)
            restrided = torch.ops.aten.copy.default(restrided, inner)
        self._replace_internally(base, restrided)

    def _replace_internally(self, wrapper: torch.Tensor, value: torch.Tensor) -> None:
        """Make `value` the wrapper's value (a layout given back): the updates this counts are the
        session's own, left out of the input's version bumps."""
        before = torch._functionalize_mutation_counter(wrapper)
        torch._functionalize_replace(wrapper, value)
        torch._functionalize_commit_update(wrapper)
        torch._sync(wrapper)
        made = torch._functionalize_mutation_counter(wrapper) - before
        self._internal[_storage(wrapper)] = self._internal.get(_storage(wrapper), 0) + made

    def eager_version(self, t: torch.Tensor) -> int:
        """Eager's version counter of `t`: its storage's in-place updates (layout changes too), less
        this session's own and the untracked ones."""
        key = _storage(t)
        made = torch._functionalize_mutation_counter(t) - self._internal.get(key, 0) - self._untracked.get(key, 0)
        return made + self._layout_updates.get(key, 0)

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
            # untracked: each of the storage's updates was one eager hides from autograd (the
            # counter counts every update, from 0 when the wrapper was made)
            storage = _storage(wrapper)
            updates = torch._functionalize_mutation_counter(wrapper) - self._internal.get(storage, 0)
            if torch._functionalize_has_metadata_mutation(wrapper) or \
                    not _same_expressions(inner.shape, original.shape):
                mutated = bool(has_data_mutation(wrapper))
                bumps = (updates if mutated else 0) + self._layout_updates.get(storage, 0)
                infos.append(self._metadata_mutation(i, mutated, bumps))
                continue
            if torch._functionalize_was_storage_changed(wrapper):  # type: ignore[attr-defined]  # not in the stubs
                # `w.data = v` (capture's only set_ of a graph input): eager's shallow copy leaves
                # w's version counter where it was
                infos.append(InputInfo(True, original.requires_grad, mutates_data=True, untracked=True,
                                       storage_set=True))
                continue
            # A data mutation of a strided input leaves its strides (see _InputLayouts)
            mutated = inner is not start or has_data_mutation(wrapper)
            if mutated and i in self._as_strided:
                raise _as_strided_of_updated_input()
            untracked = mutated and self._untracked.get(storage, 0) == updates > 0
            bumps = updates - self._untracked.get(storage, 0) if mutated else 0
            infos.append(InputInfo(True, original.requires_grad, mutates_data=mutated, untracked=untracked,
                                   version_bumps=bumps + self._layout_updates.get(storage, 0)))
        return tuple(infos)

    def _metadata_mutation(self, i: int, mutated: bool, bumps: int) -> InputInfo:
        """An input whose sizes or strides an in-place op changed (t_, unsqueeze_, as_strided_): the
        runtime replays the input's own view chain on it and sets the result's layout on the
        caller's tensor (as_strided_), then copies data back. resize_ (recorded without its sizes)
        and inputs that require grad are refused: the frame runs eagerly."""
        original = self.originals[i]
        steps = view_steps(self.visible[i])
        if mutated and i in self._as_strided:
            raise _as_strided_of_updated_input()
        why = None
        if original.requires_grad:
            why = "on an input that requires grad"
        elif not steps or not replays_on(original, steps):
            why = "in a way the runtime cannot replay (resize_)"
        if why is not None:
            raise Unsupported(f"an in-place op changed the shape or strides of a graph input {why}",
                              kind="input_metadata_mutation", hint="use the out-of-place op (x = x.t()) instead")
        return InputInfo(True, False, mutates_data=mutated, mutates_metadata=True, steps=steps, version_bumps=bumps)

    def classify_outputs(self, outs: list[Any]) -> tuple[list[OutputInfo], list[Any], list[Any]]:
        """Split user outputs into what the graph returns and what the runtime rebuilds.

        Aliasing is read from the functional storage a wrapper shares with its views (`_base`
        misses `detach` and `view(dtype)`). Returns (infos, graph_outputs, intermediate_bases):
        graph_outputs are the wrappers the graph must return for kind "graph"; intermediate_bases
        are extra wrappers returned after them: the bases of views that another output shares, or
        whose layout a new buffer cannot have (an offset, a step, a broadcast), so that the runtime
        makes those views on them as eager did.
        """
        input_index = {id(w): i for i, w in enumerate(self.visible) if isinstance(w, torch.Tensor)}
        input_storage = {_storage(w): i for i, w in enumerate(self.visible) if isinstance(w, torch.Tensor)}
        swapped = {_storage(w) for w in self.visible
                   if isinstance(w, torch.Tensor) and torch._functionalize_was_storage_changed(w)}  # type: ignore[attr-defined]
        if any(isinstance(o, torch.Tensor) and id(o) not in input_index and _storage(o) in swapped for o in outs):
            # `w.data = y; return y`: eager's y shares w's new storage as another tensor; the
            # runtime gives w that storage after the graph and cannot return y as an alias of it
            raise Unsupported("an output shares the storage `.data =` gave a graph input",
                              kind="unsupported", hint="return the tensor whose .data was set instead")
        base_index, bases, prefixes = _intermediate_bases(
            [o for o in outs if isinstance(o, torch.Tensor) and id(o) not in input_index
             and _storage(o) not in input_storage], self.tracer)
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
            storage = _storage(out)
            if storage in base_index:
                index = base_index[storage]
                if bases[index] is out:
                    infos.append(OutputInfo("base", base=index, requires_grad=grad))
                    continue
                steps = view_steps(out)[prefixes[index]:]  # from the base the graph returns
                if _replays_to(self.unwrap(bases[index]), steps, self.unwrap(out), layout=True):
                    infos.append(OutputInfo("base_view", base=index, requires_grad=grad, steps=steps,
                                            no_grad=_made_without_grad(out)))
                    continue
            elif storage in input_storage:
                index = input_storage[storage]
                steps = view_steps(out)
                # The chain was recorded on the functional value, whose layout is the input's
                # only until a mutation replaces it (a fresh contiguous tensor): it must also run
                # on the input's own layout, or eager's reshape made a copy there.
                if _replays_to(self.originals[index], steps, out, layout=False):
                    infos.append(OutputInfo("input_view", base=index, requires_grad=grad, steps=steps,
                                            no_grad=_made_without_grad(out)))
                    continue
            infos.append(OutputInfo("graph", graph_index=len(graph_outputs), requires_grad=grad, view=out._is_view()))
            graph_outputs.append(out)
        return infos, graph_outputs, bases


def _made_without_grad(view: torch.Tensor) -> bool:
    """Whether a view output was made under no_grad from a base that requires grad: it requires grad
    (as its base) but has no grad_fn, where a view made with grad on has one."""
    if not view.requires_grad or not view._is_view():
        return False
    try:
        return view.grad_fn is None
    except RuntimeError as exc:
        # autograd refuses the grad_fn of a view made under no_grad whose base an update reached
        # since (through a detached alias, under no_grad as eager's was): it was made without grad
        if "created in no_grad mode" in str(exc):
            return True
        raise


def _as_strided_of_updated_input() -> Unsupported:
    # Inside the graph the input's new value is a fresh tensor: an as_strided view regenerated from
    # it would address that tensor's memory, not the input's storage as in eager.
    return Unsupported("an as_strided view of a graph input that is also updated in place",
                       kind="input_metadata_mutation", hint="index the input (slices, select) instead of as_strided")


def _row_major(t: torch.Tensor) -> bool:
    """Contiguous, decided on the size expressions (no guard); size-1 dims take any stride."""
    dense = sympy.Integer(1)
    for size, stride in zip(reversed(_expressions(t.shape)), reversed(_expressions(t.stride()))):
        if size != 1 and sympy.expand(stride - dense) != 0:
            return False
        dense = dense * size
    return True


def _replays_to(base: torch.Tensor, steps: tuple[ViewStep, ...], target: torch.Tensor, *, layout: bool) -> bool:
    """Whether the chain, run on `base`, gives `target`'s sizes (and, with `layout`, its strides
    and offset): a chain eager could not run on the input's own layout (a reshape that copied
    there) fails, and so does one holding a step recorded without its arguments."""
    try:
        made = apply_chain(base, steps)
    except (RuntimeError, ValueError):  # ValueError: a step recorded without its arguments
        return False
    if not _same_expressions(made.shape, target.shape):
        return False
    return not layout or _same_expressions([*made.stride(), made.storage_offset()],
                                           [*target.stride(), target.storage_offset()])


def _intermediate_bases(outs: list[torch.Tensor], tracer: AtenTracer) -> tuple[dict[int | None, int],
                                                                               list[torch.Tensor], list[int]]:
    """The intermediates the graph returns so that views of them are made at run time: storage ->
    position among the bases, the bases, and how many view ops of the storage's chain each base
    already is. One is needed where several outputs share a storage, or where a view's layout is
    not one a new buffer has. The base is, among the outputs and their `_base`s, the wrapper whose
    chain starts every other's (the storage's own base, or `_unsafe_view` of it, which autograd
    does not count as a view), else the traced value just after a step recorded without its
    arguments (see _after_unreadable); without one the outputs stay graph outputs: the values are
    right, the sharing is lost."""
    groups: dict[int | None, list[torch.Tensor]] = {}
    for out in outs:
        members = groups.setdefault(_storage(out), [])
        if not any(m is out for m in members):
            members.append(out)
    index: dict[int | None, int] = {}
    bases: list[torch.Tensor] = []
    prefixes: list[int] = []
    for storage, members in groups.items():
        # a view made under no_grad of a base that requires grad is a leaf in eager: made at run
        # time on the returned base (with grad off), or its requires_grad has no history to follow
        if storage is None or (len(members) == 1 and (not view_steps(members[0]) or _new_buffer_fits(members[0]))
                               and not _made_without_grad(members[0])):
            continue
        # a base leaves the graph as a new buffer: only one whose layout such a buffer has
        candidates = [c for c in members + [m._base for m in members if m._base is not None]
                      if _storage(c) == storage and (not view_steps(c) or _new_buffer_fits(c))
                      and not _made_without_grad(c)]
        chains = [view_steps(m) for m in members]
        for candidate in sorted(candidates, key=lambda c: len(view_steps(c))):
            prefix = view_steps(candidate)
            if all(_same_steps(chain[:len(prefix)], prefix) for chain in chains):
                index[storage] = len(bases)
                bases.append(candidate)
                prefixes.append(len(prefix))
                break
        else:
            found = _after_unreadable(members, chains, tracer)
            if found is not None:
                index[storage] = len(bases)
                bases.append(found[0])
                prefixes.append(found[1])
    return index, bases, prefixes


def _after_unreadable(members: list[torch.Tensor], chains: list[tuple[ViewStep, ...]],
                      tracer: AtenTracer) -> tuple[torch.Tensor, int] | None:
    """The traced value just after the last step recorded without its arguments (the
    `_unsafe_view` a reshape of a strided tensor ends in), found by walking back from each view's
    traced value through the ops of the rest of its chain; with how many steps it already is.
    Only for views that need no gradient: that value is below autograd."""
    ends = [max((k for k, step in enumerate(chain) if step.meta in UNREADABLE), default=-1) + 1 for chain in chains]
    if any(m.requires_grad for m in members) or len(set(ends)) != 1 or ends[0] == 0:
        return None
    found = None
    for member, chain in zip(members, chains):
        torch._sync(member)
        node = tracer.node_of.get(torch._from_functional_tensor(member))
        for step in reversed(chain[ends[0] - 1:]):
            if isinstance(node, fx.Node) and node.target is operator.getitem:  # one output of unbind, split
                node = node.args[0]
            target = getattr(node, "target", None)
            op = target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else None
            if op is None or not step.meta.startswith(f"{op}_"):
                return None  # not the ops of the chain: give up
            if step is not chain[ends[0] - 1]:
                node = node.args[0]
        value = node.meta.get("val") if isinstance(node, fx.Node) else None
        if found is not None and value is not found:
            return None
        found = value
    return (found, ends[0]) if isinstance(found, torch.Tensor) else None


def _same_steps(a: tuple[ViewStep, ...], b: tuple[ViewStep, ...]) -> bool:
    """Equal chains, sizes compared by expression (== on SymInts would add a guard). The chains of
    one storage share their first steps; a step recorded without its arguments (`_unsafe_view`,
    kiln.runtime.views.UNREADABLE) matches any other of its kind there (the replay check follows)."""
    def key(x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(key(v) for v in x)
        return expr_of(x) if isinstance(x, (torch.SymInt, torch.SymFloat)) else x

    def same(s: ViewStep, t: ViewStep) -> bool:
        opaque = s.meta in UNREADABLE
        return s.meta == t.meta and (opaque or key(s.fields) == key(t.fields))

    return len(a) == len(b) and all(map(same, a, b))


def _new_buffer_fits(view: torch.Tensor) -> bool:
    """Whether a new buffer the graph returns can stand for a view of an intermediate: at offset 0
    and dense, in the order of its strides (the layout the lowering gives a dense output). Decided
    on the expressions, so no size guard is added; a symbolic offset counts as not 0."""
    offset = view.storage_offset()
    if type(offset) is not int or offset != 0:
        return False
    sizes = [_expression(s) for s in view.shape]
    strides = [_expression(s) for s in view.stride()]
    hints = [size_hint(s) for s in view.stride()]
    dense = sympy.Integer(1)
    for d in sorted(range(view.dim()), key=lambda d: hints[d]):
        if sizes[d] == 1:
            continue
        if sympy.expand(strides[d] - dense) != 0:
            return False
        dense = dense * sizes[d]
    return True


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
        elif getattr(target, "__module__", None) not in ("_operator", "torch", "math") and target is not round \
                and target is not sym_floordiv:
            # math: floor/ceil of a float; round: a float's round-half-even to an int; sym_floordiv:
            # Python's float `//`
            raise VerificationError(_STAGE, f"ATen graph node {node.name} calls {target}, not an ATen overload")
        if "val" not in node.meta:
            raise VerificationError(_STAGE, f"ATen graph node {node.name} has no traced value (meta['val'])")
