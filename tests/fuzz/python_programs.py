"""Random Python-semantics programs, written as source, for the differential test of capture.

`generate(seed, fullgraph)` writes one `def program(x, y, obj, mod, store)`: a chain of steps over
containers (lists, dicts and their live views, tuples, comprehensions, star unpacking, slicing),
closures (inner functions over tensors, nonlocal counters, lambdas through map), calls with
defaults, *args and **kwargs, nested and starred unpacking, small sets of ints, attribute reads
and writes on a user object (a property, a method, a counter) and on an nn.Module (submodules, a
ModuleList, a function attribute, a counter), try/except/finally with raises of several kinds, ints
and strings known at trace time, and tensor work mixed into all of it. Side effects go to `store`,
`obj` and `mod`. With fullgraph=False the program may also break (a print, a data-dependent branch).
The generator tracks each value's kind (and each list's length and dict's keys), so it writes only
steps that run, and checks the program eagerly before handing it out. The source is the repro.
"""
from __future__ import annotations

import contextlib
import io
import linecache
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


class FuzzError(Exception):
    """The user exception the programs raise and catch (an attribute read in the handler)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class Holder:
    """The user object each program reads and writes."""

    def __init__(self) -> None:
        self.scale = 1.5
        self.count = 0
        self.items: list = []

    @property
    def double(self) -> float:
        return self.scale * 2

    def scaled(self, v: torch.Tensor) -> torch.Tensor:
        return v * self.scale + self.count


class Block(nn.Module):
    """The module each program calls into."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3)])
        self.act = torch.relu
        self.scale = 0.5
        self.calls = 0

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.lin(v) * self.scale


NAMESPACE = {"torch": torch, "FuzzError": FuzzError}


@dataclass
class PyProgram:
    """A generated program: its source (defines `program`) and how to make its arguments."""

    seed: int
    fullgraph: bool
    source: str

    @property
    def filename(self) -> str:
        return f"<python program {self.seed}{' fullgraph' if self.fullgraph else ''}>"

    def compile_source(self) -> Callable[..., Any]:
        # registered with linecache so tracebacks and break messages show the generated line
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        namespace = dict(NAMESPACE)
        exec(compile(self.source, self.filename, "exec"), namespace)  # noqa: S102 - our own source
        return namespace["program"]

    def calls(self) -> list[tuple[torch.Tensor, torch.Tensor, Holder, Block, list]]:
        """The arguments of two calls: new tensors, the same object, module and store (which the
        first call changed, so the second checks the guards on what it read)."""
        generator = torch.Generator().manual_seed(self.seed)
        torch.manual_seed(self.seed)  # Block's weights
        obj, mod, store = Holder(), Block(), []
        return [(torch.randn(3, generator=generator), torch.randn(3, generator=generator), obj, mod, store)
                for _ in range(2)]

    def repro(self) -> str:
        return (f"# python program seed {self.seed}, fullgraph={self.fullgraph}; "
                f"arguments: PyProgram.calls() in tests/fuzz/python_programs.py\n{self.source}")


@dataclass
class _Writer:
    """The program being written: its lines and what each name holds."""

    rng: random.Random
    fullgraph: bool
    lines: list[str] = field(default_factory=list)
    tensors: list[str] = field(default_factory=lambda: ["x", "y"])
    ints: list[str] = field(default_factory=list)
    lists: dict[str, int] = field(default_factory=dict)  # list of tensors -> its length
    dicts: dict[str, list[str]] = field(default_factory=dict)  # dict of tensors -> its keys
    views: dict[str, str] = field(default_factory=dict)  # keys view -> its dict
    functions: list[str] = field(default_factory=list)  # tensor -> tensor
    obj_has_w: bool = False
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, *lines: str, indent: int = 1) -> None:
        self.lines.extend("    " * indent + line for line in lines)

    def tensor(self) -> str:
        return self.rng.choice(self.tensors[-6:])

    def constant(self) -> str:
        if self.ints and self.rng.random() < 0.4:
            return self.rng.choice(self.ints)
        return self.rng.choice(["2", "0.5", "3", "-1.25", "obj.scale", "mod.scale"])

    def tensor_expression(self) -> str:
        a, b, c = self.tensor(), self.tensor(), self.constant()
        return self.rng.choice([
            f"{a} + {b}", f"{a} * {b}", f"{a} - {c}", f"{a} * {c}", f"torch.sin({a})", f"{a}.relu() + {c}",
            f"torch.tanh({a}) * {c}", f"{a}.clamp(min=-1.0)", f"torch.where({a} > 0, {a}, {b})",
            f"{a}.abs().sqrt()", f"torch.maximum({a}, {b})", f"({a} * {b}).cumsum(0)",
        ])

    def new_tensor(self, expression: str, indent: int = 1) -> str:
        name = self.fresh("t")
        self.emit(f"{name} = {expression}", indent=indent)
        self.tensors.append(name)
        return name

    def new_int(self, expression: str) -> str:
        name = self.fresh("n")
        self.emit(f"{name} = {expression}")
        self.ints.append(name)
        return name

    def new_list(self, expression: str, length: int) -> str:
        name = self.fresh("l")
        self.emit(f"{name} = {expression}")
        self.lists[name] = length
        return name

    def new_dict(self, expression: str, keys: list[str]) -> str:
        name = self.fresh("d")
        self.emit(f"{name} = {expression}")
        self.dicts[name] = keys
        return name


def _tensor_step(w: _Writer) -> None:
    if w.rng.random() < 0.5 and len(w.tensors) > 2:
        target = w.rng.choice(w.tensors[2:])
        w.emit(f"{target} = {w.tensor_expression()}")
    else:
        w.new_tensor(w.tensor_expression())


def _int_step(w: _Writer) -> None:
    options = [f"{w.rng.randint(1, 4)}", f"len({w.tensor()})", "obj.count + 1", "mod.calls * 2 + 1"]
    if w.ints:
        n = w.rng.choice(w.ints)
        options += [f"{n} + {w.rng.randint(1, 3)}", f"max({n}, 2)", f"{n} // 2 + 1", f"{n} % 3"]
    options += [f"len({name})" for name in list(w.lists)[-2:] + list(w.dicts)[-2:] + list(w.views)[-2:]]
    w.new_int(w.rng.choice(options))


def _list_make(w: _Writer) -> None:
    a, b = w.tensor(), w.tensor()
    choice = w.rng.randrange(5)
    if choice == 0 or not w.lists:
        w.new_list(f"[{a}, {b}, {a} * 2]", 3)
    elif choice == 1:
        source = w.rng.choice(list(w.lists))
        w.new_list(f"[v * {w.constant()} for v in {source}]", w.lists[source])
    elif choice == 2:
        k = w.rng.randint(1, 3)
        w.new_list(f"[{a} + i for i in range({k})]", k)
    elif choice == 3:
        source = w.rng.choice(list(w.lists))
        w.new_list(f"{source}[::-1]", w.lists[source])
    else:
        source = w.rng.choice(list(w.lists))
        w.new_list(f"{source}[1:] + [{a}]", max(w.lists[source] - 1, 0) + 1)


def _list_mutate(w: _Writer) -> None:
    if not w.lists:
        return _list_make(w)
    name = w.rng.choice(list(w.lists))
    n = w.lists[name]
    choice = w.rng.randrange(5)
    if choice == 0:
        w.emit(f"{name}.append({w.tensor_expression()})")
        w.lists[name] = n + 1
    elif choice == 1:
        w.emit(f"{name}.extend([{w.tensor()}, {w.tensor()}])")
        w.lists[name] = n + 2
    elif choice == 2 and n > 0:
        w.new_tensor(f"{name}.pop()")
        w.lists[name] = n - 1
    elif choice == 3 and n > 0:
        w.emit(f"{name}[{w.rng.randrange(n)}] = {w.tensor()} * 3")
    else:
        w.emit(f"{name}.insert(0, {w.tensor()})")
        w.lists[name] = n + 1


def _list_read(w: _Writer) -> None:
    usable = [name for name, n in w.lists.items() if n > 0]
    if not usable:
        return _list_make(w)
    name = w.rng.choice(usable)
    n = w.lists[name]
    choice = w.rng.randrange(5)
    if choice == 0:
        w.new_tensor(f"{name}[{w.rng.randrange(-n, n)}]")
    elif choice == 1:
        w.new_tensor(f"sum({name})")
    elif choice == 2:
        w.new_tensor(f"torch.stack({name}).sum(0)")
    elif choice == 3:
        first, rest = w.fresh("t"), w.fresh("l")
        w.emit(f"{first}, *{rest} = {name}")
        w.tensors.append(first)
        w.lists[rest] = n - 1
    else:
        a, b = w.fresh("t"), w.fresh("t")
        w.emit(f"{a}, {b} = {name}[0], {name}[-1]")
        w.tensors += [a, b]


def _dict_make(w: _Writer) -> None:
    a, b = w.tensor(), w.tensor()
    choice = w.rng.randrange(4)
    if choice == 0 or not w.dicts:
        w.new_dict(f'{{"a": {a}, "b": {b}}}', ["a", "b"])
    elif choice == 1:
        w.new_dict(f'dict(zip(["p", "q"], [{a}, {b}]))', ["p", "q"])
    elif choice == 2:
        source = w.rng.choice(list(w.dicts))
        w.new_dict(f"{{k: v * {w.constant()} for k, v in {source}.items()}}", list(w.dicts[source]))
    else:
        source = w.rng.choice(list(w.dicts))
        keys = list(w.dicts[source]) + ([] if "z" in w.dicts[source] else ["z"])
        w.new_dict(f"dict({source}, z={a})", keys)


def _dict_mutate(w: _Writer) -> None:
    if not w.dicts:
        return _dict_make(w)
    name = w.rng.choice(list(w.dicts))
    keys = w.dicts[name]
    choice = w.rng.randrange(4)
    key = f"k{w.counter}"
    if choice == 0:
        w.emit(f'{name}["{key}"] = {w.tensor_expression()}')
        keys.append(key)
    elif choice == 1 and keys:
        popped = w.rng.choice(keys)
        w.new_tensor(f'{name}.pop("{popped}")')
        keys.remove(popped)
    elif choice == 2:
        w.emit(f'{name}.update({{"{key}": {w.tensor()}}})')
        keys.append(key)
    else:
        w.emit(f'{name}.setdefault("{key}", {w.tensor()})')
        keys.append(key)


def _dict_read(w: _Writer) -> None:
    usable = [name for name, keys in w.dicts.items() if keys]
    if not usable:
        return _dict_make(w)
    name = w.rng.choice(usable)
    choice = w.rng.randrange(5)
    if choice == 0:
        w.new_tensor(f'{name}["{w.rng.choice(w.dicts[name])}"]')
    elif choice == 1:
        w.new_tensor(f'{name}.get("missing", {w.tensor()})')
    elif choice == 2:
        acc = w.new_tensor(f"{w.tensor()} * 0")
        w.emit(f"for key, value in {name}.items():", f"    {acc} = {acc} + value * len(key)")
    elif choice == 3:
        view = w.fresh("kv")
        w.emit(f"{view} = {name}.keys()")
        w.views[view] = name
    else:
        w.new_int(f'int("{w.rng.choice(w.dicts[name])}" in {name}) + len(list({name}))')


def _closure_step(w: _Writer) -> None:
    choice = w.rng.randrange(4)
    if choice == 0:
        name, captured = w.fresh("f"), w.tensor()
        w.emit(f"def {name}(v):", f"    return v * {w.constant()} + {captured}")
        w.functions.append(name)
    elif choice == 1:
        name, cell = w.fresh("g"), w.fresh("c")
        w.emit(f"{cell} = 0", f"def {name}(v):", f"    nonlocal {cell}", f"    {cell} += 1", f"    return v + {cell}")
        w.functions.append(name)
        w.ints.append(cell)
    elif choice == 2:
        name = w.fresh("h")
        w.emit(f"{name} = lambda v: torch.cos(v) * {w.constant()}")
        w.functions.append(name)
    elif w.functions:
        function = w.rng.choice(w.functions)
        if w.lists and w.rng.random() < 0.5:
            source = w.rng.choice(list(w.lists))
            w.new_list(f"list(map({function}, {source}))", w.lists[source])
        else:
            w.new_tensor(f"{function}({w.tensor()})")


def _object_step(w: _Writer) -> None:
    choice = w.rng.randrange(8)
    if choice == 0:
        w.emit(f"obj.w = {w.tensor_expression()}")
        w.obj_has_w = True
    elif choice == 1:
        w.emit("obj.count += 1")
    elif choice == 2:
        w.new_tensor(f"obj.scaled({w.tensor()})")
    elif choice == 3:
        w.new_tensor(f"{w.tensor()} * obj.double")
    elif choice == 4:
        w.new_tensor(f'{w.tensor()} * getattr(obj, "missing", 1.5) + (obj.w if hasattr(obj, "w") else 0)')
    elif choice == 5:
        w.emit(f"obj.scale = obj.scale + {w.rng.choice(['0.25', '1'])}")
    elif choice == 6:
        w.emit(f"obj.items.append({w.tensor()} * 2)")
    else:
        w.new_tensor(f"{w.tensor()} * len(obj.items)")


def _module_step(w: _Writer) -> None:
    choice = w.rng.randrange(6)
    a = w.tensor()
    if choice == 0:
        w.new_tensor(f"mod.lin({a})")
    elif choice == 1:
        w.new_tensor(f"mod.act({a}) * mod.scale")
    elif choice == 2:
        w.new_tensor(f"mod.layers[{w.rng.randrange(-3, 3)}]({a})")
    elif choice == 3:
        target = w.new_tensor(a)
        w.emit("for layer in mod.layers:", f"    {target} = layer({target})")
    elif choice == 4:
        w.emit("mod.calls += 1")
    else:
        w.new_tensor(f"mod({a})")


def _exception_step(w: _Writer) -> None:
    target = w.rng.choice(w.tensors)
    if target in ("x", "y"):
        target = w.new_tensor(f"{target} * 1")
    kind = w.rng.randrange(5)
    body = [f"{target} = {target} + 1"]
    handler = "Exception"
    if kind == 0:
        body.append('raise ValueError("boom")')
        handler = "ValueError"
    elif kind == 1 and w.dicts:
        body.append(f'{target} = {target} + {w.rng.choice(list(w.dicts))}["absent"]')
        handler = "KeyError"
    elif kind == 2 and w.lists:
        name = w.rng.choice(list(w.lists))
        body.append(f"{target} = {name}[{w.lists[name] + 5}]")
        handler = "IndexError"
    elif kind == 3:
        body.append(f"raise FuzzError({w.rng.randint(1, 9)})")
        handler = "FuzzError as err"
    lines = ["try:"] + [f"    {line}" for line in body]
    lines += [f"except {handler}:", f"    {target} = {target} * {'err.code' if 'err' in handler else '2'}"]
    if w.rng.random() < 0.5:
        lines += ["finally:", f"    store.append({w.rng.randint(0, 9)})"]
    w.emit(*lines)


def _control_step(w: _Writer) -> None:
    choice = w.rng.randrange(4)
    target = w.rng.choice(w.tensors[2:] or [w.new_tensor(w.tensor_expression())])
    if choice == 0:
        condition = f"{w.rng.choice(w.ints)} > 2" if w.ints else "obj.count > 0"
        w.emit(f"if {condition}:", f"    {target} = {target} * 2", "else:", f"    {target} = {target} - 1")
    elif choice == 1:
        w.emit(f"for k in range({w.rng.randint(1, 3)}):", f"    {target} = {target} * 0.5 + k")
    elif choice == 2 and w.lists:
        w.emit(f"for i, v in enumerate({w.rng.choice(list(w.lists))}):", f"    {target} = {target} + v * i")
    else:
        w.emit(f'label = f"{{obj.count}}-{{len({target})}}"', f"{target} = {target} + len(label)")


def _call_step(w: _Writer) -> None:
    """Calls with every argument form: defaults, *args from a list, **kwargs from a dict, keyword-only."""
    name = w.fresh("call")
    w.emit(f"def {name}(a, b=1.0, *rest, scale=1.0, **extra):",
           "    return (a + b) * scale + len(rest) + len(extra)")
    usable = [n for n, length in w.lists.items() if length > 0]
    choice = w.rng.randrange(3)
    if choice == 0 and usable:
        w.new_tensor(f"{name}(*{w.rng.choice(usable)}, scale={w.constant()})")
    elif choice == 1:
        w.new_tensor(f'{name}({w.tensor()}, **{{"scale": {w.constant()}, "tag": "t"}})')
    else:
        w.new_tensor(f"{name}({w.tensor()}, {w.tensor()}, 3, 4)")


def _unpack_step(w: _Writer) -> None:
    """Nested and starred unpacking, tuples of tensors and ints, and a set of ints."""
    a, b, c = w.fresh("t"), w.fresh("t"), w.fresh("n")
    choice = w.rng.randrange(3)
    if choice == 0:
        w.emit(f"{a}, ({b}, {c}) = {w.tensor()}, ({w.tensor()} * 2, {w.rng.randint(1, 5)})")
    elif choice == 1:
        w.emit(f"*_, {a}, {b}, {c} = ({w.tensor()}, {w.tensor()}, {w.tensor()}, len({w.tensor()}))")
    else:
        seen = w.fresh("s")
        w.emit(f"{seen} = {{{w.rng.randint(0, 3)}, {w.rng.randint(0, 3)}, len({w.tensor()})}}",
               f"{seen}.add({w.rng.randint(0, 5)})", f"{a} = {w.tensor()} * len({seen})",
               f"{b} = {w.tensor()} + (2 in {seen})", f"{c} = sum(sorted({seen}))")
    w.tensors += [a, b]
    w.ints.append(c)


def _side_effect_step(w: _Writer) -> None:
    if w.views and w.rng.random() < 0.5:
        view = w.rng.choice(list(w.views))
        w.emit(f"store.append(len({view}))")
    elif w.rng.random() < 0.5:
        w.emit(f"store.append({w.tensor()}.sum())")
    else:
        w.emit(f"store.append({w.rng.choice(w.ints) if w.ints else 'obj.count'})")


def _break_step(w: _Writer) -> None:
    target = w.rng.choice(w.tensors[2:] or [w.new_tensor(w.tensor_expression())])
    if w.rng.random() < 0.5:
        w.emit(f'print("at", {w.rng.choice(w.ints) if w.ints else "obj.count"})')
    else:
        w.emit(f"if {target}.sum() > 0:", f"    {target} = {target} + 1")


STEPS: list[tuple[Callable[[_Writer], None], int]] = [
    (_tensor_step, 4), (_int_step, 2), (_list_make, 2), (_list_mutate, 2), (_list_read, 2), (_dict_make, 2),
    (_dict_mutate, 2), (_dict_read, 2), (_closure_step, 3), (_object_step, 3), (_module_step, 2),
    (_exception_step, 2), (_control_step, 2), (_side_effect_step, 2), (_call_step, 1), (_unpack_step, 1),
]


def _write(rng: random.Random, fullgraph: bool) -> str:
    w = _Writer(rng, fullgraph)
    steps, weights = zip(*STEPS)
    for _ in range(rng.randint(6, 14)):
        step = rng.choices(steps, weights)[0]
        if not fullgraph and rng.random() < 0.08:
            step = _break_step
        step(w)
    outputs = w.tensors[-3:] + w.ints[-2:] + list(w.lists)[-1:] + list(w.dicts)[-1:]
    outputs += [f"len({view})" for view in list(w.views)[-1:]]
    body = "\n".join(w.lines)
    return f"def program(x, y, obj, mod, store):\n{body}\n    return ({', '.join(outputs)},)\n"


def generate(seed: int, fullgraph: bool = False) -> PyProgram:
    """The program of `seed` (the same source every time); one that runs eagerly without error."""
    rng = random.Random(seed * 2 + int(fullgraph))
    for _ in range(20):
        program = PyProgram(seed, fullgraph, _write(rng, fullgraph))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for arguments in program.calls():
                    program.compile_source()(*arguments)
        except Exception:  # a step the tracking did not foresee: write another program
            continue
        return program
    raise AssertionError(f"no runnable program for seed {seed}")
