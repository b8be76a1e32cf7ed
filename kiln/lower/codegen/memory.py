"""Memory planning for the wrappers: which dead buffer's storage a later buffer takes over.

Input: the buffers the wrapper allocates (name, step, dtype, storage size; a matmul's result too,
which the wrapper allocates for the op's out= overload), the extern results that may donate (fresh
tensors ATen made), the step of each name's last use, the graph's outputs, and which names may
share storage (an extern whose schema says its result is a view of an argument).
Output: a `MemoryPlan`, the recipients with their donors and the names whose `del` moves from their
death to the reuse. A buffer is reused only when its last use (and every alias's) is in an earlier
step, or in the recipient's own kernel where that kernel reads it only at the very element the
recipient writes, in the recipient or in an earlier block of the kernel (in place, as Inductor's
in-place buffers: `in_place_donors`), it is not an output nor aliased by one, it has the same
dtype, and it holds at least as many elements; with sizes known, a donor is kept alive until its
reuse only where that does not raise the peak the plan reaches without such holds; with symbolic
sizes, only an equal size with nothing allocated in between. `check_plan` verifies a plan against
the same facts.
Corresponds to the buffer-reuse part of torch/_inductor/codegen/wrapper.py (ReuseLine and the
reuse pool), on the wrapper's steps rather than on scheduler nodes.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kiln.lower.ir import BufferRef, InputBuffer, Load, LoopIR, Pointwise, index_vars, walk
from kiln.lower.schedule import Kernel, kernel_substitution


@dataclass(frozen=True)
class Allocation:
    """A buffer the wrapper allocates with torch.empty_strided, just before step `step` runs."""

    name: str
    step: int
    dtype: torch.dtype
    elements: sympy.Expr  # the storage it needs (Layout.storage_size())
    # buffers this one may take although they die in its own step: its kernel reads each only to
    # compute this buffer, at the element it writes (so every read comes before the write over it)
    inplace: frozenset[str] = frozenset()


@dataclass(frozen=True)
class MemoryFacts:
    """What the plan is made from (and checked against). `produced` is every other tensor a step
    makes (extern results): (name, step, bytes or None when symbolic); it counts towards the peak
    and donates only when it is also among `results`: a fresh CPU tensor of an ATen op whose schema
    returns no alias (its storage is the result's own)."""

    allocations: tuple[Allocation, ...]
    produced: tuple[tuple[str, int, int | None], ...]
    last_use: dict[str, int]
    outputs: frozenset[str]
    aliases: tuple[frozenset[str], ...]  # groups of names that may share storage
    steps: int
    results: tuple[Allocation, ...] = ()


@dataclass(frozen=True)
class MemoryPlan:
    reuse: dict[str, str] = field(default_factory=dict)  # recipient -> donor whose storage it takes
    kept: frozenset[str] = frozenset()  # donors dead before their reuse: not freed at death, handed over


def _static(e: sympy.Expr) -> int | None:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else None


def _aliased(facts: MemoryFacts) -> set[str]:
    return {name for group in facts.aliases if len(group) > 1 for name in group}


def plan_memory(facts: MemoryFacts) -> MemoryPlan:
    """Greedy in allocation order: each buffer takes the best-fitting dead buffer that may donate
    (the smallest that is large enough, then the one that died last: its lines are likelier to be
    in cache).

    With sizes known, in two passes. The first takes only reuses that keep no dead donor alive
    across another step (a donor that dies in the step just before, or in place); the peak of its
    plan is the target. The second may also keep a donor alive through the steps up to its reuse,
    where the live bytes stay under that target at every one of them. The plan with the lower peak
    wins (the second, on a tie). Planning against the peak of the graph without any reuse instead
    let a donor be held through a step whose own buffers later reuses made small again: on a BERT
    layer the first layer norm's buffer was kept across both FFN matmuls for the second's output,
    96 KiB above torch.compile's peak."""
    static = all(_static(a.elements) is not None for a in facts.allocations) and \
        all(b is not None for _, _, b in facts.produced)
    if not static:
        return _greedy(facts, None, holds=True)[0]
    unplanned = _live_bytes(facts)
    no_hold, live = _greedy(facts, max(unplanned, default=0), holds=False)
    target = max(live, default=0)
    held, live = _greedy(facts, target, holds=True)
    if max(live, default=0) <= target:
        return held
    return no_hold


def _greedy(facts: MemoryFacts, peak: int | None, holds: bool) -> tuple[MemoryPlan, list[int]]:
    """One greedy pass: the plan and the live bytes per step it leaves (empty with symbolic sizes).
    `peak` is what a reuse may not raise any step above; without `holds`, a donor must die in the
    step just before the recipient's or in it (in place)."""
    aliased = _aliased(facts)
    everyone = facts.allocations + facts.results
    by_name = {a.name: a for a in everyone}
    order = {a.name: k for k, a in enumerate(everyone)}
    may_donate = [a.name for a in everyone
                  if a.name not in facts.outputs and a.name not in aliased and a.name in facts.last_use]
    live = _live_bytes(facts) if peak is not None else []
    capacity: dict[str, sympy.Expr] = {a.name: sympy.sympify(a.elements) for a in everyone}
    death = {a.name: _end(facts, a.name, a.step) for a in everyone}
    reuse: dict[str, str] = {}
    taken: set[str] = set()
    for alloc in facts.allocations:
        if _static(alloc.elements) == 0:
            continue  # nothing to save
        dead = [d for d in may_donate if d not in taken and d != alloc.name and by_name[d].dtype == alloc.dtype
                and (death[d] < alloc.step or (death[d] == alloc.step and d in alloc.inplace))
                and (holds or death[d] >= alloc.step - 1)]
        best: str | None = None
        if peak is not None:
            need = int(alloc.elements)
            # an output leaves with the storage it got: it takes only a donor of its own size
            fitting = sorted((d for d in dead if int(capacity[d]) >= need
                              and (alloc.name not in facts.outputs or int(capacity[d]) == need)),
                             key=lambda d: (int(capacity[d]), -death[d], order[d]))
            best = next((d for d in fitting if _fits_under(live, peak, by_name, d, alloc, death, capacity)), None)
        else:
            equal = [d for d in dead if sympy.expand(capacity[d] - alloc.elements) == 0
                     and _nothing_allocated_between(facts, death[d], alloc)]
            best = max(equal, key=lambda d: (death[d], -order[d]), default=None)
        if best is None:
            continue
        reuse[alloc.name] = best
        taken.add(best)
        capacity[alloc.name] = capacity[best]
        if peak is not None:
            _hold(live, by_name, best, alloc, death, capacity)
    return MemoryPlan(reuse, frozenset(d for r, d in reuse.items() if death[d] < by_name[r].step)), live


def _element_bytes(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _end(facts: MemoryFacts, name: str, step: int) -> int:
    """The last step a name holds memory in: an output's lasts to the end of the wrapper."""
    return facts.steps - 1 if name in facts.outputs else max(step, facts.last_use.get(name, step))


def _live_bytes(facts: MemoryFacts) -> list[int]:
    """Bytes live while each step runs (after its allocations, before its frees), without reuse."""
    live = [0] * max(facts.steps, 1)
    spans = [(a.step, _end(facts, a.name, a.step), int(a.elements) * _element_bytes(a.dtype))
             for a in facts.allocations]
    spans += [(step, _end(facts, name, step), int(nbytes or 0)) for name, step, nbytes in facts.produced]
    for start, end, nbytes in spans:
        for s in range(start, end + 1):
            live[s] += nbytes
    return live


def _hold_delta(by_name: dict[str, Allocation], donor: str, alloc: Allocation, death: dict[str, int],
                capacity: dict[str, sympy.Expr]) -> dict[int, int]:
    """How the live bytes per step change when `alloc` takes `donor`'s storage: the donor stays
    alive from its death up to the reuse, and from then on the recipient holds the donor's
    capacity instead of its own size."""
    size = _element_bytes(by_name[donor].dtype)
    held = int(capacity[donor]) * size
    own = int(alloc.elements) * size
    delta: dict[int, int] = {}
    for s in range(death[donor] + 1, alloc.step):
        delta[s] = held
    for s in range(alloc.step, death[alloc.name] + 1):
        delta[s] = -own if s <= death[donor] else held - own  # in place: the donor was counted there
    return delta


def _fits_under(live: list[int], peak: int, by_name: dict[str, Allocation], donor: str, alloc: Allocation,
                death: dict[str, int], capacity: dict[str, sympy.Expr]) -> bool:
    """Whether the live bytes stay at or under `peak` at every step once `alloc` takes `donor`."""
    size = _element_bytes(by_name[donor].dtype)
    held, own = int(capacity[donor]) * size, int(alloc.elements) * size
    gap = live[death[donor] + 1:alloc.step]
    span = live[max(alloc.step, death[donor] + 1):death[alloc.name] + 1]  # in place: from the donor's death
    return (not gap or max(gap) + held <= peak) and (not span or max(span) + held - own <= peak)


def _hold(live: list[int], by_name: dict[str, Allocation], donor: str, alloc: Allocation, death: dict[str, int],
          capacity: dict[str, sympy.Expr]) -> None:
    for s, d in _hold_delta(by_name, donor, alloc, death, capacity).items():
        live[s] += d


def _nothing_allocated_between(facts: MemoryFacts, died: int, alloc: Allocation) -> bool:
    """No buffer or extern result appears after step `died` and before `alloc` (allocations of
    `alloc`'s own step that come before it in the list included)."""
    for other in facts.allocations:
        if other is alloc:
            break
        if other.step > died:
            return False
    return not any(died < step < alloc.step for _, step, _ in facts.produced)


def check_plan(facts: MemoryFacts, plan: MemoryPlan) -> None:
    """Raise AssertionError if a reuse could alias a live buffer: the donor (or a name sharing its
    storage) is used at or after the recipient's step, is an output, was handed to two recipients,
    or differs in dtype or holds fewer elements than the recipient needs (when both are known)."""
    by_name = {a.name: a for a in facts.allocations + facts.results}
    aliased = _aliased(facts)
    capacity = {a.name: sympy.sympify(a.elements) for a in facts.allocations + facts.results}
    donated: set[str] = set()
    for alloc in facts.allocations:  # allocation order, so a chain of reuses sees its capacities
        donor = plan.reuse.get(alloc.name)
        if donor is None:
            continue
        assert donor in by_name, f"{alloc.name} reuses {donor}, which is neither a buffer nor a fresh result"
        assert donor not in donated, f"{donor} is handed to two buffers"
        donated.add(donor)
        assert donor not in facts.outputs, f"{alloc.name} reuses the output {donor}"
        assert donor not in aliased, f"{alloc.name} reuses {donor}, whose storage another name may share"
        last = facts.last_use.get(donor)
        assert last is not None and (last < alloc.step or (last == alloc.step and donor in alloc.inplace)), \
            f"{alloc.name} (step {alloc.step}) reuses {donor}, last used in step {last}"
        assert by_name[donor].dtype == alloc.dtype, f"{alloc.name} reuses {donor} of another dtype"
        have, need = _static(capacity[donor]), _static(alloc.elements)
        if have is not None and need is not None:
            assert have >= need, f"{alloc.name} needs {need} elements, {donor} holds {have}"
        else:
            assert sympy.expand(capacity[donor] - alloc.elements) == 0, f"{alloc.name} and {donor} differ in size"
        capacity[alloc.name] = capacity[donor]
    handed = {d for r, d in plan.reuse.items() if facts.last_use[d] < by_name[r].step}
    assert plan.kept == handed, "kept names are not exactly the donors that die before their reuse"


def input_writes(facts: MemoryFacts, ir: LoopIR) -> dict[str, str]:
    """{output buffer: input buffer} for the graph outputs that are computed into the storage of
    the input they are the new value of (`ir.input_updates`: an optimizer's parameters and state),
    so that the runtime has no copy to make and the wrapper no buffer to allocate.

    As for a donor: the input is read for the last time before the output's kernel, or in it only
    at the element the output stores (`Allocation.inplace`); its layout is the output's (dense
    enough to hold it: same dtype, sizes and strides); it is not returned itself, nor shares
    storage with an extern's result; the output is a kernel's buffer returned once (a second
    output of the same buffer, or a user output, would alias the input then)."""
    inputs = {b.position: b for b in ir.buffers if isinstance(b, InputBuffer)}
    allocations = {a.name: a for a in facts.allocations}
    returned = collections.Counter(o.name for o in ir.outputs if isinstance(o, BufferRef))
    aliased = _aliased(facts)
    writes: dict[str, str] = {}
    for k, position in ir.input_updates:
        out = ir.outputs[k] if 0 <= k < len(ir.outputs) else None
        source = inputs.get(position)
        if not isinstance(out, BufferRef) or source is None or out.name not in allocations:
            continue
        alloc = allocations[out.name]
        if returned[out.name] != 1 or out.name in writes or source.name in writes.values() \
                or source.name in facts.outputs or source.name in aliased:
            continue
        own = ir.buffer(out.name).layout
        if not (own == out.layout == source.layout and own.offset == 0) or own.dtype != alloc.dtype:
            continue
        last = facts.last_use.get(source.name, -1)
        if last > alloc.step or last == alloc.step and source.name not in alloc.inplace:
            continue
        writes[out.name] = source.name
    return writes


def in_place_donors(step: Kernel, block_kind: str, node: Any) -> frozenset[str]:
    """The buffers `node` may overwrite as it goes: a pointwise node of a plain loop (or of a scalar
    block over the outer range: a bias next to its weight) that reads each
    such buffer, if at all, only at the element it stores (no indirect part), so every element is
    read before the store that replaces it. Other nodes of the kernel may read the buffer only in an
    earlier block, and only at that same element as kernel variables: an earlier block runs to its end for
    the same outer point before `node`'s block starts (a layer norm's mean and variance sweep the
    row that its normalized output then overwrites, as Inductor's in-place layer norm does), and
    the store covers each element once (a dense layout), so no other outer point, which may run on
    another thread, reads what it writes. Whether a buffer dies here, and its size and dtype, the
    planner checks.

    The C++ kernel generator drops `__restrict__` from a node's output and from each of these
    (`aliasing_args`), so that the kernel is well defined when the plan hands it the same storage
    as an input and as an output (Inductor passes one in/out pointer instead).
    """
    if block_kind not in ("loop", "scalar") or not isinstance(node, Pointwise) or node.layout.offset != 0:
        return frozenset()
    if any(st == 0 and sz != 1 for sz, st in zip(node.layout.sizes, node.layout.strides)):
        return frozenset()  # a broadcast store writes an element more than once: a later read would see it
    target = sympy.expand(node.layout.index(index_vars("i", len(node.layout.sizes))))
    mine: dict[str, bool] = {}
    for v in walk(node.body):
        if isinstance(v, Load):
            ok = v.extra is None and sympy.expand(v.index - target) == 0
            mine[v.buffer] = mine.get(v.buffer, True) and ok
    position = next(k for k, blk in enumerate(step.blocks) if any(n is node for n in blk.nodes))
    earlier = [n for blk in step.blocks[:position] for n in blk.nodes]
    later = [n for blk in step.blocks[position:] for n in blk.nodes if n is not node]
    refused = {b for b, ok in mine.items() if not ok} | {node.name}
    refused |= {v.buffer for n in later if getattr(n, "body", None) is not None
                for v in walk(n.body) if isinstance(v, Load)}
    read_before = {v.buffer for n in earlier if getattr(n, "body", None) is not None
                   for v in walk(n.body) if isinstance(v, Load)} - refused
    if read_before and step.columns:
        # a kernel summing columns (batch-norm training statistics over N*H*W) ran 40% slower on
        # ResNet-18's training step with its output over its input: earlier-block reads only in row kernels
        refused |= read_before
    elif read_before:
        refused |= read_before - _read_at_the_store(step, earlier, node, read_before)
    return frozenset((set(mine) | read_before) - refused)


def _read_at_the_store(step: Kernel, earlier: list[Any], node: Pointwise, names: set[str]) -> set[str]:
    """Those of `names` that every node of the earlier blocks reads only at the element `node`
    stores, as kernel variables; none where `node`'s store does not cover each element once."""
    layout = node.layout
    sizes = [sympy.sympify(z) for z in layout.sizes]
    if sympy.expand(sympy.sympify(layout.storage_size()) - sympy.Mul(*sizes)) != 0:
        return set()  # an overlapping or padded layout: an element's index is not one point's alone
    own = kernel_substitution(step, node)
    if own is None:
        return set()
    store = sympy.expand(layout.index(index_vars("i", len(layout.sizes))).xreplace(own))
    ok = set(names)
    for n in earlier:
        if getattr(n, "body", None) is None:
            continue
        sub = kernel_substitution(step, n)
        for v in walk(n.body):
            if isinstance(v, Load) and v.buffer in ok:
                if sub is None or v.extra is not None or sympy.expand(sympy.sympify(v.index).xreplace(sub) - store) != 0:
                    ok.discard(v.buffer)
    return ok


def aliasing_args(step: Kernel) -> frozenset[str]:
    """The buffers of a kernel that the memory plan may give one storage (an output written in
    place over an input it reads): they must not be declared `__restrict__`."""
    names: set[str] = set()
    for block in step.blocks:
        for n in block.nodes:
            donors = in_place_donors(step, block.kind, n)
            if donors:
                names |= donors | {n.name}
    return frozenset(names)
