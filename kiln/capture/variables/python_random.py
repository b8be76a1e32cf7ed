"""Python's `random` module after the frame seeded it: `random.seed(0)` then `random.random()`,
`random.randint(1, 10)`, `random.uniform(a, b)`, ... inside a compiled function.

Once the frame has called `random.seed(c)` with a constant `c`, every number the module draws after
it is fixed by `c`: the trace keeps its own `random.Random` seeded the same way (the shadow), draws
from it (each result a constant of the graph, the same in every call of the entry), and the glue
leaves the module's generator in the shadow's final state (`random.setstate`, a side effect replayed
after the graph, and before a graph break's call, so code after the break draws what eager draws).
Before any seed in the frame the module's state comes from outside: a draw is a graph break, as
before. `random.shuffle` (it writes into a list) and a seed that is not a constant (None: the time)
are breaks too. torch.compile likewise keeps a model of the generator for seeded draws.

A generator the frame makes itself with a constant seed, `r = random.Random(3)`, is modelled the
same way (RandomInstanceVariable): its draws are constants of the graph, and where it leaves the
frame (returned, stored outside, live at a break) the glue makes a new one in its state there.
"""
from __future__ import annotations

import random
import types
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable, constant_args
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# the module-level functions are methods of this hidden instance
_MODULE_GENERATOR = getattr(random, "_inst", None)

# draws that read only the generator and their (constant) arguments
_DRAWS = frozenset({"random", "uniform", "randint", "randrange", "gauss", "normalvariate", "lognormvariate",
                    "expovariate", "vonmisesvariate", "gammavariate", "betavariate", "paretovariate",
                    "weibullvariate", "triangular", "getrandbits", "choice", "choices", "sample", "randbytes"})
_PLAIN = (int, float, str, bytes, bool, type(None), range)


def _method_name(fn: Any) -> str | None:
    """The name of a method of the module's generator (`random.randint` is `_inst.randint`)."""
    if _MODULE_GENERATOR is None:
        return None
    owner = getattr(fn, "__self__", None)
    if owner is not _MODULE_GENERATOR or not isinstance(fn, (types.MethodType, types.BuiltinMethodType)):
        return None
    return getattr(fn, "__name__", None)


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return type(value) in _PLAIN


class _Shadow:
    """The generator of one capture after its seed, and the glue's setstate argument kept current."""

    def __init__(self, seed: Any, version: Any) -> None:
        from kiln.capture.variables.constant import ConstantVariable

        self.generator = random.Random()
        self.generator.seed(seed, version)
        self.state = ConstantVariable(self.generator.getstate())

    def drew(self) -> None:
        self.state.value = self.generator.getstate()


def call_module_random(tx: "Tracer", fn: Any, args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable | None":
    """A call of `random.<name>` answered from the shadow; None where it stays a graph break."""
    name = _method_name(fn)
    if name is None:
        return None

    consts = constant_args(args, kwargs)
    if consts is None or not all(_plain(v) for v in [*consts[0], *consts[1].values()]):
        return None
    shadow: _Shadow | None = getattr(tx.state, "python_random", None)
    if name == "seed":
        bound = _bind_seed(*consts[0], **consts[1])
        if bound is None or bound[0] is None:
            return None  # no seed (the time, os.urandom) or a wrong call: made for real
        fresh = _Shadow(*bound)
        if shadow is None:
            # random.setstate as the builder wraps a builtin (no import of builtin.py here: that
            # would join two import cycles of kiln.capture.variables into one)
            tx.side_effects.replay_cached_call(tx.wrap(random.setstate, None), [fresh.state])
            tx.state.python_random = fresh  # type: ignore[attr-defined]
        else:
            shadow.generator, shadow.state.value = fresh.generator, fresh.state.value
        return tx.wrap_result(None)
    if shadow is None or name not in _DRAWS:
        return None
    try:
        value = getattr(shadow.generator, name)(*consts[0], **consts[1])
    except Exception:  # noqa: BLE001 - eager's error comes from the real call, at a break
        return None
    shadow.drew()
    return tx.wrap_result(value)


def _bind_seed(a: Any = None, version: Any = 2) -> tuple[Any, Any] | None:
    if type(a) not in (int, float, str, bytes, type(None)) or version not in (1, 2):
        return None
    return a, version


# the methods of a frame's own generator answered at trace time (shuffle writes into a list: a break)
_INSTANCE_METHODS = _DRAWS | {"seed", "getstate", "setstate"}


def _generator_in_state(state: tuple) -> random.Random:
    made = random.Random()
    made.setstate(state)
    return made


class RandomInstanceVariable(Variable):
    """A `random.Random` made in the frame from a constant seed: `generator` is a trace-time twin
    that every draw advances, so each result is the constant eager computes."""

    def __init__(self, generator: random.Random) -> None:
        self.generator = generator

    def describe(self) -> str:
        return "random.Random made in the frame"

    def python_type(self) -> type:
        return random.Random

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in _INSTANCE_METHODS or callable(getattr(random.Random, name, None)) and not name.startswith("_"):
            return BoundMethodVariable(self, name)  # one not modelled (shuffle) is a break where called
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        consts = constant_args(args, kwargs)
        if name not in _INSTANCE_METHODS or consts is None \
                or not all(_plain(v) for v in [*consts[0], *consts[1].values()]):
            raise Unsupported(f"{name}() of {self.describe()} with these arguments", kind="unsupported_call")
        if name == "seed" and (_bind_seed(*consts[0], **consts[1]) or (None,))[0] is None:
            raise Unsupported(f"seed() of {self.describe()} without a constant seed", kind="unsupported_call")
        try:
            value = getattr(self.generator, name)(*consts[0], **consts[1])
        except Exception as exc:  # noqa: BLE001 - eager's error, from the real call at a break
            raise Unsupported(f"{name}() of {self.describe()} raised {type(exc).__name__}",
                              kind="unsupported_call") from exc
        return tx.wrap_result(value)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # a new generator per call, in the state the trace left this one in (eager makes one per call)
        # named once: the locals and a bound method on the stack at a break are the one object
        name = glue.fresh("rng")
        glue.line(f"{name} = {glue.constant(_generator_in_state)}({glue.constant(self.generator.getstate())})")
        return name


@builtin_rule(random.Random)
def random_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    made = _new_generator(tx, args, kwargs)
    if made is None:
        raise Unsupported("random.Random() without a constant seed (the time, os.urandom)", kind="random")
    return made


def _new_generator(tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """`random.Random(seed)` with a constant seed; None (a break) for no seed (the time) or another."""
    if kwargs or len(args) != 1:
        return None
    if args[0].is_constant():
        seed = args[0].as_constant()
    elif args[0].python_type() is int:
        seed = tx.as_int(args[0])  # an int argument made dynamic: the draws depend on its value (guarded)
    else:
        return None
    bound = _bind_seed(seed)
    if bound is None or bound[0] is None:
        return None
    return RandomInstanceVariable(random.Random(bound[0]))

