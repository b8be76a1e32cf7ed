"""Random tensor programs, written as Python source, for the differential test of every backend.

`generate(seed)` builds one program: a few inputs of random shapes (sizes 0 and 1 included),
dtypes and layouts (transposed or sliced views), then a chain of pointwise, reduction, view,
indexing, matmul, normalisation, in-place and out= steps, each chosen among the steps valid for
the values made so far. The generator runs every step eagerly on example tensors as it writes
it, so it knows each value's shape and dtype and never writes a step that eager rejects.
The result is plain source (`Program.source`), which is also the repro a failure prints.
`generate_faulting(seed)` writes programs that end in a step eager rejects (an index out of range,
an integer division or modulo by zero), for checking that compiled code raises as eager does.
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


def _fault(w: _Writer) -> str | None:
    """A last step that eager rejects on the example values: an index out of range (indexing,
    index_select, gather, take, embedding, and the writes scatter_add, index_add, index_put_;
    constant or computed in the program) or an integer
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


def generate(seed: int, *, grad_share: float = 0.3) -> Program:
    """One random program; the same seed always gives the same program."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's warnings on the examples (var of one element ...)
        return _generate(seed, grad_share)


def generate_faulting(seed: int, *, grad_share: float = 0.3) -> Program:
    """A random program that ends in a step eager rejects (an index out of range, an integer
    division by zero): compiled code must raise eager's exception type. Its own stream of seeds
    (seed n here is not generate(n) with a step more)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _generate(seed, grad_share, fault=True)


def _generate(seed: int, grad_share: float, fault: bool = False) -> Program:
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
