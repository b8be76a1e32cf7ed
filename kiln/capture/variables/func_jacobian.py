"""`torch.func.jacrev` and `torch.func.jacfwd` during capture: the function traced once.

`jacrev(f, argnums, has_aux=...)` called in the frame gives a JacobianVariable (the wrapper eager
would return, not made); calling that traces `f` on the arguments as grad does (func_grad.py's
`_trace_grad`: a subgraph over the tensor leaves of the positional arguments and every other value
`f` reads) and puts one node in the graph, `run_jacrev` / `run_jacfwd`, which runs the transform
itself over the subgraph, so the jacobian is eager's (the layout of its result per differentiated
leaf, aux unchanged). As with grad, `f` must return one tensor (and tensors as aux), argnums and
has_aux must be constants; jacrev's chunk_size and jacfwd's randomness ("same", "different") are
constants passed to the transform by the node (keywords of the runner), other options (jacrev's
_preallocate_and_copy) run the call eagerly at a break. A wrapper that leaves the frame is made
by the transform in the glue.
Before, every call of either transform was such a break (the functional_call of a module under
jacrev made no graph where torch.compile makes one). Corresponds to the functorch jacrev/jacfwd
support in torch/_dynamo/variables/higher_order_ops.py.
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

from kiln.capture.sources import Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.func_grad import _trace_grad
from kiln.capture.variables.higher_order import _as_variable
from kiln.capture.variables.vmap import FunctorchCallVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# the options each transform takes beyond func, argnums and has_aux, with the defaults followed
_DEFAULTS: dict[str, dict[str, Any]] = {"jacrev": {"chunk_size": None, "_preallocate_and_copy": False}, "jacfwd": {"randomness": "error"}}


def is_jacobian_transform(value: Any) -> bool:
    """torch.func.jacrev / jacfwd themselves (not the wrapper they return), known by their code's
    module and qualified name (Kiln does not import torch._functorch; the builder guards identity)."""
    return isinstance(value, types.FunctionType) and value.__module__ in ("torch._functorch.eager_transforms",
                                                                          "torch.func") \
        and value.__qualname__ in _DEFAULTS and getattr(torch.func, value.__qualname__, None) is value


def _run(transform: str, body: torch.fx.GraphModule, leaf_argnums: tuple[int, ...], n_leaves: int,
         *inputs: Any, **options: Any) -> tuple:
    leaves, others = inputs[:n_leaves], inputs[n_leaves:]

    def value_and_aux(*xs: Any) -> tuple[Any, tuple]:
        out = body(*xs, *others)
        return out[0], (out[0], *out[1:])  # the value rides with the aux: the runner's layout has it

    jac, aux = getattr(torch.func, transform)(value_and_aux, argnums=leaf_argnums, has_aux=True, **options)(*leaves)
    return (*jac, *aux)


def run_jacrev(body: torch.fx.GraphModule, leaf_argnums: tuple[int, ...], n_leaves: int, *inputs: Any,
               **options: Any) -> tuple:
    """What a graph's jacrev node runs: the jacobian for each differentiated leaf, the value, the aux
    leaves, flat (the layout of func_grad.run_grad); `options` are jacrev's (chunk_size)."""
    return _run("jacrev", body, leaf_argnums, n_leaves, *inputs, **options)


def run_jacfwd(body: torch.fx.GraphModule, leaf_argnums: tuple[int, ...], n_leaves: int, *inputs: Any,
               **options: Any) -> tuple:
    """run_jacrev's twin for forward mode (`options`: randomness)."""
    return _run("jacfwd", body, leaf_argnums, n_leaves, *inputs, **options)


_RUNNERS = {"jacrev": run_jacrev, "jacfwd": run_jacfwd}


def _break(what: str, why: str) -> Unsupported:
    return Unsupported(f"{what}: {why}", kind="higher_order")


class JacobianTransformVariable(FunctorchCallVariable):
    """torch.func.jacrev / jacfwd: calling one with constant options gives the transformed function."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        super().__init__(fn, source)
        self.name = f"torch.func.{fn.__qualname__}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise _break(self.name, f"{exc} (raised natively)") from exc
        bound.apply_defaults()
        a = {k: _as_variable(tx, v) for k, v in bound.arguments.items()}
        options = {}
        for what in a:
            if what != "func" and not a[what].is_constant():
                raise _break(self.name, f"{what} is {a[what].describe()}; the call runs eagerly")
            if what != "func":
                options[what] = a[what].as_constant()
        transform = self.fn.__qualname__
        defaults: dict[str, Any] = _DEFAULTS[transform]
        chosen = {what: options[what] for what, default in defaults.items() if options.get(what, default) != default}
        if transform == "jacrev" and chosen.get("chunk_size") is not None:
            size = chosen["chunk_size"]
            if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
                raise _break(self.name, "jacrev: chunk_size must be a positive integer (raised natively)")
        if chosen.get("_preallocate_and_copy") or ("randomness" in chosen
                                                   and chosen["randomness"] not in ("same", "different")):
            raise _break(self.name, f"{chosen} is not followed; the call runs eagerly")
        return JacobianVariable(transform, a["func"], options["argnums"], bool(options["has_aux"]), chosen)


class JacobianVariable(Variable):
    """The function jacrev(f) / jacfwd(f) returned in the frame; calling it traces f once."""

    def __init__(self, transform: str, fn: Variable, argnums: Any, has_aux: bool,
                 options: dict[str, Any] | None = None) -> None:
        self.transform = transform
        self.options = dict(options or {})  # chunk_size / randomness other than the default
        self.fn = fn
        self.argnums = argnums
        self.has_aux = has_aux
        self.source = None

    def describe(self) -> str:
        return f"torch.func.{self.transform} of {self.fn.describe()}"

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        what = f"torch.func.{self.transform}"
        if kwargs:
            raise _break(what, "keyword arguments to the differentiated function; the call runs eagerly")
        return _trace_grad(tx, what, self.fn, self.argnums, self.has_aux, list(args), with_value=False,
                           runner=_RUNNERS[self.transform], options=self.options)

    def reconstruct(self, glue: Any) -> str:
        # kept after the frame (returned, stored, live across a break): made by the transform, as eager does
        transform = glue.constant(getattr(torch.func, self.transform))
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{transform}({glue.reconstruct(self.fn)}, argnums={self.argnums!r}, has_aux={self.has_aux!r}{options})"
