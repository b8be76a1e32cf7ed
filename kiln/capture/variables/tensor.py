"""Tensors during capture: an FX node plus the FakeTensor that says what the node produces.

Metadata (`shape`, `dtype`, `device`, `dim()`, ...) is answered from the fake at trace time; every
other method or attribute becomes a node. Reading a value out of a tensor (`.item()`, `.tolist()`,
`bool(t)`) is a graph break: the fake has no data; `.numpy()` gives a traced ndarray (numpy_array.py). Corresponds to
torch/_dynamo/variables/tensor.py (TensorVariable).
"""
from __future__ import annotations

import inspect
import operator
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx

from kiln import config
from kiln.capture.sources import AttrSource, Source
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.symint import holds_symbolic_number
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# Attributes answered from the fake without a node (they do not depend on data).
_CONSTANT_ATTRS = frozenset({
    "dtype", "device", "layout", "requires_grad", "is_cuda", "is_cpu", "is_leaf", "is_sparse",
    "is_quantized", "is_meta", "is_mkldnn", "is_nested", "is_complex_dtype", "ndim", "itemsize",
})
_CONSTANT_METHODS = frozenset({
    "dim", "ndimension", "is_floating_point", "is_complex", "is_contiguous", "element_size",
    "get_device", "is_signed", "is_inference", "has_names", "is_pinned",
})
# Reading data out of a tensor: each is a graph break of the given kind.
_DATA_METHODS = {
    "item": "item", "tolist": "item", "numpy": "numpy", "__bool__": "item", "__int__": "item",
    "__float__": "item", "__index__": "item", "data_ptr": "unsupported_call",
    "untyped_storage": "unsupported_call", "storage": "unsupported_call", "backward": "unsupported_call",
    "register_hook": "unsupported_call", "__array__": "numpy", "__repr__": "print", "__str__": "print",
    "__format__": "print", "requires_grad_": "unsupported_call",
}
# Python object protocols on the tensor object itself (copy.deepcopy, pickle): they copy its storage,
# .grad and Python attributes and fill the caller's memo, none of which is an op of the graph (as a
# graph node, __deepcopy__ ran on fake tensors and failed: an internal error and an eager fallback).
_OBJECT_PROTOCOL_METHODS = frozenset({"__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__",
                                      "__setstate__", "__sizeof__"})

# Reading a known (constant-folded) tensor's value: eager's answer at trace time.
_READ_METHODS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__"})

# Tensor methods (without positional arguments) that make a value of a kind built on this one, by
# name, filled by @tensor_method where that kind lives (numpy() -> numpy_array.py's array).
TensorMethod = Callable[["Tracer", Variable, dict[str, Variable]], Variable]
TENSOR_METHODS: dict[str, TensorMethod] = {}


def tensor_method(name: str) -> Callable[[TensorMethod], TensorMethod]:
    """Register the rule for `tensor.<name>(**kwargs)`."""

    def register(rule: TensorMethod) -> TensorMethod:
        assert name not in TENSOR_METHODS, name
        TENSOR_METHODS[name] = rule
        return rule

    return register


class RealInputs:
    """The real tensors a capture read as graph inputs, by id, held strongly while it runs and
    dropped by `release` when it ends (a TensorVariable outliving its capture then has none)."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}

    def add(self, t: torch.Tensor) -> int:
        self._tensors[id(t)] = t
        return id(t)

    def get(self, key: int) -> torch.Tensor | None:
        return self._tensors.get(key)

    def release(self) -> None:
        self._tensors = {}


class TensorVariable(Variable):
    """A tensor made by (or fed into) the graph; `example` is its FakeTensor."""

    # numpy_array.numpy_new_tensor, set by that module (it imports this one): `t.new_tensor(ndarray)`
    new_tensor_of_array: "Callable[..., Variable | None] | None" = None

    def __init__(self, node: torch.fx.Node, example: torch.Tensor, source: Source | None = None) -> None:
        self.node = node
        self.example = example
        self.source = source
        # the real value, when it follows from trace-time constants and guarded input values alone
        # (kiln.capture.constant_fold), and the guards that reading it as a number needs
        self.constant: torch.Tensor | None = None
        self.constant_guards: tuple[Any, ...] = ()
        # the real tensor behind a graph input, for what the trace reads off the object itself
        # (`.grad`, a dict keyed by it): held in the capture's table of real inputs, which is
        # emptied when the capture ends (capture must not keep a model's tensors alive, nor leave
        # weak references on them: torch.utils.swap_tensors refuses a tensor that has one)
        self.real_ref: RealInputs | None = None
        self.real_key = 0

    def real(self) -> torch.Tensor | None:
        """The real tensor this graph input was read from, while its capture runs; None for values
        the graph computes."""
        return None if self.real_ref is None else self.real_ref.get(self.real_key)

    def describe(self) -> str:
        return f"tensor {self.node.name}"

    def identity(self) -> Any:
        # one fake per tensor object: the same input read twice, or `x.add_(1)`, gives the same fake
        return self.example

    def python_type(self) -> type:
        if isinstance(self.example, torch.nn.Parameter):
            # a graph input's own class (a subclass of Parameter), which its tensor guard checks
            real = self.real()
            return type(real) if isinstance(real, torch.nn.Parameter) else torch.nn.Parameter
        return torch.Tensor

    def truth(self, tx: "Tracer") -> bool:
        if self.constant is not None:
            tx.output.guards.extend(self.constant_guards)
            return bool(self.constant)
        raise Unsupported(f"branching on the value of {self.describe()} (data-dependent control flow)",
                          kind="data_dependent_branch")

    def length(self, tx: "Tracer") -> Variable:
        if self.example.dim() == 0:  # the rank is guarded: raised where the program can catch it
            from kiln.capture.variables.exception import raise_in_trace
            error = TypeError("len() of a 0-d tensor")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        return self.size(tx, 0)

    def iterate(self, tx: "Tracer") -> list[Variable]:
        if self.example.dim() == 0:
            from kiln.capture.variables.exception import raise_in_trace
            error = TypeError("iteration over a 0-d tensor")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        n = tx.as_int(self.size(tx, 0))  # unrolling over dim 0 fixes its size
        parts = tx.call_op("call_method", "unbind", [self], {})
        return parts.iterate(tx)[:n]

    # ---------------------------------------------------------------------------------- sizes
    def size(self, tx: "Tracer", dim: int | None = None) -> Variable:
        from kiln.capture.variables.sequence import TupleVariable

        if dim is None:
            items = [self.size(tx, d) for d in range(self.example.dim())]
            return TupleVariable(items, torch.Size)
        size = self.example.shape[dim]
        if not isinstance(size, torch.SymInt):
            return ConstantVariable(int(size))
        from kiln.capture.variables.symint import SymIntVariable
        node = tx.output.node_for_symint(size)
        if node is None:
            d = dim % self.example.dim()
            node = tx.output.create_node("call_method", "size", (self.node, d), {}, size)
        return SymIntVariable(node, size)

    def stride(self, tx: "Tracer", dim: int | None = None) -> Variable:
        """Strides as the sizes are: constants where static, else symbolic ints with graph nodes."""
        from kiln.capture.variables.sequence import TupleVariable

        if dim is None:
            return TupleVariable([self.stride(tx, d) for d in range(self.example.dim())], tuple)
        stride = self.example.stride(dim)
        if not isinstance(stride, torch.SymInt):
            return ConstantVariable(int(stride))
        from kiln.capture.variables.symint import SymIntVariable
        node = tx.output.node_for_symint(stride)
        if node is None:
            node = tx.output.create_node("call_method", "stride", (self.node, dim % self.example.dim()), {}, stride)
        return SymIntVariable(node, stride)

    # ---------------------------------------------------------------------------------- attributes
    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "shape":
            return self.size(tx)
        real = self.real() if name == "is_leaf" and self.source is not None else None
        if real is not None and self.source is not None:
            # the tensor guard keeps requires_grad, not leafness: a non-leaf input (`w * 1`) and a
            # leaf that requires grad pass the same guard, so the read is guarded on its own
            return tx.wrap(real.is_leaf, AttrSource(self.source, "is_leaf"))
        if name in _CONSTANT_ATTRS:
            return tx.wrap_result(getattr(self.example, name))
        if name == "nbytes":  # numel * itemsize: symbolic with a dynamic size
            numel = self.size(tx).call_method(tx, "numel", [], {})
            if numel.is_constant():
                return tx.wrap_result(numel.as_constant() * self.example.itemsize)
            return tx.call_op("call_function", operator.mul, [numel, ConstantVariable(self.example.itemsize)], {})
        if name in ("T", "mT", "H", "mH", "real", "imag", "data"):
            # `data` too, not detach(): its alias has a version counter of its own, so an update
            # through it leaves the tensor's counter where it was (AOT counts it as untracked)
            return tx.call_op("call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad":
            return self._read_grad(tx)
        if name == "grad_fn" or name == "_base":
            raise Unsupported(f"reading .{name} of a tensor inside a compiled region", kind="unsupported_attribute")
        if name == "__class__":
            return tx.wrap_result(self.python_type())
        own = self._python_attribute(tx, name)
        if own is not None:
            return own
        if callable(getattr(torch.Tensor, name, None)):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"tensor attribute {name!r}", kind="unsupported_attribute")

    def _python_attribute(self, tx: "Tracer", name: str) -> Variable | None:
        """An attribute Python code gave a real input: what a user subclass of Parameter defines
        (a method, property or class constant; the class is the tensor guard's), or one the program
        set on the tensor (`p.lr_mult = 2.0`): the trace's own write to it, else the value in the
        real tensor's __dict__, read through its source (guarded, as a module's attribute is).
        None for a tensor the graph computes (its attributes are not tracked) and for torch's own."""
        from kiln.capture.trace_rules import in_stable_module
        from kiln.capture.variables.functions import bind_class_attribute

        real = self.real()
        if real is None:
            # a tensor the frame computed: an attribute the trace set on it (`y.tag = 1`, stored on
            # the graph's output by the glue), or none
            return tx.side_effects.pending_attr(self.example, name)
        if self.source is None:
            return None
        user_owned = False
        if type(real) not in (torch.Tensor, torch.nn.Parameter):
            static = inspect.getattr_static(type(real), name, None)
            owner = next((k for k in type(real).__mro__ if name in vars(k)), None)
            user_owned = owner is not None and not in_stable_module(owner.__module__)
        if user_owned and isinstance(static, property):
            return bind_class_attribute(tx, static, self, type(real), name)  # a data descriptor: first
        pending = tx.side_effects.pending_attr(real, name)
        if pending is not None:
            return pending
        if not tx.side_effects.deleted_attr(real, name) and name in getattr(real, "__dict__", {}):
            return tx.wrap(real.__dict__[name], AttrSource(self.source, name))
        if not user_owned and inspect.getattr_static(type(real), name, None) is None \
                and inspect.getattr_static(type(real), "__getattr__", None) is None:
            # on no class and not in the instance dict (its absence guarded): eager's AttributeError
            from kiln.capture.variables.exception import no_attribute
            if not tx.side_effects.deleted_attr(real, name):
                tx.output.note_absent(AttrSource(self.source, "__dict__"), name)
            raise no_attribute(type(real), name)
        if not user_owned:
            return None
        bound = bind_class_attribute(tx, static, self, type(real), name)
        if bound is not None:
            return bound
        if hasattr(type(static), "__get__"):
            return None  # another descriptor: not followed
        return tx.wrap(static, AttrSource(self.source, name))

    def _read_grad(self, tx: "Tracer") -> Variable:
        """`p.grad` of a leaf graph input: a graph input of its own, read from `p.grad` (guarded:
        None stays None, a tensor keeps its metadata), or what the trace assigned to it. As in
        Dynamo; reading it off a tensor the graph computes (or a non-leaf, whose read warns)
        stays a graph break."""
        written = self._input_written_in_place(tx)
        if written is not None:
            return written._read_grad(tx)
        real = self.real()
        if real is None or self.source is None or not real.is_leaf:
            raise Unsupported("reading .grad of a tensor inside a compiled region", kind="unsupported_attribute")
        pending = tx.side_effects.pending_attr(real, "grad")
        if pending is not None:
            return pending
        return tx.wrap(real.grad, AttrSource(self.source, "grad"))

    def _input_written_in_place(self, tx: "Tracer") -> "TensorVariable | None":
        """The input this value is, when an in-place op on the input made it (`p -= lr * p.grad`,
        `q = p.mul_(2)`: the same tensor object, its fake the input's): its .grad is the input's."""
        if self.source is not None:
            return None
        var = tx.output.input_tensors.get(id(self.example))
        return var if isinstance(var, TensorVariable) and var.example is self.example and var is not self else None

    def set_grad(self, tx: "Tracer", value: Variable) -> None:
        """`p.grad = g` on a leaf graph input: a side effect the glue replays after the graph. The
        checks eager makes at the assignment (a tensor of p's size, dtype and device, or None)
        are made now; one that fails is a graph break, and the assignment raises natively."""
        written = self._input_written_in_place(tx)
        if written is not None:
            return written.set_grad(tx, value)
        real = self.real()
        fits = isinstance(value, ConstantVariable) and value.as_constant() is None or \
            isinstance(value, TensorVariable) and value.example is not self.example and \
            value.example.shape == self.example.shape and value.example.dtype == self.example.dtype \
            and value.example.device == self.example.device
        if real is None or self.source is None or not real.is_leaf or not fits:
            raise Unsupported("assigning .grad of a tensor inside a compiled region", kind="unsupported")
        tx.side_effects.store_attr(real, self, "grad", value)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "item" and not args and config.capture_scalar_outputs:
            return tx.call_op("call_method", "item", [self], {})  # an unbacked symbol, not a break
        if name in TENSOR_METHODS and not args:
            return TENSOR_METHODS[name](tx, self, dict(kwargs))
        if name in _READ_METHODS and self.constant is not None and not args and not kwargs:
            tx.output.guards.extend(self.constant_guards)
            return tx.wrap_result(getattr(self.constant, name)())
        if name == "requires_grad_" and _requires_grad_unchanged(self, args, kwargs):
            return self  # transformers' enable_input_require_grads hook on an output that already requires grad
        if name in ("__setattr__", "__delattr__"):
            # `t.__setattr__("grad", g)` is the attribute store itself, not an op of the graph (as
            # one it was dropped as dead code, and a later read of t.grad saw the old value)
            if name == "__setattr__" and len(args) == 2 and not kwargs and args[0].is_constant():
                tx.setattr(self, args[0].as_constant(), args[1])
                return ConstantVariable(None)
            raise Unsupported(f"Tensor.{name} called explicitly", kind="unsupported_call")
        if name == "as_subclass":
            what = args[0].describe() if args else "a class"
            raise Unsupported(f"Tensor.as_subclass({what}) makes a tensor of a subclass in the frame: capture traces "
                              "plain tensors", kind="tensor_subclass")
        if name == "new_tensor" and TensorVariable.new_tensor_of_array is not None:
            converted = TensorVariable.new_tensor_of_array(tx, self, args, kwargs)
            if converted is not None:
                return converted
        if name == "register_hook":
            from kiln.capture.variables.tensor_hooks import register_hook  # the hook module imports this one
            return register_hook(tx, self, args, kwargs)
        if name == "retain_grad":
            from kiln.capture.variables.tensor_hooks import retain_grad  # the hook module imports this one
            return retain_grad(tx, self, args, kwargs)
        if name == "new_tensor" and args and holds_symbolic_number(args[0]):
            # x.new_tensor([x.shape[0] == 3, n // 2]) of dynamic sizes: torch.tensor's reference
            # builds it from the symbols, in x's dtype and device unless given (as new_tensor does)
            options = dict(kwargs)
            for key, own in (("dtype", self.example.dtype), ("device", self.example.device)):
                if key not in options or options[key].is_constant() and options[key].as_constant() is None:
                    options[key] = ConstantVariable(own)
            return tx.call_op("call_function", torch._refs.tensor, [args[0]], options)
        if name in _OBJECT_PROTOCOL_METHODS:
            raise Unsupported(f"Tensor.{name}() copies or pickles the tensor object, not an op of a graph",
                              kind="unsupported_call", hint="deep-copy tensors outside the compiled function, "
                              "or use .clone() (and .detach()) inside it")
        if name in _DATA_METHODS:
            raise Unsupported(f"Tensor.{name}() reads the tensor's data, which is not known while tracing",
                              kind=_DATA_METHODS[name])
        if name in ("resize_", "resize_as_") and (any(holds_symbolic_number(a) for a in args) or any(
                isinstance(a, TensorVariable) and any(isinstance(d, torch.SymInt) for d in a.example.shape)
                for a in args)):
            # ATen's resize_ takes its sizes as plain ints when traced below autograd: a graph
            # holding one of symbolic sizes fails there (as torch.compile, break instead)
            raise Unsupported(f"Tensor.{name}() to sizes known only at run time", kind="unsupported_call",
                              hint="make the tensor at its size (`torch.empty(x.shape)`, `x.new_empty(...)`) "
                                   "instead of resizing one")
        if name in ("size", "stride") and not kwargs:
            if name == "size":
                if not args:
                    return self.size(tx)
                return self.size(tx, args[0].as_constant())
            if not args:
                return self.stride(tx)
            return self.stride(tx, args[0].as_constant())
        if name == "is_inference" and not args and not kwargs:
            return ConstantVariable(self.is_inference(tx))
        if name in _CONSTANT_METHODS:
            consts = [a.as_constant() for a in args]
            return tx.wrap_result(getattr(self.example, name)(*consts, **{k: v.as_constant() for k, v in kwargs.items()}))
        if name in ("numel", "nelement") and not args:
            if isinstance(self.example.numel(), torch.SymInt):  # the product of the symbolic sizes, in the graph
                return self.size(tx).call_method(tx, "numel", [], {})
            return tx.wrap_result(self.example.numel())
        if name == "type" and not args and not kwargs:
            return ConstantVariable(self.example.type())
        if name in ("__setitem__",):
            return tx.call_op("call_function", operator.setitem, [self, *args], {})
        if name == "set_" and torch.is_grad_enabled() and any(
                isinstance(t, TensorVariable) and t.example.requires_grad for t in (self, *args)):
            raise Unsupported("Tensor.set_ on a tensor that requires grad, with grad on: eager's set_ has no "
                              "derivative (its result's backward raises) and bumps the version counter",
                              kind="unsupported_call", hint="call set_ under torch.no_grad(), or on a detached tensor")
        if name == "set_" and len(args) == 1 and not kwargs and _set_to_itself(self, args[0]):
            # `t.set_(t)` changes nothing but the version counter, which eager bumps; functionalization
            # freezes a tensor given a storage by set_ (a later in-place update failed): in the graph it
            # is the one in-place op that writes t's own values again
            return tx.call_op("call_method", "copy_", [self, self], {})
        if name in _LAYOUT_METHODS and self.node.op == "placeholder" and (
                self.example.requires_grad or name in _UNREPLAYABLE_LAYOUT_METHODS):
            # AOT autograd cannot give the caller's tensor this layout after the graph (an input that
            # requires grad, or a new storage or size the runtime cannot replay): a break at the call,
            # which runs natively, as torch.compile's, not the whole frame run eagerly every call
            why = "that requires grad" if self.example.requires_grad else "(not replayable after the graph)"
            raise Unsupported(f"Tensor.{name}() changes the shape or strides of a graph input {why}",
                              kind="input_metadata_mutation", hint="use the out-of-place op (x = x.t()) instead")
        rewritten = scalar_tensor_rewrite(tx, name, self, args, kwargs)
        if rewritten is not None:
            return rewritten
        return tx.call_op("call_method", name, [self, *args], kwargs)

    def is_inference(self, tx: "Tracer") -> bool:
        """Tensor.is_inference(): fakes are never inference tensors, so an input answers from its
        guarded metadata; a tensor computed from an inference input may be one (a view of it is),
        which the trace does not follow: a break."""
        if self.node.op == "placeholder":
            return bool(self.node.meta.get("inference", False))
        if tx.state.output.made_in_inference(self.example):
            return True  # made inside a traced `with torch.inference_mode():` block (or a view of such)
        if tx.state.output.inference_inputs:
            raise Unsupported("is_inference() of a tensor computed from an inference tensor", kind="unsupported_call")
        return False

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.graph_value(self)


# in-place methods that change a tensor's sizes, strides or storage (kiln.autograd.functionalize
# replays the first group's view chain on the caller's input after the graph; the second it cannot)
_UNREPLAYABLE_LAYOUT_METHODS = frozenset({"resize_", "resize_as_", "set_"})
_LAYOUT_METHODS = frozenset({"as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_",
                             "swapaxes_"}) | _UNREPLAYABLE_LAYOUT_METHODS


def _requires_grad_unchanged(t: TensorVariable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> bool:
    """`t.requires_grad_(flag)` that leaves the flag as it is: a no-op in eager too."""
    flag = args[0] if args else kwargs.get("requires_grad")
    if flag is not None and not flag.is_constant():
        return False
    return bool(True if flag is None else flag.as_constant()) == t.example.requires_grad


def _set_to_itself(t: TensorVariable, source: Variable) -> bool:
    """Whether `t.set_(source)` gives t what it has: source is t, or an alias of it (`t.detach()`)
    with its dtype, sizes, strides and offset."""
    if not isinstance(source, TensorVariable):
        return False
    own, src = t.example, source.example
    return src is own or (bool(torch._C._is_alias_of(src, own))  # type: ignore[attr-defined]  # not in the stubs
                          and src.dtype == own.dtype and src.shape == own.shape and src.stride() == own.stride()
                          and src.storage_offset() == own.storage_offset())


# The ops whose `alpha` / `value` is a Scalar in the schema: a tensor given there is read with .item()
_SCALED_ARGUMENT = {"add": "alpha", "add_": "alpha", "sub": "alpha", "sub_": "alpha",
                    "addcmul": "value", "addcmul_": "value", "addcdiv": "value", "addcdiv_": "value"}


def scalar_tensor_rewrite(tx: "Tracer", name: str, self: TensorVariable, args: Sequence[Variable],
                          kwargs: dict[str, Variable]) -> Variable | None:
    """`p.addcdiv_(a, b, value=t)` (or `add_(g, alpha=t)`, ...) with a tensor `t` where the schema
    wants a number: as torch.compile does, the same arithmetic spelt as tensor ops (`p.add_(a / b * t)`),
    so that the value stays in the graph instead of breaking it for `.item()`. An optimizer step
    under compilation takes this path: its step sizes are 0-d tensors there."""
    key = _SCALED_ARGUMENT.get(name)
    scale = kwargs.get(key) if key is not None else None
    if not isinstance(scale, TensorVariable) or len(kwargs) != 1:
        return None
    if name.startswith(("add_", "add", "sub")) and not name.startswith("addc") and len(args) == 1:
        term = tx.call_op("call_function", operator.mul, [args[0], scale], {})
    elif name.startswith("addcmul") and len(args) == 2:
        product = tx.call_op("call_function", operator.mul, [args[0], args[1]], {})
        term = tx.call_op("call_function", operator.mul, [product, scale], {})
    elif name.startswith("addcdiv") and len(args) == 2:
        quotient = tx.call_op("call_function", operator.truediv, [args[0], args[1]], {})
        term = tx.call_op("call_function", operator.mul, [quotient, scale], {})
    else:
        return None
    combine = "sub" if name.startswith("sub") else "add"
    return tx.call_op("call_method", combine + ("_" if name.endswith("_") else ""), [self, term], {})
