"""Random shape-generic programs, called on several sizes and layouts: dynamic shapes against eager.

`generate(seed)` writes one program over inputs whose dims are named sizes ("n", "m") or fixed
ones, then a plan of calls: each call gives the sizes new values (1 among them, which the
compiled code specializes) and each input a layout of the same logical shape (contiguous,
transposed, padded rows, a column slice of a wider tensor, a storage offset, a broadcast dim,
rows with a step, channels-last for 4-D, a transposed padded block). The steps treat sizes
generically: pointwise ops with broadcasting, reductions over a dim, softmax/layer_norm/var,
matmul, size-generic views (flatten, transposes, unsqueeze, slices whose bounds are computed from
.shape, narrow, chunk/split), cat/stack, indexing with computed ranges (arange, flip, roll,
index_select), arithmetic on sizes, expand, pad, and in-place updates of inputs and intermediates
(also through views with offsets). Every step is run eagerly on every call's inputs as it is
written, so eager accepts the whole plan. A program is compiled under automatic dynamic
(dynamic=None: the second size recompiles as dynamic), dynamic=True or kiln.mark_dynamic on the
first call; `check(program, backends)` compares each call with eager through tests/fuzz/aliasing.py
(outputs, inputs afterwards, writes through returned views, gradients) and requires no fallback.
Used by tests/fuzz/test_shape_programs.py and `python tests/fuzz/shape_programs.py [first [count]]`.
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
from view_programs import _copies  # noqa: E402  (a scope copied with its aliasing, shared with the view fuzzer)

BACKENDS = ("eager", "aot_eager", "inductor")
STRIDES = False  # outputs' strides are compared too (eager's layouts) when set
MODES = ("automatic", "dynamic", "mark")
LAYOUTS = ("contiguous", "transposed", "padded_rows", "column_slice", "offset", "expanded", "stepped",
           "channels_last", "transposed_padded")
SHAPES: tuple[tuple[Any, ...], ...] = (
    ("n", "m"), ("n", "m"), ("m",), ("n",), ("n", 3), (3, "m"), ("n", "m", 2), (2, "n", "m"), ("n", 3, "m", 2),
)


@dataclass(frozen=True)
class InputSpec:
    """One argument: dims named by size ("n", "m") or fixed, its dtype, and whether it needs grad."""

    dims: tuple[Any, ...]
    dtype: torch.dtype
    requires_grad: bool = False

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def make(self, sizes: dict[str, int], layout: str, seed: int) -> torch.Tensor:
        shape = self.shape(sizes)
        g = torch.Generator().manual_seed(seed)
        values = lambda s: torch.randn(s, generator=g, dtype=torch.float64).to(self.dtype)  # noqa: E731
        if layout == "transposed":
            t = values(shape[::-1]).permute(*reversed(range(len(shape))))
        elif layout == "padded_rows":  # a block of a tensor wider in every dim
            base = values(tuple(s + 2 for s in shape))
            t = base[tuple(slice(1, 1 + s) for s in shape)]
        elif layout == "column_slice":
            t = values((*shape[:-1], shape[-1] + 3))[..., 2:-1]
        elif layout == "offset":
            count = 1
            for s in shape:
                count *= s
            t = values((count + 3,))[3:].view(shape)
        elif layout == "expanded":
            t = values((1, *shape[1:])).expand(shape)
        elif layout == "stepped":
            t = values((2 * shape[0], *shape[1:]))[::2]
        elif layout == "channels_last":
            t = values(shape).to(memory_format=torch.channels_last)
        elif layout == "transposed_padded":  # the transpose of a wider block, less its first element per dim
            wide = values(tuple(s + 1 for s in reversed(shape))).permute(*reversed(range(len(shape))))
            t = wide[tuple(slice(1, None) for _ in shape)]
        else:
            t = values(shape)
        assert tuple(t.shape) == shape, (layout, t.shape, shape)
        if self.requires_grad:
            # a leaf with the layout: a view of a fresh leaf made under no_grad is itself a leaf
            base = (t._base if t._base is not None else t).detach().requires_grad_(True)
            with torch.no_grad():
                t = base.as_strided(t.shape, t.stride(), t.storage_offset())
            t.requires_grad_(True)
        return t

    def source(self) -> str:
        return f"InputSpec({self.dims}, {self.dtype}, requires_grad={self.requires_grad})"


def _layouts_for(spec: InputSpec) -> list[str]:
    rank = len(spec.dims)
    if rank == 1:
        return ["contiguous", "offset", "expanded", "stepped", "transposed_padded"]
    return [layout for layout in LAYOUTS if layout != "channels_last" or rank == 4]


@dataclass(frozen=True)
class Call:
    """One call of the plan: the sizes' values and each input's layout."""

    sizes: tuple[tuple[str, int], ...]
    layouts: tuple[str, ...]


@dataclass
class ShapeProgram:
    """A generated program: its source (defines `program`), inputs, the calls and how it is compiled."""

    seed: int
    source: str
    inputs: list[InputSpec]
    calls: list[Call]
    mode: str  # one of MODES
    with_grad: bool
    fn: Callable[..., Any] = field(repr=False, default=None)  # type: ignore[assignment]

    def compile_source(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, f"<shape program {self.seed}>", "exec"), namespace)
        return namespace["program"]

    def make_inputs(self, k: int) -> list[torch.Tensor]:
        call = self.calls[k]
        sizes = dict(call.sizes)
        return [spec.make(sizes, layout, self.seed * 100 + 10 * k + i)
                for i, (spec, layout) in enumerate(zip(self.inputs, call.layouts))]

    def repro(self) -> str:
        specs = ", ".join(spec.source() for spec in self.inputs)
        calls = "\n".join(f"#   {dict(c.sizes)} {list(c.layouts)}" for c in self.calls)
        return (f"# seed {self.seed}, mode {self.mode}, gradients: {self.with_grad}\n# inputs: [{specs}]\n"
                f"# calls:\n{calls}\n{self.source}")


class _Writer:
    """Keeps every name's value for each call of the plan and appends the steps eager accepts."""

    def __init__(self, rng: random.Random, program: ShapeProgram) -> None:
        self.rng = rng
        self.with_grad = program.with_grad
        self.lines: list[str] = []
        self.names = [f"x{i}" for i in range(len(program.inputs))]
        self.examples: list[dict[str, Any]] = [dict(zip(self.names, program.make_inputs(k)))
                                               for k in range(len(program.calls))]
        self.inputs = set(self.names)
        self.count = 0

    def value(self, name: str) -> torch.Tensor:
        return self.examples[0][name]

    def pick(self, want: Callable[[torch.Tensor], bool] = lambda t: True, among: set[str] | None = None) -> str | None:
        names = [n for n, v in self.examples[0].items() if isinstance(v, torch.Tensor) and want(v)
                 and (among is None or n in among)]
        return self.rng.choice(sorted(names)) if names else None

    def run(self, line: str, name: str | None = None) -> bool:
        """Run `line` (an expression bound to `name`, or a statement) on every call's values; keep
        it if eager accepts it on all and the values stay small."""
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
            if name is not None and (not isinstance(copies[name], torch.Tensor) or copies[name].numel() > 2000):
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


# ---------------------------------------------------------------------------------------------------
# The steps: each names sizes only through .shape, so the program is generic in them

def _pointwise(w: _Writer) -> bool:
    x = w.pick()
    if x is None:
        return False
    if w.rng.random() < 0.5:
        options = [f"{x}.sin()", f"torch.tanh({x})", f"{x}.relu()", f"{x} * 2 - 1", f"torch.sigmoid({x})",
                   f"{x}.abs() + 1", f"{x}.exp()", f"torch.where({x} > 0, {x}, {x} * 0.5)", f"{x}.clamp(-1, 1)"]
        return w.run(w.rng.choice(options), w.fresh())
    y = w.pick()
    options = [f"{x} + {y}", f"{x} * {y}", f"torch.maximum({x}, {y})", f"{x} - {y}.mean(0)", f"{x} + {y}.sum(-1, keepdim=True)",
               f"{x} * {y}.unsqueeze(-1)", f"{x} / ({y}.abs() + 1)"]
    return w.run(w.rng.choice(options), w.fresh())


def _reduction(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    d = w.rng.randrange(-w.value(x).dim(), w.value(x).dim())
    options = [f"{x}.sum({d})", f"{x}.mean({d}, keepdim=True)", f"{x}.amax({d})", f"{x}.softmax({d})",
               f"torch.nn.functional.layer_norm({x}, {x}.shape[-1:])", f"{x}.var({d})", f"{x}.logsumexp({d})",
               f"{x}.cumsum({d})", f"{x} - {x}.mean({d}, keepdim=True)", f"{x}.sum()", f"{x}.norm(dim={d})",
               f"{x}.log_softmax({d})", f"{x}.argmax({d}).to({x}.dtype)", f"{x}.max({d}).values",
               f"{x}.sum({d}) / {x}.shape[{d}]"]
    return w.run(w.rng.choice(options), w.fresh())


def _matmul(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 2)
    if x is None:
        return False
    y = w.pick(lambda t: t.dim() >= 1)
    options = [f"{x} @ {y}", f"{x} @ {y}.transpose(-1, -2)", f"{x} @ {x}.transpose(-1, -2)",
               f"{x}.transpose(-1, -2) @ {x}", f"torch.matmul({x}, {y}.unsqueeze(-1))", f"{x}.flatten(0, -2) @ {y}.t()",
               f"{x} @ torch.ones({x}.shape[-1], 4, dtype={x}.dtype)"]
    return w.run(w.rng.choice(options), w.fresh())


def _view(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    options = [f"{x}.flatten()", f"{x}.transpose(0, -1)", f"{x}.unsqueeze(1)", f"{x}[1:]", f"{x}[..., 1:-1]",
               f"{x}[:{x}.shape[0] // 2 + 1]", f"{x}.narrow(0, 0, {x}.shape[0] - 1)", f"{x}.view(-1)",
               f"{x}.reshape({x}.shape[0], -1)", f"{x}[:{x}.shape[0] - 1:2]", f"{x}.movedim(0, -1)",
               f"{x}.unflatten(0, ({x}.shape[0], 1))", f"{x}[{x}.shape[0] // 2]", f"{x}.select(-1, -1)",
               f"{x}.contiguous()", f"{x}.chunk(2, 0)[0]", f"{x}.split({x}.shape[0] // 2 + 1)[-1]",
               f"{x}.flatten(0, 1)", f"{x}[:, 1:{x}.shape[1] - 1]", f"{x}[..., ::2]", f"{x}.t()",
               f"{x}.unsqueeze(0).expand(2, *{x}.shape)", f"{x}[:1].expand({x}.shape[0], *{x}.shape[1:])",
               f"{x}.reshape(-1, {x}.shape[-1])", f"{x}.squeeze(-1)", f"{x}.permute(*range({x}.dim() - 1, -1, -1))"]
    return w.run(w.rng.choice(options), w.fresh())


def _cat(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    y = w.pick(lambda t: t.dim() >= 1)
    d = w.rng.randrange(-w.value(x).dim(), w.value(x).dim())
    options = [f"torch.cat([{x}, {y}], {d})", f"torch.cat([{x}, {x}[1:]], 0)", f"torch.stack([{x}, {x} * 2], {d})",
               f"torch.cat([{x}, {x}.flip({d})], {d})", f"torch.nn.functional.pad({x}, (1, 2))",
               f"torch.cat([{x}[:, :1], {x}], 1)"]
    return w.run(w.rng.choice(options), w.fresh())


def _indexing(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    d = w.rng.randrange(w.value(x).dim())
    options = [f"{x}[torch.arange({x}.shape[0] - 1, -1, -1)]", f"{x}.index_select({d}, torch.arange(0, {x}.shape[{d}], 2))",
               f"{x}.flip({d})", f"{x}.roll(1, {d})", f"{x}[torch.arange({x}.shape[0]) % 2 == 0]",
               f"{x}.gather({d}, torch.zeros_like({x}, dtype=torch.int64))",
               f"{x}[:, torch.arange({x}.shape[1] - 1)]", f"{x}[{x}.shape[0] - 1:]",
               f"{x}.index_select(0, torch.tensor([{x}.shape[0] - 1, 0]))"]
    return w.run(w.rng.choice(options), w.fresh())


def _sizes(w: _Writer) -> bool:
    x = w.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    options = [f"{x} * {x}.shape[0]", f"{x} / ({x}.shape[-1] + 1)", f"{x} + {x}.numel()",
               f"torch.full(({x}.shape[0],), {x}.shape[-1], dtype={x}.dtype)",
               f"{x}.new_ones({x}.shape) * {x}.shape[-1] - {x}",
               f"{x} + torch.arange({x}.shape[-1], dtype={x}.dtype)",
               f"torch.zeros({x}.shape[0], 2, dtype={x}.dtype) + {x}.reshape({x}.shape[0], -1).sum(1, keepdim=True)",
               f"{x}.new_zeros({x}.shape[0] + 1)", f"{x}.view({x}.shape[0], -1).mean(1) * {x}.dim()"]
    return w.run(w.rng.choice(options), w.fresh())


def _mutate_input(w: _Writer) -> bool:
    if w.with_grad:
        return False
    x = w.pick(lambda t: t.dim() >= 1, among=w.inputs)
    if x is None:
        return False
    y = w.pick()
    options = [f"{x}.add_(1)", f"{x}[1:].mul_(2)", f"{x}[..., :{x}.shape[-1] // 2].fill_(0.5)",
               f"{x}.copy_({x}.flip(0))", f"{x}[1:].add_({x}[:-1].clone())",
               f"{x}.narrow(-1, 1, {x}.shape[-1] - 1).sub_(1)", f"{x}.mul_({y})", f"{x}.add_({y}.sum())",
               f"{x}[{x}.shape[0] - 1].zero_()", f"{x}.clamp_(max=0.5)", f"{x}[::2].neg_()",
               f"{x}.transpose(0, -1)[0].add_(3)", f"{x}.view(-1)[1:].mul_(-1)" ]
    return w.run(w.rng.choice(options))


def _mutate_intermediate(w: _Writer) -> bool:
    y = w.pick(lambda t: t.dim() >= 1 and not _shares_input(w, t), among=set(w.examples[0]) - w.inputs)
    if y is None:
        return False
    options = [f"{y}.add_(1)", f"{y}[0].zero_()", f"{y}[..., 1:].mul_(2)", f"{y}[::2].fill_(-1)",
               f"{y}.copy_({y}.flip(0))"]
    return w.run(w.rng.choice(options))


def _shares_input(w: _Writer, t: torch.Tensor) -> bool:
    storage = t.untyped_storage()._cdata
    overlapping = any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))
    return overlapping or any(w.value(x).untyped_storage()._cdata == storage for x in w.inputs)


STEPS: list[tuple[Callable[[_Writer], bool], int]] = [
    (_pointwise, 4), (_reduction, 3), (_matmul, 1), (_view, 4), (_cat, 2), (_indexing, 2), (_sizes, 2),
    (_mutate_input, 2), (_mutate_intermediate, 1),
]


def _plan(rng: random.Random, specs: list[InputSpec]) -> list[Call]:
    """Three to five calls: new sizes on the second call and mostly after it (else a change of
    layouts only), and a size of 0 or 1 now and then (the compiled code specializes them and must recompile)."""
    calls = []
    first: dict[str, int] = {}
    count = rng.randrange(3, 6)
    sizes = {"n": rng.randrange(2, 6), "m": rng.randrange(2, 6)}
    for k in range(count):
        while k == 1 and sizes == first or k > 1 and rng.random() < 0.75:
            sizes = {d: rng.choice((0, 1, 2, 3, 4, 5, 6, 7) if rng.random() < 0.15 else (2, 3, 4, 5, 6, 7))
                     for d in ("n", "m")}
            if k > 1:
                break
        first = first if k else dict(sizes)
        layouts = tuple(rng.choice(_layouts_for(spec)) if rng.random() < 0.6 else "contiguous" for spec in specs)
        calls.append(Call(tuple(sorted(sizes.items())), layouts))
    return calls


def generate(seed: int) -> ShapeProgram:
    """The program of `seed` (the same program and plan for the same seed)."""
    rng = random.Random(seed)
    with_grad = rng.random() < 0.25
    mode = rng.choice(MODES)
    specs = [InputSpec(rng.choice(SHAPES), rng.choice((torch.float32,) * 3 + (torch.float64,)), with_grad)
             for _ in range(rng.choice((1, 2, 2, 3)))]
    program = ShapeProgram(seed, "", specs, _plan(rng, specs), mode, with_grad)
    w = _Writer(rng, program)
    functions, weights = zip(*STEPS)
    for _ in range(rng.randrange(2, 7)):
        for _attempt in range(15):
            if rng.choices(functions, weights)[0](w):
                break
    made = [n for n in w.examples[0] if n not in w.inputs]
    returned = rng.sample(made, min(len(made), rng.randrange(1, 4)))
    total = w.pick(lambda t: t.numel() > 0)
    returned.append(f"{total or w.names[0]}.sum()")  # a reduction, so every frame has a graph
    lines = "\n".join(w.lines) if w.lines else "    pass"
    program.source = f"def program({', '.join(w.names)}):\n{lines}\n    return ({', '.join(returned)},)\n"
    program.fn = program.compile_source()
    return program


# ---------------------------------------------------------------------------------------------------
# The check

def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds


def _mark(program: ShapeProgram, inputs: list[torch.Tensor]) -> None:
    """mark_dynamic on every named dim of size above 1 (a size of 1 is specialized, as in eager's
    compiler, so marking it would promise what no compiler keeps)."""
    for spec, x in zip(program.inputs, inputs):
        dims = [d for d, name in enumerate(spec.dims) if isinstance(name, str) and x.shape[d] > 1]
        if dims:
            kiln.mark_dynamic(x, dims)


def _torch_specializes_too(program: ShapeProgram, backend: str) -> bool:
    """Whether torch.compile (the oracle) also refuses the first call's mark_dynamic: with its eager
    backend for Kiln's, else with aot_eager (AOT's trace of in-place ops on views specializes
    sizes that capture alone keeps symbolic; inductor adds none of its own)."""
    torch._dynamo.reset()
    inputs = program.make_inputs(0)
    for spec, x in zip(program.inputs, inputs):
        dims = [d for d, name in enumerate(spec.dims) if isinstance(name, str) and x.shape[d] > 1]
        if dims:
            torch._dynamo.mark_dynamic(x, dims)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            oracle = "eager" if backend == "eager" else "aot_eager"
            torch.compile(program.compile_source(), backend=oracle)(*inputs)
    except Exception as exc:
        return "ConstraintViolation" in type(exc).__name__
    return False


def check(program: ShapeProgram, backends: tuple[str, ...] = BACKENDS) -> str | None:
    """None if every backend agrees with eager on every call, else what differs and the repro."""
    for backend in backends:
        kiln.reset()
        compiled = kiln.compile(program.compile_source(), backend=backend, options=_options(backend),
                                dynamic=True if program.mode == "dynamic" else None)
        for k, call in enumerate(program.calls):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = outcome(program.fn, program.make_inputs(k), grad=program.with_grad)
            inputs = program.make_inputs(k)
            if program.mode == "mark" and k == 0:
                _mark(program, inputs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = outcome(compiled, inputs, grad=program.with_grad)
            fell_back = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
            if got.error == "ConstraintViolation" and expected.error is None and _torch_specializes_too(program, backend):
                break  # the program needs a marked size's value: mark_dynamic's error is right
            problems = differences(expected, got, strides=STRIDES)
            if fell_back or kiln.stats()["fallbacks"]:
                problems.insert(0, f"fell back to eager: {fell_back[:1]}")
            if problems:
                return (f"backend {backend}, call {k} {dict(call.sizes)} {list(call.layouts)}: "
                        + "\n".join(p[:600] for p in problems[:4]) + f"\n{program.repro()}")
    return None


def main() -> None:
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    backends = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else BACKENDS
    failures = 0
    for seed in range(first, first + count):
        try:
            problem = check(generate(seed), backends)
        except Exception as exc:  # a crash of the check itself is a finding too
            problem = f"check raised {exc!r}\n{generate(seed).repro()}"
        if problem:
            failures += 1
            print(f"--- seed {seed}\n{problem}\n", flush=True)
    print(f"{count - failures}/{count} programs agree with eager on {', '.join(backends)}")


if __name__ == "__main__":
    main()
