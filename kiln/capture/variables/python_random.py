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
"""
from __future__ import annotations

import random
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable

# the module-level functions are methods of this hidden instance
_MODULE_GENERATOR = getattr(random, "_inst", None)

# draws that read only the generator and their (constant) arguments
_DRAWS = frozenset({"random", "uniform", "randint", "randrange", "gauss", "normalvariate", "lognormvariate",
                    "expovariate", "vonmisesvariate", "gammavariate", "betavariate", "paretovariate",
                    "weibullvariate", "triangular", "getrandbits", "choice", "choices", "sample", "randbytes"})
_PLAIN = (int, float, str, bytes, bool, type(None))


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
    from kiln.capture.variables.base import constant_args

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
