"""Random tensor programs, written as Python source, for the differential test of every backend.

`generate(seed)` builds one program: a few inputs of random shapes (sizes 0 and 1 included),
dtypes and layouts (transposed or sliced views), then a chain of pointwise, reduction, view,
indexing, matmul, normalisation, in-place and out= steps, each chosen among the steps valid for
the values made so far. The generator runs every step eagerly on example tensors as it writes
it, so it knows each value's shape and dtype and never writes a step that eager rejects.
The result is plain source (`Program.source`), which is also the repro a failure prints.
Every program also gets one numerics step (NUMERICS: half-typed accumulating scatters, narrowing
conversions of floats out of range, the integer minimum divided by -1, concatenations of gathered
values). `generate_faulting(seed)` writes programs that end in a step eager rejects (an index out of
range, an integer division or modulo by zero, a reduction without an identity over an empty dim),
for checking that compiled code raises as eager does.
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

SIZES = (0, 1, 1, 2, 3, 4, 5, 7)
FLOATS = (torch.float32, torch.float32, torch.float32, torch.float64)


@dataclass(frozen=True)
class InputSpec:
    """One argument: its shape, dtype, how its strides are made, and whether it requires grad."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str  # "contiguous", "transposed" (last two dims swapped) or "sliced" (every other row)
    requires_grad: bool = False

    def make(self, generator: torch.Generator) -> torch.Tensor:
        shape = list(self.shape)
        if self.layout == "transposed":
            shape[-1], shape[-2] = shape[-2], shape[-1]
        elif self.layout == "sliced":
            shape[0] = shape[0] * 2
        if self.dtype.is_floating_point:
            t = torch.randn(shape, dtype=self.dtype, generator=generator)
        else:
            t = torch.randint(-4, 5, shape, dtype=self.dtype, generator=generator)
        if self.layout == "transposed":
            t = t.transpose(-1, -2)
        elif self.layout == "sliced":
            t = t[::2]
        assert tuple(t.shape) == self.shape
        return t.requires_grad_(self.requires_grad)

    def source(self) -> str:
        return f"InputSpec({self.shape}, {self.dtype}, {self.layout!r}, requires_grad={self.requires_grad})"


@dataclass
class Program:
    """A generated program: its source (defines `program`), its inputs, and whether it is
    checked with gradients (then nothing mutates an input and no out= is used)."""

    seed: int
    source: str
    inputs: list[InputSpec]
    with_grad: bool
    fn: Callable[..., Any] = field(repr=False, default=None)  # type: ignore[assignment]

    def compile_source(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), namespace)
        return namespace["program"]

    def make_inputs(self) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        return [spec.make(generator) for spec in self.inputs]

    def repro(self) -> str:
        specs = ", ".join(spec.source() for spec in self.inputs)
        return f"# seed {self.seed}, gradients: {self.with_grad}; inputs: [{specs}]\n{self.source}"


class _Writer:
    """Keeps the example value of every name written so far and appends valid steps."""

    def __init__(self, rng: random.Random, with_grad: bool) -> None:
        self.rng = rng
        self.with_grad = with_grad
        self.lines: list[str] = []
        self.values: dict[str, torch.Tensor] = {}
        self.inputs: list[str] = []
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def pick(self, want: Callable[[torch.Tensor], bool] = lambda t: True) -> str | None:
        names = [n for n, v in self.values.items() if want(v)]
        return self.rng.choice(names) if names else None

    def emit(self, expr: str, *, name: str | None = None) -> bool:
        """Evaluate `expr` on the examples; keep the line if eager accepts it."""
        name = name or self.fresh()
        scope = dict(self.values, torch=torch)
        try:
            with torch.no_grad():
                value = eval(expr, scope)  # noqa: S307 - the generator's own expressions
        except Exception:
            return False
        if not isinstance(value, torch.Tensor) or value.numel() > 4096:
            return False
        self.values[name] = value
        self.lines.append(f"    {name} = {expr}")
        return True

    def statement(self, line: str) -> bool:
        """A statement that mutates values in place (in-place ops, out=, item assignment): run on
        copies of the examples, kept (and the copies adopted) if eager accepts it."""
        scope: dict[str, Any] = {n: v.clone() for n, v in self.values.items()}
        scope["torch"] = torch
        try:
            with torch.no_grad():
                exec(line, scope)  # noqa: S102 - the generator's own statements
        except Exception:
            return False
        self.values = {n: scope[n] for n in self.values}
        self.lines.append(f"    {line}")
        return True


def _floating(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def _pointwise(w: _Writer) -> bool:
    a = w.pick()
    if a is None:
        return False
    unary = ["torch.abs({a})", "-{a}", "{a} * 3", "{a} + 1", "{a} // 2", "torch.clamp({a}, -2, 2)",
             "torch.where({a} > 0, {a}, {a} * 2)"]
    if _floating(w.values[a]):
        unary += ["torch.sin({a})", "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})",
                  "torch.sqrt(torch.abs({a}) + 1)", "torch.log1p(torch.abs({a}))", "torch.exp(torch.tanh({a}))",
                  "torch.nn.functional.gelu({a})", "{a} / 3", "{a}.float()", "{a} ** 2"]
    else:
        unary += ["{a}.to(torch.float32)", "{a} % 3", "{a} * {a}"]
    if w.rng.random() < 0.6:
        return w.emit(w.rng.choice(unary).format(a=a))
    b = w.pick(lambda t: t is not w.values[a])
    if b is None:
        return False
    binary = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})", "torch.where({a} > {b}, {a}, {b})"]
    return w.emit(w.rng.choice(binary).format(a=a, b=b))


def _reduction(w: _Writer) -> bool:
    a = w.pick(lambda t: t.dim() > 0)
    if a is None:
        return False
    t = w.values[a]
    dim = w.rng.randrange(t.dim())
    keep = w.rng.random() < 0.5
    options = [f"{a}.sum({dim}, keepdim={keep})", f"{a}.amax({dim}, keepdim={keep})", f"{a}.sum()"]
    if _floating(t):
        options += [f"{a}.mean({dim}, keepdim={keep})", f"torch.cumsum({a}, {dim})", f"{a}.var({dim})"]
    return w.emit(w.rng.choice(options))


def _view(w: _Writer) -> bool:
    a = w.pick()
    if a is None:
        return False
    t = w.values[a]
    options = [f"{a}.reshape(-1)", f"{a}.unsqueeze(0)", f"{a}.flatten()"]
    if t.dim() >= 2:
        options += [f"{a}.transpose(0, 1)", f"{a}.t().contiguous()" if t.dim() == 2 else f"{a}.permute(1, 0, *range(2, {t.dim()}))",
                    f"{a}[:, ::2]", f"{a}.reshape({t.shape[0]}, -1)" if t.shape[0] else f"{a}.reshape(0, {t.shape[1]})"]
    if t.dim() >= 1:
        options += [f"{a}[1:]", f"{a}.narrow(0, 0, {t.shape[0] // 2})", f"{a}.expand(2, *{tuple(t.shape)})",
                    f"{a}.view({tuple(t.shape)})"]
    return w.emit(w.rng.choice(options))


def _indexing(w: _Writer) -> bool:
    a = w.pick(lambda t: t.dim() > 0 and t.shape[0] > 0)
    if a is None:
        return False
    n = w.values[a].shape[0]
    index = [w.rng.randrange(n) for _ in range(w.rng.randrange(1, 4))]
    options = [f"{a}[torch.tensor({index})]", f"{a}[{index[0]}]", f"{a}.index_select(0, torch.tensor({index}))",
               f"{a}[..., 0]", f"{a}[{a} > 0]" if False else f"{a}.flip(0)"]
    return w.emit(w.rng.choice(options))


def _matmul(w: _Writer) -> bool:
    a = w.pick(lambda t: t.dim() == 2 and _floating(t))
    if a is None:
        return False
    t = w.values[a]
    b = w.pick(lambda u: u.dim() == 2 and u.dtype == t.dtype and u.shape[0] == t.shape[1])
    options = [f"{a} @ {a}.t()", f"torch.mm({a}.t(), {a})"]
    if b is not None:
        options.append(f"torch.matmul({a}, {b})")
    return w.emit(w.rng.choice(options))


def _normalisation(w: _Writer) -> bool:
    a = w.pick(lambda t: _floating(t) and t.dim() > 0)
    if a is None:
        return False
    t = w.values[a]
    options = [f"torch.softmax({a}, -1)", f"torch.log_softmax({a}, 0)",
               f"torch.nn.functional.layer_norm({a}, {tuple(t.shape[-1:])})",
               f"torch.nn.functional.normalize({a}, dim=-1)"]
    return w.emit(w.rng.choice(options))


def _mutation(w: _Writer) -> bool:
    """In-place ops on values made in the program or on an input, item assignment and out=
    calls (never in programs checked with gradients)."""
    if w.with_grad:
        return False
    a = w.pick(_floating)
    if a is None:
        return False
    kind = w.rng.randrange(4)
    if kind == 2 and w.inputs:
        x = w.rng.choice(w.inputs)
        return _floating(w.values[x]) and w.statement(f"{x}.mul_(0.5)")
    name = w.fresh()
    if kind == 1:
        shape = tuple(w.values[a].shape) if w.rng.random() < 0.7 else (0,)
        if not w.emit(f"torch.empty({shape}, dtype={w.values[a].dtype})", name=name):
            return False
        call = w.rng.choice([f"torch.mul({a}, 2, out={name})", f"torch.add({a}, {a}, out={name})",
                             f"torch.sin({a}, out={name})", f"torch.sum({a}, -1, out={name})"])
        return w.statement(call)
    if not w.emit(f"{a}.clone()", name=name):
        return False
    if kind == 3:
        return w.statement(f"{name}[0] = 7")
    return w.statement(f"{name}." + w.rng.choice(["add_(1)", "mul_(2)", "clamp_(min=0)", f"sub_({a})"]))


STEPS = [_pointwise, _pointwise, _reduction, _view, _indexing, _matmul, _normalisation, _mutation]


# ----------------------------------------------------------------------------- numerics steps
# Each program gets one of these after its other steps (drawn from their own random stream, so the
# steps above, and the seeds kept as regression tests, are the programs they were), on the edges of
# numerics where kernels and ATen's CPU kernels must agree bit for bit: accumulating scatters into
# float16/bfloat16, float -> narrow int conversions of values out of range, the integer minimum
# divided by -1, and concatenations of gathered values. Their inputs are the program's inputs
# (exact values: a conversion would turn a last-bit difference upstream into a different integer)
# or made from them by exact steps, detached when the program is checked with gradients.

_SMALL = 64  # elements at most in a tensor whose indices are written out as a literal


def _source_tensor(w: _Writer, want: Callable[[torch.Tensor], bool]) -> str | None:
    """An input (exact values) that `want` accepts, detached in gradient programs."""
    names = [n for n in w.inputs if want(w.values[n])]
    if not names:
        return None
    name = w.rng.choice(names)
    return f"{name}.detach()" if w.with_grad else name


def _literal_index(w: _Writer, high: int, shape: tuple[int, ...], *, crowded: bool = False) -> str:
    """torch.tensor(...) of `shape` with values in [0, high): `crowded` piles them on few rows, so
    that accumulating scatters add many values into one place."""
    count = 1
    for size in shape:
        count *= size
    top = min(high, 2) if crowded else high
    values = [w.rng.randrange(top) for _ in range(count)]
    return f"torch.tensor({values}).reshape({tuple(shape)})"


def _half_scatter(w: _Writer) -> bool:
    """index_add / scatter_add / index_put(accumulate) / scatter_reduce / index_reduce into a
    float16 or bfloat16 tensor, and the value back in float32."""
    a = _source_tensor(w, lambda t: _floating(t) and t.dim() > 0 and 0 < t.numel() <= _SMALL)
    if a is None:
        return False
    t = w.values[a.removesuffix(".detach()")]
    half = w.rng.choice(["torch.bfloat16", "torch.float16"])
    dim = w.rng.randrange(t.dim())
    n = t.shape[dim]
    x = f"({a} * 4).to({half})"
    src = f"({a}.abs() * 0.03125 + 0.25).to({half})"  # small addends: rounding after each add shows
    rows = _literal_index(w, n, (n,), crowded=True)
    full = _literal_index(w, n, tuple(t.shape), crowded=True)
    options = [f"{x}.index_add({dim}, {rows}, {src})", f"{x}.index_add({dim}, {rows}, {src}, alpha=2)",
               f"{x}.scatter_add({dim}, {full}, {src})",
               f"{x}.scatter_reduce({dim}, {full}, {src}, {w.rng.choice(['sum', 'mean', 'amax', 'prod'])!r})",
               f"{x}.index_reduce({dim}, {rows}, {src}, {w.rng.choice(['prod', 'mean', 'amin'])!r})"]
    if dim == 0:
        options.append(f"{x}.index_put(({rows},), {src}, accumulate=True)")
    return w.emit(f"{w.rng.choice(options)}.float()")


def _narrowing(w: _Writer) -> bool:
    """A float -> uint8/int8/int16/int32/int64/bool conversion of values the target cannot hold
    (negative to unsigned, past the range, infinities and NaN)."""
    a = _source_tensor(w, _floating)
    if a is None:
        return False
    target = w.rng.choice(["torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64", "torch.bool"])
    value = w.rng.choice([f"({a} * 1024)", f"({a} * 2 ** 40)", f"({a} * 2 ** 70)", f"({a} / 0)",
                          f"torch.where({a} < 0, -300.0, {a} * 256)", f"({a} * 1024).clamp(min=-100)",
                          f"({a} * 1024).half()", f"({a} * 1024).bfloat16()"])
    return w.emit(f"{value}.to({target})")


def _int_min_division(w: _Writer) -> bool:
    """The integer type's minimum divided by -1 (eager wraps; x86's division traps): //, %, fmod,
    remainder and floor division, by a scalar or a tensor holding -1. Never rounding_mode='trunc',
    which traps in eager itself (and would kill the generator)."""
    a = _source_tensor(w, lambda t: t.numel() > 0)
    if a is None:
        return False
    dtype, low = w.rng.choice([("torch.int64", -2 ** 63), ("torch.int32", -2 ** 31), ("torch.int16", -2 ** 15),
                               ("torch.int8", -2 ** 7)])
    ints = f"torch.where({a} > 0, {low}, 7).to({dtype})"
    divisor = w.rng.choice(["-1", f"torch.where({a} < 1, -1, 3).to({dtype})"])
    op = w.rng.choice(["{x} // {d}", "{x} % {d}", "torch.fmod({x}, {d})", "torch.remainder({x}, {d})",
                       "torch.div({x}, {d}, rounding_mode='floor')"])
    return w.emit(op.format(x=ints, d=divisor))


def _cat_of_gathered(w: _Writer) -> bool:
    """A concatenation (cat, stack, pad) one part of which is gathered (gather, index_select,
    x[i], take, embedding): each part must be read only where the output takes it."""
    a = _source_tensor(w, lambda t: t.dim() > 0 and 0 < t.numel() <= _SMALL)
    if a is None:
        return False
    t = w.values[a.removesuffix(".detach()")]
    dim = w.rng.randrange(t.dim())
    n = t.shape[dim]
    rows = _literal_index(w, n, (w.rng.randint(1, 4),))
    full = _literal_index(w, n, tuple(t.shape))
    lead = ":, " * dim
    gathered = w.rng.choice([f"{a}.gather({dim}, {full})", f"{a}.index_select({dim}, {rows})",
                             f"{a}[{lead}{rows}]", f"torch.take({a}, {_literal_index(w, t.numel(), tuple(t.shape))})"])
    options = [f"torch.cat([{a} * 2, {gathered}], {dim})", f"torch.cat([{gathered}, {a}, {gathered}], {dim})"]
    if gathered.startswith(f"{a}.gather") or gathered.startswith("torch.take"):  # same shape as a
        options += [f"torch.stack([{a}, {gathered}], {dim})", f"torch.where({a} > 0, {a}, {gathered})"]
    options.append(f"torch.nn.functional.pad({gathered}, (1, 2))" if _floating(t) else f"torch.cat([{gathered}, {a}])")
    if t.dim() == 2 and _floating(t):
        options.append(f"torch.cat([{a}, torch.nn.functional.embedding({_literal_index(w, n, (3,))}, {a})], 0)")
    return w.emit(w.rng.choice(options))


NUMERICS = [_half_scatter, _narrowing, _int_min_division, _cat_of_gathered]


def _fault(w: _Writer) -> str | None:
    """A last step that eager rejects on the example values: an index out of range (indexing,
    index_select, gather, take, embedding, and the writes scatter_add, index_add, index_put_;
    constant or computed in the program), max/argmax/aminmax over an empty dim, or an integer
    division or modulo by zero. Returns the step's name, or None when this try found none."""
    rng = w.rng
    if rng.random() < 0.5:
        a = w.pick(lambda t: t.dim() > 0 and t.numel() > 0)
        if a is None:
            return None
        t = w.values[a]
        dim = rng.randrange(t.dim())
        size = t.shape[dim]
        bad = rng.choice([size, size + 3, -size - 1])
        computed = f"(torch.zeros_like({a}, dtype=torch.long).sum().reshape(1) + {bad})"  # made at run time
        index = rng.choice([f"torch.tensor([{bad}])", computed])
        lead = ":, " * dim
        options = [f"{a}[{lead}{index}]", f"{a}.index_select({dim}, {index})",
                   f"torch.gather({a}, {dim}, torch.full({tuple(t.shape)}, {bad}))",
                   f"torch.take({a}, torch.tensor([{t.numel()}]))"]
        if t.dim() == 2 and _floating(t):
            options.append(f"torch.nn.functional.embedding({index}.abs(), {a})")
        # writes: an index past the end must raise before anything is stored out of bounds
        options += [f"torch.scatter_add({a}, {dim}, torch.full({tuple(t.shape)}, {bad}), {a})",
                    f"torch.index_add({a}, {dim}, {index}, {a}.narrow({dim}, 0, 1))",
                    f"torch.index_add({a}, {dim}, {index}.int(), {a}.narrow({dim}, 0, 1), alpha=2)"]
        if dim == 0:
            accumulate = rng.choice([True, False])
            options.append(f"{a}.clone().index_put_(({index},), {a}[:1], accumulate={accumulate})")
        expr = rng.choice(options)
    elif rng.random() < 0.3:
        # a reduction without an identity over an empty dim: empty while compiling, or only at run
        # time (nonzero's count)
        a = w.pick(lambda t: t.dim() > 0)
        if a is None:
            return None
        empty = rng.choice([f"{a}[:0]", f"{a}.narrow(0, 0, 0)", f"{a}[torch.nonzero({a} > 1e9)[:, 0]]",
                            f"torch.nonzero({a} > 1e9).to({a}.dtype)"])
        expr = rng.choice([f"{empty}.max()", f"{empty}.amin(0)", f"{empty}.argmax()", f"torch.aminmax({empty})",
                           f"{empty}.max(0).values", f"{empty}.argmin(0)"])
    else:
        a = w.pick(lambda t: t.numel() > 0)
        if a is None:
            return None
        ints = a if not _floating(w.values[a]) else f"({a} * 4).to(torch.int64)"
        expr = rng.choice([f"{ints} // 0", f"{ints} % 0", f"{ints} // ({ints} * 0)", f"torch.remainder({ints}, {ints} * 0)",
                           f"torch.div({ints}, {ints} * 0, rounding_mode='trunc')", f"torch.fmod({ints}, 0)"])
    name = w.fresh()
    scope = dict(w.values, torch=torch)
    try:
        with torch.no_grad():
            eval(expr, scope)  # noqa: S307 - the generator's own expressions
    except (IndexError, RuntimeError):
        w.lines.append(f"    {name} = {expr}  # eager raises")
        return name
    return None


def _input_spec(rng: random.Random, with_grad: bool) -> InputSpec:
    rank = rng.choice((0, 1, 2, 2, 3))
    shape = tuple(rng.choice(SIZES) for _ in range(rank))
    dtype = rng.choice(FLOATS) if with_grad or rng.random() < 0.85 else torch.int64
    layout = "contiguous"
    if rank >= 2 and rng.random() < 0.3:
        layout = rng.choice(("transposed", "sliced"))
    return InputSpec(shape, dtype, layout, requires_grad=with_grad and dtype.is_floating_point)


def generate(seed: int, *, grad_share: float = 0.3, numerics: bool = True) -> Program:
    """One random program; the same seed always gives the same program. `numerics=False` leaves
    out its numerics step (the program it was before NUMERICS existed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's warnings on the examples (var of one element ...)
        return _generate(seed, grad_share, numerics=numerics)


def generate_faulting(seed: int, *, grad_share: float = 0.3) -> Program:
    """A random program that ends in a step eager rejects (an index out of range, an integer
    division by zero): compiled code must raise eager's exception type. Its own stream of seeds
    (seed n here is not generate(n) with a step more)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _generate(seed, grad_share, fault=True)


def _generate(seed: int, grad_share: float, fault: bool = False, numerics: bool = True) -> Program:
    rng = random.Random(f"fault-{seed}" if fault else seed)
    with_grad = rng.random() < grad_share
    specs = [_input_spec(rng, with_grad) for _ in range(rng.randint(1, 3))]
    w = _Writer(rng, with_grad)
    generator = torch.Generator().manual_seed(seed)
    for k, spec in enumerate(specs):
        name = f"x{k}"
        w.values[name] = spec.make(generator).detach()
        w.inputs.append(name)
    steps = rng.randint(3, 8)
    made = 0
    attempts = 0
    while made < steps and attempts < steps * 6:
        attempts += 1
        if rng.choice(STEPS)(w):
            made += 1
    results = [n for n in w.values if n not in w.inputs][-3:] or list(w.inputs)
    if numerics and not fault:
        # one numerics step, from its own random stream (see NUMERICS), the families in turn
        rng_of_steps, w.rng = w.rng, random.Random(f"numerics-{seed}")
        step = NUMERICS[seed % len(NUMERICS)]
        added = next((name for _ in range(10) if step(w) for name in [list(w.values)[-1]]), None)
        w.rng = rng_of_steps
        if added is not None:
            results.append(added)
    if fault:
        faulting = None
        for _ in range(20):
            faulting = faulting or _fault(w)
        if faulting is None:  # nothing fits (every value is empty): divide a fresh tensor by zero
            w.lines.append("    fallback = torch.ones(2, dtype=torch.int64) // 0  # eager raises")
            faulting = "fallback"
        results = results[-2:] + [faulting]
    args = ", ".join(w.inputs)
    source = f"def program({args}):\n" + "\n".join(w.lines) + f"\n    return ({', '.join(results)},)\n"
    program = Program(seed, source, specs, with_grad)
    program.fn = program.compile_source()
    return program


__all__ = ["InputSpec", "Program", "generate", "generate_faulting"]
