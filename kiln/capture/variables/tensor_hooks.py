"""`t.register_hook(fn)` during capture, on a tensor from outside the frame (an input, a
parameter), or on one the graph computes.

The hook runs in the backward pass, after the frame has returned, so registering it once the graph
has run is what eager's registration inside the frame amounts to: it is a side effect the glue
replays (`h = t.register_hook(fn)`, fn rebuilt as any value is). The handle is that replay's:
returned or stored it is the real one; `handle.remove()` in the frame drops the registration (see
HookHandleVariable); any other use is a clean break. A tensor that does not require grad raises
eager's RuntimeError.

A hook on a tensor the graph computes runs inside the graph's backward. A pure function of the
gradient made in the frame (`lambda g: g * 3`: no globals, no defaults, only tensor methods and
operators, no branches; its closure may hold plain constants and tensors of the graph, which the node
hands it on each run) stays in the graph: a node registers it on the tensor when the
graph runs, so the eager backend registers it on the real tensor, and AOT autograd's joint trace
registers it on the traced one, whose backward then runs the hook's ops where eager's does (as
torch.compile traces such a hook into its backward). When such a tensor leaves the graph
(returned, stored, live at a break) the capture starts again with these registrations as breaks
(HookedTensorEscapes): under AOT autograd the graph's hook would run inside the compiled backward,
after the hooks and retain_grad the caller adds to the output, which eager runs after it. Any other hook (Python state read or written,
a global function) is a clean break: the tensor leaves the graph and the hook is registered on it
eagerly.

`t.retain_grad()` likewise: a no-op on a leaf (its leafness guarded), replayed after the graph on
a non-leaf from outside (the graph's gradient reaches it through its own grad_fn, so its .grad
counts that part too), eager's RuntimeError without requires_grad, and a clean break on a tensor
the graph computes: its .grad must count the gradient the graph's own uses send it, which only
reaches the compiled backward's inside.
"""
from __future__ import annotations

import builtins
import dis
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch.utils.hooks import RemovableHandle

from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import raise_in_trace
from kiln.capture.variables.functions import NestedFunctionVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.tensor import TensorVariable


class HookHandleVariable(Variable):
    """The RemovableHandle a registration returns. For one replayed after the graph (`key`, its
    side effect's): `handle.remove()` drops the registration (nothing is replayed; a second
    remove() does nothing, as eager's), and the handle kept past the graph (returned, stored on
    an object, live at a break) is the one the replay returns. A removed handle kept past the
    graph, any other use, and the handle of a hook kept in the graph are breaks."""

    def __init__(self, key: tuple | None = None) -> None:
        self.key = key
        self.removed = False

    def describe(self) -> str:
        return "the handle of a tensor hook registered in the frame"

    def python_type(self) -> type:
        return RemovableHandle

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "remove" and self.key is not None:
            return BoundMethodVariable(self, name)
        raise Unsupported(f"using {self.describe()} ({name})", kind="unsupported_call")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "remove" and not args and not kwargs and self.key is not None:
            tx.side_effects.remove_tensor_hook(self.key)
            self.removed = True
            return ConstantVariable(None)
        raise Unsupported(f"using {self.describe()} ({name})", kind="unsupported_call")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        name = None if self.key is None or self.removed else glue.hook_handles.get(self.key)
        if name is None:
            raise Unsupported(f"{self.describe()} kept past the graph", kind="reconstruct")
        return name


def register_hook(tx: "Tracer", tensor: "TensorVariable", args: Sequence[Variable],
                  kwargs: dict[str, Variable]) -> Variable:
    """`tensor.register_hook(hook)` (see the module docstring)."""
    if len(args) != 1 or kwargs:
        raise Unsupported("Tensor.register_hook with other than one hook argument", kind="unsupported_call")
    if not tensor.example.requires_grad:
        error = RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        raise raise_in_trace(error, f"RuntimeError: {error} (raised natively)")
    if tensor.source is None:
        pure = _pure_gradient_function(args[0])
        hook, captured = pure if pure is not None else (None, [])
        if hook is not None and not _keeps_gradient_kind(tx, tensor.example, hook, captured):
            raise Unsupported("Tensor.register_hook() on a tensor the graph computes, with a hook that changes the "
                              "gradient's dtype, device or size (eager raises when backward runs it)",
                              kind="unsupported_call")
        if hook is None:
            raise Unsupported("Tensor.register_hook() on a tensor the graph computes, with a hook that is not a "
                              "pure function of the gradient (it reads or writes Python state, or is not made in "
                              "the frame): it would run inside the graph's backward", kind="unsupported_call")
        if tx.state.hook_breaks:
            raise Unsupported("Tensor.register_hook() on a tensor the graph computes that leaves the graph: "
                              "registered on the real tensor, where the caller's later hooks see what it "
                              "returns", kind="unsupported_call")
        tx.output.create_node("call_function", _registration_of(hook, len(captured)),
                              (tensor.node, *[t.node for _cell, t in captured]), {}, None)
        tx.output.hooked.add(tensor.node)
        tx.output.hook_cells.extend((cell, t, t.example._version) for cell, t in captured)
        return HookHandleVariable()
    return HookHandleVariable(tx.side_effects.register_tensor_hook(tensor, args[0]))


# What a hook kept in the graph may execute: locals, constants, attribute and method reads, calls,
# operators, tuples and slices; no globals, cells, stores outside its frame, imports or branches.
_PURE_OPCODES = frozenset({
    "RESUME", "NOP", "CACHE", "LOAD_FAST", "STORE_FAST", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST",
    "LOAD_ATTR", "LOAD_METHOD", "PUSH_NULL", "PRECALL", "CALL", "KW_NAMES", "BINARY_OP", "BINARY_SUBSCR",
    "UNARY_NEGATIVE", "UNARY_POSITIVE", "COMPARE_OP", "BUILD_TUPLE", "BUILD_SLICE", "POP_TOP", "COPY", "SWAP",
    "COPY_FREE_VARS", "LOAD_DEREF",
})
# Tensor members a pure hook may not read: writes, autograd state, data and layout reads (the
# traced gradient's strides need not be eager's)
_IMPURE_MEMBERS = frozenset({
    "item", "tolist", "numpy", "backward", "register_hook", "retain_grad", "data", "grad", "data_ptr",
    "untyped_storage", "storage", "stride", "is_contiguous", "storage_offset", "requires_grad_", "detach_",
})


def _pure_constant(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_pure_constant(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, complex, str))


Captured = list  # of (the closure cell, the TensorVariable it held at registration)


def _pure_gradient_function(hook: Variable) -> tuple[Callable[..., Any], Captured] | None:
    """The hook as a real function when it is a pure function of the gradient made in the frame
    (see the module docstring), with the tensors its closure holds, else None. The function takes
    those tensors after the gradient (`lambda g: g * s` becomes `lambda g, s: g * s`, in effect):
    the graph hands it the tensor values of each run. A cell holding anything but a tensor or a
    plain constant (a list, a module, a symbolic number) makes it impure."""
    if not isinstance(hook, NestedFunctionVariable) or hook.defaults or hook.kwdefaults \
            or hook.special or hook.func_dict is not None:
        return None
    from kiln.capture.variables.tensor import TensorVariable

    code = hook.code
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & (0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200) \
            or code.co_cellvars or not all(_pure_constant(c) for c in code.co_consts) \
            or len(code.co_freevars) != len(hook.closure or ()):
        return None
    cells: list[Any] = []  # per free variable: a constant, or the index of a captured tensor
    captured: Captured = []
    for cell in hook.closure or ():
        contents = cell.contents if cell.real is None else None
        if isinstance(contents, TensorVariable) and contents.node is not None:
            cells.append(len(captured))
            captured.append((cell, contents))
        elif isinstance(contents, ConstantVariable) and _pure_constant(contents.as_constant()):
            cells.append(types.CellType(contents.as_constant()))
        else:
            return None
    for instruction in dis.get_instructions(code):
        if instruction.opname not in _PURE_OPCODES:
            return None
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and (
                instruction.argval in _IMPURE_MEMBERS or str(instruction.argval).endswith("_")
                and not str(instruction.argval).startswith("__")):
            return None
    # no global is loaded: the builtins are there for the machinery that runs it (an import)
    name = hook.qualname.rpartition(".")[2]
    if not captured:
        closure = tuple(cells) if cells else None
        return types.FunctionType(code, {"__builtins__": builtins}, name, None, closure), captured

    def with_tensors(*tensors: torch.Tensor) -> Callable[[torch.Tensor], Any]:
        closure = tuple(types.CellType(tensors[c]) if isinstance(c, int) else c for c in cells)
        return types.FunctionType(code, {"__builtins__": builtins}, name, None, closure)
    return with_tensors, captured


def _keeps_gradient_kind(tx: "Tracer", example: torch.Tensor, hook: Callable[..., Any], captured: Captured) -> bool:
    """Whether the pure hook, run on a fake gradient, gives None or a tensor eager's engine accepts
    in its place (same dtype, device and size); else backward raises, which the graph could not."""
    try:
        with tx.output.fake_mode, torch.no_grad():
            if captured:
                hook = hook(*[t.example for _cell, t in captured])
            result = hook(torch.empty_like(example))
        return result is None or isinstance(result, torch.Tensor) and result.dtype == example.dtype \
            and result.device == example.device and result.layout == example.layout \
            and bool(result.shape == example.shape)
    except Exception:
        return False


def _registration_of(hook: Callable[..., Any], num_captured: int) -> Callable[..., None]:
    """The graph node's target: registers `hook` on its tensor each time the graph runs (on a traced
    tensor under AOT autograd, whose backward then records the hook's ops). With `num_captured`,
    `hook` makes the hook from the tensors its closure holds, the node's further arguments."""

    def register_hook_on_gradient(tensor: torch.Tensor, *captured: torch.Tensor) -> None:
        if tensor.requires_grad:  # AOT autograd's forward-only traces run without grad
            tensor.register_hook(hook(*captured) if num_captured else hook)

    register_hook_on_gradient.kiln_side_effect = True  # type: ignore[attr-defined]
    return register_hook_on_gradient


def retain_grad(tx: "Tracer", tensor: "TensorVariable", args: Sequence[Variable],
                kwargs: dict[str, Variable]) -> Variable:
    """`tensor.retain_grad()` (see the module docstring)."""
    if args or kwargs:
        raise Unsupported("Tensor.retain_grad with arguments", kind="unsupported_call")
    if not tensor.example.requires_grad:
        error = RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        raise raise_in_trace(error, f"RuntimeError: {error} (raised natively)")
    if tensor.source is None:
        raise Unsupported("Tensor.retain_grad() on a tensor the graph computes (its .grad would have to count "
                          "the gradient the graph's own uses send it, inside the compiled backward)",
                          kind="unsupported_call",
                          hint="call retain_grad() outside the compiled function, or read the gradient "
                               "with a hook on an input")
    leaf = tensor.getattr(tx, "is_leaf")  # guarded: a leaf input and a non-leaf pass the same tensor guard
    if not leaf.as_constant():
        tx.side_effects.retain_tensor_grad(tensor)
    return ConstantVariable(None)
