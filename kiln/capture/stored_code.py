"""What generated Python read back from the frame cache may contain, checked before it runs.

A stored frame entry holds two kinds of text that become code again in a later process: guard
sources (expressions over L, G, F, pasted into the regenerated guard function) and the glue's
source (a function `glue(L, G, F)` that calls the compiled graphs). Both are written by capture
(kiln/capture/sources.py, glue.py) in a small vocabulary, and an entry is stored and used only
when its text stays inside it: reads of L, G, F (subscripts, attributes, the few calls sources
use: `.size()`, `type(x)`, `__import__('sys').modules`...), calls of the entry's own graphs, and,
in the glue, stores whose values come from graph outputs and constants rather than from objects
read off L or G (so a store cannot plant a function somewhere the program will call later). This
is a second line behind the cache directory's permission check (kiln.runtime.store), not a
sandbox. No PyTorch counterpart (Dynamo does not persist its bytecode).
"""
from __future__ import annotations

import ast
from typing import Iterable

# builtins that guard sources and glue expressions call (sources.py, symbolic/render.py)
_CALLABLE_BUILTINS = frozenset({"type", "list", "len", "min", "max", "abs", "int", "iter", "format"})
_READ_BUILTINS = _CALLABLE_BUILTINS | {"dict"}
_IMPORTABLE = frozenset({"sys", "os"})  # `__import__('sys').modules[m]`, `__import__('os').environ`
# methods a source calls: tensor sizes, dict views, os.environ.get, dict.__getitem__, __reduce__
_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel", "values", "keys", "items", "get",
                      "__getitem__", "__reduce__"})
# Sources read any attribute the program read (a library's own `__validators__`, a method's
# `__func__`), so dunder reads are admitted except those that reach a module's globals or other
# classes (the first step of an escape from an expression); a store to any dunder is refused.
_DENIED_DUNDERS = frozenset({"__globals__", "__builtins__", "__subclasses__", "__base__", "__bases__", "__mro__",
                             "__import__", "__loader__", "__spec__", "__code__", "__getattribute__", "__init_subclass__"})
_CONTAINER_UPDATES = frozenset({"clear", "update"})  # a dict's contents rewritten (side_effects.py)
_EXPRESSION_NODES = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.Attribute, ast.Subscript,
                     ast.Call, ast.Tuple, ast.List, ast.Dict, ast.Set, ast.Slice, ast.BinOp, ast.UnaryOp,
                     ast.BoolOp, ast.Compare, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.keyword,
                     ast.Starred)


class UnsafeSource(ValueError):
    """Stored text outside the vocabulary capture writes: the entry is not stored or not used."""


def check_expression(node: ast.AST, names: Iterable[str] = ()) -> None:
    """Raise UnsafeSource unless `node` (an expression tree) reads only L, G, F, `names` and the
    builtins above, and calls only what sources and graphs need."""
    allowed = {"L", "G", "F", *names}
    for sub in ast.walk(node):
        if not isinstance(sub, _EXPRESSION_NODES):
            raise UnsafeSource(f"{type(sub).__name__} in stored code")
        if isinstance(sub, ast.Name) and sub.id not in allowed and sub.id not in _READ_BUILTINS \
                and sub.id != "__import__":
            raise UnsafeSource(f"stored code reads {sub.id!r}")
        if isinstance(sub, ast.Attribute) and sub.attr in _DENIED_DUNDERS:
            raise UnsafeSource(f"stored code reads attribute {sub.attr!r}")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, complex, str, bytes, bool,
                                                                         type(None), type(Ellipsis))):
            raise UnsafeSource("stored code holds an odd constant")
        if isinstance(sub, ast.Call):
            _check_call(sub, allowed)


def _check_call(call: ast.Call, allowed: set[str]) -> None:
    func = call.func
    if isinstance(func, ast.Name):
        if func.id == "__import__":
            if not (len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value in _IMPORTABLE):
                raise UnsafeSource("stored code imports a module")
            return
        if func.id in _CALLABLE_BUILTINS or (func.id in allowed and func.id not in ("L", "G", "F")):
            return
    elif isinstance(func, ast.Attribute) and func.attr in _METHODS:
        return
    raise UnsafeSource(f"stored code calls {ast.unparse(func)}")


def check_guard_source(text: str) -> None:
    """A guard's source (or a shape guard's whole Python text)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise UnsafeSource(f"guard source does not parse: {text!r:.80}") from exc
    check_expression(tree)


def check_glue_source(source: str, glue_name: str, graph_names: Iterable[str],
                      constant_names: Iterable[str] = ()) -> None:
    """The glue of a stored entry: one function `glue_name(L, G, F)` of assignments, dict rewrites
    and a return. `constant_names`: the entry's admitted constants (ModelOutput classes and the few
    callables capture binds, checked by kiln.capture.persist), which the glue may read and call.

    Objects read off L or G (tainted values) may be stored only where the frame's own data lives
    or where the glue's own containers are: a subscript chain rooted at L (the caller's
    containers, as a rewritten `kwargs` dict) or a container the glue built (a dict or list
    display, a ModelOutput it constructed). Never into an attribute, nor anywhere under G."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UnsafeSource("glue source does not parse") from exc
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != glue_name:
        raise UnsafeSource("glue source is not one function")
    fn = tree.body[0]
    if fn.decorator_list or [a.arg for a in fn.args.args] != ["L", "G", "F"] or fn.args.defaults \
            or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs:
        raise UnsafeSource("glue function has another signature")
    graphs = set(graph_names)
    constants = set(constant_names)
    reserved = {"L", "G", "F"} | graphs | constants
    local_names: set[str] = set()
    tainted: set[str] = set()  # locals holding something read off L, G or F
    fresh: set[str] = set()  # locals holding a container the glue built
    for statement in fn.body:
        known = graphs | constants | local_names
        if isinstance(statement, ast.Return) and statement.value is not None:
            check_expression(statement.value, known)
        elif isinstance(statement, ast.Assign):
            check_expression(statement.value, known)
            reads_objects = _reads_objects(statement.value, tainted, graphs)
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    if target.id in reserved:
                        raise UnsafeSource(f"glue rebinds {target.id}")
                    local_names.add(target.id)
                    tainted.discard(target.id)
                    fresh.discard(target.id)
                    if reads_objects:
                        tainted.add(target.id)
                    if _builds_container(statement.value, constants):
                        fresh.add(target.id)
                elif isinstance(target, (ast.Attribute, ast.Subscript)):
                    if reads_objects and not (isinstance(target, ast.Subscript) and _own_data(target.value, fresh)):
                        raise UnsafeSource("glue stores an object read off L, G or F")
                    check_expression(target.value, known)
                    if isinstance(target, ast.Subscript):
                        check_expression(target.slice, known)
                    if isinstance(target, ast.Attribute) and target.attr.startswith("__"):
                        raise UnsafeSource(f"glue stores attribute {target.attr!r}")
                else:
                    raise UnsafeSource(f"glue assigns to a {type(target).__name__}")
        elif isinstance(statement, ast.Expr) and _container_update(statement.value, fresh):
            call = statement.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            for part in (call.func.value, *call.args):  # the method itself is no expression's to call
                check_expression(part, known)
        else:
            raise UnsafeSource(f"glue holds a {type(statement).__name__} statement")


def _own_data(node: ast.AST, fresh: set[str]) -> bool:
    """A subscript chain rooted at L, or a container the glue built."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and (node.id == "L" or node.id in fresh)


def _builds_container(value: ast.AST, constants: set[str]) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Tuple)):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in constants


def _container_update(call: ast.AST, fresh: set[str]) -> bool:
    """`<own data>.clear()` or `<own data>.update(<local or dict display>)`: a dict rewritten."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and not call.keywords
            and call.func.attr in _CONTAINER_UPDATES and _own_data(call.func.value, fresh)):
        return False
    if call.func.attr == "clear":
        return not call.args
    return len(call.args) == 1 and isinstance(call.args[0], (ast.Name, ast.Dict))


def _reads_objects(value: ast.AST, tainted: set[str], graphs: set[str]) -> bool:
    """Whether `value` can evaluate to an object read off L, G or F rather than a graph output, a
    constant or a container of those: an attribute read, or a name of L/G/F or of such a local,
    outside the arguments of a graph call (a graph returns tensors)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in graphs:
        return False
    if isinstance(value, ast.Attribute):
        return True
    if isinstance(value, ast.Name):
        return value.id in ("L", "G", "F") or value.id in tainted
    return any(_reads_objects(child, tainted, graphs) for child in ast.iter_child_nodes(value))
