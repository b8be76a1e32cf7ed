"""Random programs about aliasing: strided and offset inputs, updated in place, returned as views.

`generate(seed)` writes one program: one to three inputs whose first dim is a size that changes
between calls, each made with a layout eager code meets (contiguous, transposed, rows with a step,
a column slice, a storage offset, channels-last, a broadcast, an empty dim) and a dtype (float32
mostly, bfloat16, float16, int64, complex64); then steps chosen among in-place updates of inputs
and of views of them (several, through views, metadata changes such as t_), chains of views
(slices with steps, select, narrow, diagonal, unfold, expand, as_strided, unbind/split/chunk,
reshape, view(dtype), real/imag, as_strided from the view's own storage offset ...), reads of
storage_offset(), and intermediates updated through a view; it returns views
of inputs and of intermediates, the intermediates themselves and a reduction. The program is
compiled under static shapes, automatic dynamic, dynamic=True or maybe_mark_dynamic and called on two
sizes; programs with gradients update no input and return views of inputs beside a loss.
Every step is run eagerly on the examples of each size as it is written, so eager accepts the
program. `check(program, backends)` compares each backend with eager through tests/fuzz/aliasing.py
(values, strides, offsets, which tensors share memory, writes through aliases, gradients) and
requires no fallback to eager; on a difference it returns the program's source as the repro.
Used by tests/fuzz/test_view_programs.py and `python tests/fuzz/view_programs.py [first [count]]`.
"""
from __future__ import annotations

import random
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import kiln
from kiln.log import KilnWarning

sys.path.insert(0, str(Path(__file__).parent))
from aliasing import differences, outcome  # noqa: E402

BACKENDS = ("eager", "aot_eager", "inductor")
LAYOUTS = ("contiguous", "transposed", "strided_rows", "column_slice", "offset", "channels_last", "expanded",
           "empty")
DTYPES = (torch.float32,) * 6 + (torch.bfloat16, torch.float16, torch.int64, torch.complex64)
MODES = ("static", "automatic", "dynamic", "mark")


@dataclass(frozen=True)
class InputSpec:
    """One argument: its layout, its dtype and its sizes after the first (which is the call's n)."""

    layout: str
    dtype: torch.dtype
    rest: tuple[int, ...]
    requires_grad: bool = False

    def make(self, n: int) -> torch.Tensor:
        shape = (n, *self.rest)
        if self.layout == "channels_last":  # (n, C, H, W) laid out NHWC
            t = _values(shape, self.dtype).to(memory_format=torch.channels_last)
        elif self.layout == "transposed":
            t = _values(shape[::-1], self.dtype).permute(*reversed(range(len(shape))))
        elif self.layout == "strided_rows":
            t = _values((2 * n, *self.rest), self.dtype)[::2]
        elif self.layout == "column_slice":
            t = _values((n, self.rest[0] + 2, *self.rest[1:]), self.dtype)[:, 1:-1]
        elif self.layout == "offset":
            count = 1
            for s in shape:
                count *= s
            t = _values((count + 5,), self.dtype)[5:].view(shape)
        elif self.layout == "expanded":
            t = _values((1, *self.rest), self.dtype).expand(shape)
        else:  # contiguous, and empty (its rest holds a 0)
            t = _values(shape, self.dtype)
        assert tuple(t.shape) == shape
        if self.requires_grad:
            # a leaf with the layout: the view of a leaf made under no_grad is itself a leaf
            t = t.detach().requires_grad_(True) if t._base is None else _leaf_view(t)
        return t

    def source(self) -> str:
        return f"InputSpec({self.layout!r}, {self.dtype}, {self.rest}, requires_grad={self.requires_grad})"


def _leaf_view(t: torch.Tensor) -> torch.Tensor:
    base = t._base.detach().requires_grad_(True)
    with torch.no_grad():
        view = base.as_strided(t.shape, t.stride(), t.storage_offset())
    return view.requires_grad_(True) if not view.requires_grad else view


def _values(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Small exact values (halves between -5 and 5) so every dtype compares exactly."""
    count = 1
    for s in shape:
        count *= s
    base = (torch.arange(count, dtype=torch.float64) * 7 % 21 - 10) / 2
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype).reshape(shape)
    if not dtype.is_floating_point:
        return (base * 2).to(dtype).reshape(shape)
    return base.to(dtype).reshape(shape)


@dataclass
class ViewProgram:
    """A generated program: its source (defines `program`), inputs, sizes and how it is compiled."""

    seed: int
    source: str
    inputs: list[InputSpec]
    sizes: tuple[int, ...]
    mode: str  # one of MODES
    with_grad: bool
    fn: Callable[..., Any] = field(repr=False, default=None)  # type: ignore[assignment]

    def compile_source(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, f"<view program {self.seed}>", "exec"), namespace)
        return namespace["program"]

    def make_inputs(self, n: int) -> list[torch.Tensor]:
        return [spec.make(n) for spec in self.inputs]

    def repro(self) -> str:
        specs = ", ".join(spec.source() for spec in self.inputs)
        return (f"# seed {self.seed}, sizes {self.sizes}, mode {self.mode}, gradients: {self.with_grad}\n"
                f"# inputs: [{specs}]\n{self.source}")


class _Writer:
    """Keeps the example value of every name for each size and appends the steps eager accepts."""

    def __init__(self, rng: random.Random, specs: list[InputSpec], sizes: tuple[int, ...], with_grad: bool) -> None:
        self.rng = rng
        self.sizes = sizes
        self.with_grad = with_grad
        self.lines: list[str] = []
        self.names = [f"x{i}" for i in range(len(specs))]
        self.examples: list[dict[str, Any]] = [dict(zip(self.names, (s.make(n) for s in specs))) for n in sizes]
        self.inputs = set(self.names)
        # Kiln refuses (runs eagerly) an as_strided view of an input that is also updated in
        # place; the programs keep to what it compiles: such an input is updated or viewed so
        self.updated: set[str] = set()
        self.as_strided: set[str] = set()
        self.count = 0

    def value(self, name: str) -> Any:
        return self.examples[0][name]

    def pick(self, want: Callable[[torch.Tensor], bool] = lambda t: True, among: set[str] | None = None) -> str | None:
        names = [n for n, v in self.examples[0].items() if isinstance(v, torch.Tensor) and want(v)
                 and (among is None or n in among)]
        return self.rng.choice(sorted(names)) if names else None

    def run(self, line: str, name: str | None = None) -> bool:
        """Run `line` (an expression bound to `name`, or a statement) on the examples of every
        size; keep it if eager accepts it everywhere. Statements may update values in place."""
        trial = []
        for scope in self.examples:
            copies = _copies(scope)
            copies["torch"] = torch
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if name is None:
                        exec(line, copies)  # noqa: S102 - the generator's own statements
                    else:
                        copies[name] = eval(line, copies)  # noqa: S307
            except Exception:
                return False
            if name is not None and not isinstance(copies[name], torch.Tensor):
                return False
            copies.pop("torch")
            copies.pop("__builtins__", None)
            trial.append(copies)
        self.examples = trial
        self.lines.append(f"    {line}" if name is None else f"    {name} = {line}")
        self.count += name is not None
        return True

    def fresh(self) -> str:
        return f"t{self.count + 1}"


def _copies(scope: dict[str, Any]) -> dict[str, Any]:
    """The values of a scope copied with their aliasing: tensors sharing a storage share its copy."""
    storages: dict[int, torch.UntypedStorage] = {}
    out: dict[str, Any] = {}
    for name, v in scope.items():
        if not isinstance(v, torch.Tensor):
            out[name] = v
            continue
        key = v.untyped_storage()._cdata
        if key not in storages:
            storages[key] = v.untyped_storage().clone()
        copy = torch.empty(0, dtype=v.dtype)
        copy.set_(storages[key], v.storage_offset(), v.shape, v.stride())
        out[name] = copy.requires_grad_(True) if v.requires_grad else copy
    return out


# ---------------------------------------------------------------------------------------------------
# The steps

def _mutate_input(w: _Writer) -> bool:
    if w.with_grad:
        return False
    x = w.pick(lambda t: t.dim() >= 2 and not _broadcast(t), among=w.inputs - w.as_strided)
    if x is None:
        return False
    w.updated.add(x)
    t = w.value(x)
    scale = "1" if not t.dtype.is_floating_point and not t.dtype.is_complex else "1.5"
    options = [f"{x}.add_({scale})", f"{x}.mul_(-2)", f"{x}.zero_()", f"{x}[0].fill_(3)", f"{x}[:, 1:].sub_(1)",
               f"{x}[:, 0].mul_(2)", f"{x}.copy_({x}.flip(0))", f"{x}[1:].add_({x}[:-1].clone())",
               f"{x}.t_()" if t.dim() == 2 else f"{x}.transpose_(0, 1)", f"{x}.unsqueeze_(1)"]
    if not t.dtype.is_complex and t.dtype != torch.bool:
        options.append(f"{x}.clamp_(max=2)")
    return w.run(w.rng.choice(options))


def _overlapping_elements(t: torch.Tensor) -> bool:
    """Whether two elements of `t` are one memory location (a broadcast, an unfold)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[d] = size
        offsets = offsets + (torch.arange(size) * stride).reshape(shape)
    return offsets.numel() != offsets.unique().numel()


def _broadcast(t: torch.Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def _view(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    t = w.value(x)
    options = [f"{x}[1:]", f"{x}[::2]", f"{x}[0]", f"{x}.narrow(0, 1, 1)", f"{x}.unsqueeze(0)", f"{x}.reshape(-1)",
               f"{x}.flatten()", f"{x}.expand(2, *{x}.shape)", f"{x}.unfold(0, 2, 1)", f"{x}.unbind(0)[1]",
               f"{x}.chunk(2, 0)[-1]", f"{x}.detach()", f"{x}.contiguous()", f"{x}.as_strided((2, 2), (1, 2))",
               f"{x}.as_strided((2, 2), (1, 2), {x}.storage_offset() + 1)",
               f"{x}.view(-1)", f"{x}.squeeze()"]
    if t.dim() >= 2:
        options += [f"{x}[:, :1]", f"{x}[:, ::2]", f"{x}.transpose(0, 1)", f"{x}.diagonal()", f"{x}.select(-1, 0)",
                    f"{x}.narrow(-1, 1, 1)", f"{x}.split(1, 1)[0]", f"{x}.movedim(0, -1)",
                    f"{x}.permute(*reversed(range({x}.dim())))", f"{x}[..., 1:]", f"{x}.swapaxes(0, 1)[1:]"]
    if t.dim() == 2:
        options += [f"{x}.t()", f"{x}.unflatten(1, (1, -1))"]
    if t.dtype == torch.float32:
        options.append(f"{x}.view(torch.int32)")
    if t.dtype.is_complex and w.rng.random() < 0.5:
        options = [f"{x}.real", f"{x}.imag", f"torch.view_as_real({x})"]
    choice = w.rng.choice(options)
    if ".as_strided(" in choice:
        inputs = _aliased_inputs(w, x)
        if inputs & w.updated:
            return False
        w.as_strided |= inputs
    return w.run(choice, w.fresh())


def _aliased_inputs(w: _Writer, name: str) -> set[str]:
    storage = w.value(name).untyped_storage()._cdata
    return {x for x in w.inputs if w.value(x).untyped_storage()._cdata == storage}


def _intermediate(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    t = w.value(x)
    options = [f"{x} * 2 + 1", f"torch.maximum({x}, {x})" if not t.dtype.is_complex else f"{x} * 3",
               f"{x}.clone()", f"{x} - {x}.sum(0, keepdim=True)", f"{x} * {x}.storage_offset()"]
    if t.dtype.is_floating_point:
        options += [f"{x}.sin()", f"{x}.abs()"]
    return w.run(w.rng.choice(options), w.fresh())


def _mutate_intermediate(w: _Writer) -> bool:
    # not a view whose elements overlap (unfold, expand): Kiln runs such an update eagerly
    y = w.pick(lambda t: t.dim() >= 1 and not _overlapping_elements(t),
               among=set(w.examples[0]) - w.inputs - _input_views(w))
    if y is None:
        return False
    options = [f"{y}[..., :1].fill_(3)", f"{y}[0].mul_(2)", f"{y}.add_(1)", f"{y}[::2].zero_()"]
    return w.run(w.rng.choice(options))


def _input_views(w: _Writer) -> set[str]:
    """Names that share memory with an input (in-place on them would update an input)."""
    storages = {w.value(x).untyped_storage()._cdata for x in w.inputs}
    return {n for n, v in w.examples[0].items()
            if isinstance(v, torch.Tensor) and v.untyped_storage()._cdata in storages}


STEPS: list[tuple[Callable[[_Writer], bool], int]] = [
    (_view, 6), (_mutate_input, 3), (_intermediate, 2), (_mutate_intermediate, 2),
]


def _choose_inputs(rng: random.Random, with_grad: bool) -> list[InputSpec]:
    specs = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        layout = rng.choice(LAYOUTS)
        dtype = torch.float32 if with_grad else rng.choice(DTYPES)
        if layout == "channels_last":
            rest: tuple[int, ...] = (3, 2, 2)
        elif layout == "empty":
            rest = (0,)
        else:
            rest = rng.choice(((3,), (4,), (2, 3)))
        specs.append(InputSpec(layout, dtype, rest, requires_grad=with_grad))
    return specs


def generate(seed: int) -> ViewProgram:
    """The program of `seed` (the same program for the same seed)."""
    rng = random.Random(seed)
    with_grad = rng.random() < 0.2
    mode = rng.choice(MODES)
    sizes = (4,) if mode == "static" else rng.choice(((4, 6), (5, 3)))
    specs = _choose_inputs(rng, with_grad)
    w = _Writer(rng, specs, sizes, with_grad)
    functions, weights = zip(*STEPS)
    for _ in range(rng.randrange(2, 7)):
        for _attempt in range(10):
            if rng.choices(functions, weights)[0](w):
                break
    returned = _outputs(w, rng)
    lines = "\n".join(w.lines) if w.lines else "    pass"
    source = f"def program({', '.join(w.names)}):\n{lines}\n    return ({', '.join(returned)},)\n"
    program = ViewProgram(seed, source, specs, sizes, mode, with_grad)
    program.fn = program.compile_source()
    return program


def _outputs(w: _Writer, rng: random.Random) -> list[str]:
    made = [n for n in w.examples[0] if n not in w.inputs]
    chosen = rng.sample(made, min(len(made), rng.randrange(1, 4)))
    if rng.random() < 0.3:
        chosen.append(rng.choice(w.names))  # an input itself (updated in place, or not)
    total = w.pick(lambda t: t.numel() > 0 and (t.dtype.is_floating_point or t.dtype.is_complex))
    # a reduction, so the frame has a graph (a program of views only may run as it is)
    reduction = f"{total}.sum()" if total is not None else f"{w.names[0]}.sum()"
    if w.with_grad:
        reduction = f"({reduction} * 2).abs()"
    return [*chosen, reduction]


# ---------------------------------------------------------------------------------------------------
# The check

def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds


def check(program: ViewProgram, backends: tuple[str, ...] = BACKENDS) -> str | None:
    """None if every backend agrees with eager on each size, else what differs and the repro."""
    for backend in backends:
        kiln.reset()
        compiled = kiln.compile(program.compile_source(), backend=backend, options=_options(backend),
                                dynamic=True if program.mode == "dynamic" else None)
        for k, n in enumerate(program.sizes):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = outcome(program.fn, program.make_inputs(n), grad=program.with_grad)
            inputs = program.make_inputs(n)
            if program.mode == "mark" and k == 0:
                for x in inputs:
                    kiln.maybe_mark_dynamic(x, 0)  # a program may specialize the size: no error then
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = outcome(compiled, inputs, grad=program.with_grad)
            fell_back = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
            problems = differences(expected, got)
            if fell_back or kiln.stats()["fallbacks"]:
                problems.insert(0, f"fell back to eager: {fell_back[:1]}")
            if problems:
                return f"backend {backend}, n={n}: " + "\n".join(problems[:4]) + f"\n{program.repro()}"
    return None


def main() -> None:
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    backends = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else BACKENDS
    failures = 0
    for seed in range(first, first + count):
        problem = check(generate(seed), backends)
        if problem:
            failures += 1
            print(f"--- seed {seed}\n{problem}\n", flush=True)
    print(f"{count - failures}/{count} programs agree with eager on {', '.join(backends)}")


if __name__ == "__main__":
    main()
