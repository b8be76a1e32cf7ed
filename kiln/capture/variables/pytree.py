"""`torch.utils._pytree` during capture: flatten, unflatten and map over trees of tracked values.

The pytree functions are not inlined (torch's implementation recurses through a registry, dataclass
treespecs and generators): each is answered here over Variables. A tuple, list, dict, OrderedDict,
namedtuple, torch.Size or torch.return_types value is taken apart by its own tracked items; the
context and child order come from the registry's own flatten function run on a skeleton of the
same shape (so they are torch's, e.g. a dict's insertion order). A type registered by the user
(`register_pytree_node`, `register_dataclass`, transformers' ModelOutput) is flattened and
rebuilt by inlining its registered functions. The TreeSpec is a real one, a trace-time constant
(`TreeSpecVariable`); its structure depends only on what capture guards (types, lengths, keys).
Corresponds to torch/_dynamo/polyfills/pytree.py and Dynamo's inlining of torch.utils._pytree.
"""
from __future__ import annotations

import collections
import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from kiln.capture.sources import Source
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.functions import PartialVariable
from kiln.capture.variables.iterator import IteratorVariable
from kiln.capture.variables.real_value import real_value
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

Handler = Callable[["Tracer", inspect.BoundArguments], Variable]
HANDLERS: dict[str, Handler] = {}


def handles(name: str) -> Callable[[Handler], Handler]:
    """Register the handler of the pytree function `name` (checked against torch.utils._pytree)."""

    def register(fn: Handler) -> Handler:
        if not callable(getattr(pytree, name, None)):
            raise ValueError(f"torch.utils._pytree has no function {name!r}")
        HANDLERS[name] = fn
        return fn

    return register


def _pytree_functions() -> dict[Any, str]:
    return {getattr(pytree, name): name for name in ("tree_flatten", "tree_unflatten", "tree_leaves",
            "tree_structure", "tree_map", "tree_map_", "tree_map_only", "tree_map_only_", "tree_iter",
            "tree_all", "tree_any", "tree_all_only", "tree_any_only", "arg_tree_leaves", "tree_is_leaf",
            "tree_flatten_with_path", "tree_leaves_with_path", "tree_map_with_path")}


def is_pytree_function(value: Any) -> bool:
    try:
        return value in _FUNCTIONS
    except TypeError:  # unhashable
        return False


def is_treespec(value: Any) -> bool:
    return isinstance(value, pytree.TreeSpec)


class PyTreeFunctionVariable(Variable):
    """One of torch.utils._pytree's functions; calling it runs its handler over Variables."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"torch.utils._pytree.{_FUNCTIONS[self.fn]}"

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        name = _FUNCTIONS[self.fn]
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise Unsupported(f"{name}: {exc} (raised natively)", kind="pytree") from exc
        bound.apply_defaults()
        return HANDLERS[name](tx, bound)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return self.source.name() if self.source is not None else glue.constant(self.fn)


class TreeSpecVariable(Variable):
    """A real TreeSpec: a structure, constant for the trace."""

    def __init__(self, spec: pytree.TreeSpec, source: Source | None = None) -> None:
        self.spec = spec
        self.source = source

    def describe(self) -> str:
        return f"TreeSpec({getattr(self.spec.type, '__name__', self.spec.type)})"

    def python_type(self) -> type:
        return type(self.spec)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.spec

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        value = getattr(self.spec, name, None)
        if value is None and not hasattr(self.spec, name):
            raise Unsupported(f"TreeSpec has no attribute {name!r} (raised natively)", kind="unsupported_attribute")
        if callable(value) and not isinstance(value, type):
            return BoundMethodVariable(self, name)
        return _wrap_structure(tx, value)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "unflatten" and len(args) == 1 and not kwargs:
            return unflatten(tx, self.spec, tx.iterate(args[0]))
        if name == "flatten_up_to" and len(args) == 1 and not kwargs:
            return ListVariable(flatten_up_to(tx, self.spec, args[0]))
        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            method = getattr(self.spec, name)
            return _wrap_structure(tx, method(*[a.as_constant() for a in args],
                                              **{k: v.as_constant() for k, v in kwargs.items()}))
        raise Unsupported(f"TreeSpec.{name} with arguments unknown at trace time", kind="pytree")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return self.source.name() if self.source is not None else glue.constant(self.spec)


def _wrap_structure(tx: "Tracer", value: Any) -> Variable:
    if isinstance(value, pytree.TreeSpec):
        return TreeSpecVariable(value)
    if type(value) in (list, tuple):
        items = [_wrap_structure(tx, v) for v in value]
        return ListVariable(items) if type(value) is list else TupleVariable(items)
    return tx.wrap(value, None)


# ------------------------------------------------------------------------------ taking trees apart

class _Slot:
    """A stand-in child in a skeleton: the registry's flatten function says where it goes."""

    def __init__(self, index: int) -> None:
        self.index = index


def node_type(var: Variable) -> Any:
    """The registry key of `var`'s type (torch's `_get_node_type`), or None for a leaf."""
    if isinstance(var, (TensorVariable, SymIntVariable)):
        return None
    kind = var.python_type()
    key = collections.namedtuple if pytree.is_namedtuple_class(kind) else kind
    return key if key in pytree.SUPPORTED_NODES else None


def _skeleton(var: Variable, key: Any) -> tuple[Any, list[Variable]] | None:
    """A real container shaped like `var` holding slots, for the types whose items capture tracks."""
    if isinstance(var, TupleVariable):
        items = list(var.items)
        if key is torch.Size:
            return torch.Size(range(len(items))), items
        slots = [_Slot(i) for i in range(len(items))]
        if var.tuple_type is tuple:
            return tuple(slots), items
        if key is collections.namedtuple:
            return var.tuple_type(*slots), items
        return var.tuple_type(slots), items  # a torch.return_types structseq
    if isinstance(var, ListVariable) and key is list:
        return [_Slot(i) for i in range(len(var.items))], list(var.items)
    if isinstance(var, DictVariable) and key in (dict, collections.OrderedDict):
        keys = list(var.items)
        return key(zip(keys, (_Slot(i) for i in range(len(keys))))), [var.items[k] for k in keys]
    return None


def _slot_index(child: Any) -> int:
    return child if isinstance(child, int) else child.index


def children(tx: "Tracer", var: Variable, key: Any, with_keys: bool = False) -> tuple[list[Any], Any]:
    """(children, context) of a node, as the registry's flatten function gives them; with_keys:
    children are (key entry Variable, child) pairs, from its flatten_with_keys function."""
    node_def = pytree.SUPPORTED_NODES[key]
    flatten = node_def.flatten_with_keys_fn if with_keys else node_def.flatten_fn
    if flatten is None:
        raise Unsupported(f"no flatten_with_keys_fn registered for {key} (raised natively)", kind="pytree")
    shaped = _skeleton(var, key)
    if shaped is not None:
        skeleton, items = shaped
        pieces, context = flatten(skeleton)
        if with_keys:
            return [(tx.wrap(k, None), items[_slot_index(c)]) for k, c in pieces], context
        return [items[_slot_index(c)] for c in pieces], context
    result = call_real(tx, flatten, [var])
    parts_var, context_var = tx.iterate(result)
    parts: list[Any] = tx.iterate(parts_var)
    if with_keys:
        parts = [tuple(tx.iterate(pair)) for pair in parts]
    return parts, real_value(context_var)


def _is_leaf(tx: "Tracer", var: Variable, is_leaf: Variable | None) -> bool:
    if is_leaf is None or (is_leaf.is_constant() and is_leaf.as_constant() is None):
        return False
    answer = is_leaf.call(tx, [var], {})
    if not answer.is_constant():
        raise Unsupported("a pytree is_leaf that depends on tensor data", kind="pytree")
    return bool(answer.as_constant())


def flatten(tx: "Tracer", var: Variable, is_leaf: Variable | None = None) -> tuple[list[Variable], pytree.TreeSpec]:
    """`tree_flatten` over Variables: the leaves and the real TreeSpec."""
    leaves: list[Variable] = []

    def walk(node: Variable) -> pytree.TreeSpec:
        key = None if _is_leaf(tx, node, is_leaf) else node_type(node)
        if key is None:
            leaves.append(node)
            return pytree.treespec_leaf()
        parts, context = children(tx, node, key)
        return pytree.TreeSpec(key, context, [walk(child) for child in parts])

    return leaves, walk(var)


def flatten_with_path(tx: "Tracer", var: Variable, is_leaf: Variable | None) -> list[tuple[list[Variable], Variable]]:
    """(key path, leaf) pairs: the path as the list of key-entry Variables from the root."""
    found: list[tuple[list[Variable], Variable]] = []

    def walk(path: list[Variable], node: Variable) -> None:
        key = None if _is_leaf(tx, node, is_leaf) else node_type(node)
        if key is None:
            found.append((path, node))
            return
        for entry, child in children(tx, node, key, with_keys=True)[0]:
            walk([*path, entry], child)

    walk([], var)
    return found


def flatten_up_to(tx: "Tracer", spec: pytree.TreeSpec, var: Variable) -> list[Variable]:
    """The subtrees of `var` at the leaves of `spec` (torch's TreeSpec.flatten_up_to)."""
    found: list[Variable] = []

    def walk(sub: pytree.TreeSpec, node: Variable) -> None:
        if sub.is_leaf():
            found.append(node)
            return
        key = node_type(node)
        dicts = (dict, collections.OrderedDict)
        if key in dicts and sub.type in dicts and isinstance(node, DictVariable):
            if set(node.items) != set(sub.context):
                raise Unsupported("tree_map over dicts with different keys (raised natively)", kind="pytree")
            parts = [node.items[k] for k in sub.context]
        else:
            if key != sub.type:
                raise Unsupported(f"tree structure mismatch: expected {sub.type}, got {key} (raised natively)",
                                  kind="pytree")
            parts, context = children(tx, node, key)
            if len(parts) != sub.num_children or (key is not collections.deque and context != sub.context):
                raise Unsupported("tree structure mismatch (raised natively)", kind="pytree")
        for child_spec, child in zip(sub.children(), parts):
            walk(child_spec, child)

    walk(spec, var)
    return found


def unflatten(tx: "Tracer", spec: pytree.TreeSpec, leaves: list[Variable]) -> Variable:
    """`tree_unflatten` over Variables: the tree of `spec` holding `leaves`."""
    if len(leaves) != spec.num_leaves:
        raise Unsupported(f"unflatten: {len(leaves)} leaves for a spec of {spec.num_leaves} (raised natively)",
                          kind="pytree")
    position = iter(leaves)

    def build(sub: pytree.TreeSpec) -> Variable:
        if sub.is_leaf():
            return next(position)
        return _rebuild(tx, sub.type, sub.context, [build(child) for child in sub.children()])

    return build(spec)


def _rebuild(tx: "Tracer", key: Any, context: Any, parts: list[Variable]) -> Variable:
    if key is tuple:
        return TupleVariable(parts)
    if key is list:
        return ListVariable(parts)
    if key is collections.namedtuple:
        return TupleVariable(parts, context)
    if key in (dict, collections.OrderedDict):
        return DictVariable(dict(zip(context, parts)), key)
    if key is torch.Size or pytree.is_structseq_class(key):
        return TupleVariable(parts, key)
    unflatten_fn = pytree.SUPPORTED_NODES[key].unflatten_fn
    if getattr(unflatten_fn, "__qualname__", "") == "register_dataclass.<locals>._unflatten_fn":
        # register_dataclass's: the class called with the fields by name (its own body goes through
        # dict.fromkeys for the fields that were None, which the context already lists)
        flat_names, none_names = context
        fields = {**dict(zip(flat_names, parts)), **{name: ConstantVariable(None) for name in none_names}}
        return tx.wrap(key, None).call(tx, [], fields)
    return call_real(tx, unflatten_fn, [ListVariable(parts), _wrap_structure(tx, context)])


def call_real(tx: "Tracer", fn: Any, args: list[Variable]) -> Variable:
    """Call a real function the registry holds (inlined like any Python function)."""
    if isinstance(fn, functools.partial):
        return PartialVariable(tx.wrap(fn.func, None), [tx.wrap(a, None) for a in fn.args],
                               {k: tx.wrap(v, None) for k, v in fn.keywords.items()}).call(tx, args, {})
    return tx.wrap(fn, None).call(tx, args, {})


# ------------------------------------------------------------------------------ the functions

def _leaf_predicate(tx: "Tracer", type_or_pred: Variable) -> Callable[[Variable], bool]:
    """`map_only`'s test: isinstance against a type (or tuple of types), else a predicate call."""
    try:
        kinds = real_value(type_or_pred)
    except Unsupported:
        kinds = None
    if isinstance(kinds, type) or (isinstance(kinds, tuple) and all(isinstance(k, type) for k in kinds)):
        check = tx.wrap(isinstance, None)
        return lambda leaf: bool(check.call(tx, [leaf, type_or_pred], {}).as_constant())

    def predicate(leaf: Variable) -> bool:
        answer = type_or_pred.call(tx, [leaf], {})
        if not answer.is_constant():
            raise Unsupported("a pytree predicate that depends on tensor data", kind="pytree")
        return bool(answer.as_constant())
    return predicate


def _truth(tx: "Tracer", answer: Variable) -> bool:
    return answer.truth(tx)  # a tensor answer is a data-dependent branch, as bool() on it is


@handles("tree_flatten")
def _tree_flatten(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    leaves, spec = flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])
    return TupleVariable([ListVariable(leaves), TreeSpecVariable(spec)])


@handles("tree_leaves")
def _tree_leaves(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return ListVariable(flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[0])


@handles("tree_iter")
def _tree_iter(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return IteratorVariable(flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[0])


@handles("tree_structure")
def _tree_structure(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return TreeSpecVariable(flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[1])


@handles("tree_is_leaf")
def _tree_is_leaf(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    tree = a.arguments["tree"]
    return ConstantVariable(_is_leaf(tx, tree, a.arguments["is_leaf"]) or node_type(tree) is None)


@handles("tree_unflatten")
def _tree_unflatten(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    leaves, spec = a.arguments["leaves"], a.arguments["treespec"]
    if isinstance(leaves, TreeSpecVariable):  # torch accepts the two swapped
        leaves, spec = spec, leaves
    if not isinstance(spec, TreeSpecVariable):
        raise Unsupported("tree_unflatten with a treespec unknown at trace time", kind="pytree")
    return unflatten(tx, spec.spec, tx.iterate(leaves))


def _map(tx: "Tracer", a: inspect.BoundArguments, fn: Callable[[list[Variable]], Variable]) -> Variable:
    leaves, spec = flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])
    rests = [flatten_up_to(tx, spec, r) for r in a.arguments["rests"]]
    return unflatten(tx, spec, [fn([leaf, *others]) for leaf, *others in zip(leaves, *rests)])


@handles("tree_map")
def _tree_map(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    func = a.arguments["func"]
    return _map(tx, a, lambda args: func.call(tx, args, {}))


@handles("tree_map_")
def _tree_map_in_place(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    func = a.arguments["func"]
    leaves, spec = flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])
    rests = [flatten_up_to(tx, spec, r) for r in a.arguments["rests"]]
    for leaf, *others in zip(leaves, *rests):
        func.call(tx, [leaf, *others], {})
    return a.arguments["tree"]


@handles("tree_map_only")
def _tree_map_only(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    func, test = a.arguments["func"], _leaf_predicate(tx, a.arguments["type_or_types_or_pred"])
    leaves, spec = flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])
    return unflatten(tx, spec, [func.call(tx, [leaf], {}) if test(leaf) else leaf for leaf in leaves])


@handles("tree_map_only_")
def _tree_map_only_in_place(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    func, test = a.arguments["func"], _leaf_predicate(tx, a.arguments["type_or_types_or_pred"])
    for leaf in flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[0]:
        if test(leaf):
            func.call(tx, [leaf], {})
    return a.arguments["tree"]


def _all_or_any(tx: "Tracer", a: inspect.BoundArguments, want: bool, only: bool) -> Variable:
    pred = a.arguments["pred"]
    test = _leaf_predicate(tx, a.arguments["type_or_types"]) if only else (lambda leaf: True)
    for leaf in flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[0]:
        if test(leaf) and _truth(tx, pred.call(tx, [leaf], {})) == want:
            return ConstantVariable(want)  # all() stops at the first False, any() at the first True
    return ConstantVariable(not want)


@handles("tree_all")
def _tree_all(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return _all_or_any(tx, a, False, only=False)


@handles("tree_any")
def _tree_any(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return _all_or_any(tx, a, True, only=False)


@handles("tree_all_only")
def _tree_all_only(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return _all_or_any(tx, a, False, only=True)


@handles("tree_any_only")
def _tree_any_only(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return _all_or_any(tx, a, True, only=True)


@handles("arg_tree_leaves")
def _arg_tree_leaves(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    leaves: list[Variable] = []
    for arg in [*a.arguments["args"], *a.arguments["kwargs"].values()]:
        leaves.extend(flatten(tx, arg)[0])
    return ListVariable(leaves)


def _path_pairs(tx: "Tracer", a: inspect.BoundArguments) -> list[Variable]:
    return [TupleVariable([TupleVariable(path), leaf])
            for path, leaf in flatten_with_path(tx, a.arguments["tree"], a.arguments["is_leaf"])]


@handles("tree_flatten_with_path")
def _tree_flatten_with_path(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    spec = flatten(tx, a.arguments["tree"], a.arguments["is_leaf"])[1]
    return TupleVariable([ListVariable(_path_pairs(tx, a)), TreeSpecVariable(spec)])


@handles("tree_leaves_with_path")
def _tree_leaves_with_path(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    return ListVariable(_path_pairs(tx, a))


@handles("tree_map_with_path")
def _tree_map_with_path(tx: "Tracer", a: inspect.BoundArguments) -> Variable:
    func, tree, is_leaf = a.arguments["func"], a.arguments["tree"], a.arguments["is_leaf"]
    spec = flatten(tx, tree, is_leaf)[1]
    pairs = flatten_with_path(tx, tree, is_leaf)
    rests = [flatten_up_to(tx, spec, r) for r in a.arguments["rests"]]
    results = [func.call(tx, [TupleVariable(path), leaf, *others], {})
               for (path, leaf), *others in zip(pairs, *rests)]
    return unflatten(tx, spec, results)


_FUNCTIONS = _pytree_functions()
assert set(_FUNCTIONS.values()) == set(HANDLERS), "every pytree function has a handler"
