"""The grammar of stored code: what generated Python read back from the frame cache may contain (an allowlist).

A stored frame entry holds two kinds of text that become code again in a later process: guard
sources (expressions over L, G, F, pasted into the regenerated guard function) and the glue's
source (a function `glue(L, G, F)` that calls the compiled graphs). Both are written by capture
(kiln/capture/sources.py, symbolic/render.py, side_effects.py, glue.py) in a small grammar, and an
entry is stored and used only when its text parses as that grammar, form by form (`_read`,
`_guard_expression`, `_glue_value`): nothing outside it is admitted, whatever it would do. In
particular the only calls are the graphs, the entry's admitted constants, the resume functions and
break callees kiln.capture.persist.frames regenerated, and the fixed reads sources write (`type(x)`,
`x.size()`, `dict.__getitem__(x, k)`, `__import__('os').environ.get('K')`...). Stores in the glue take values
from graph outputs and constants rather than from objects read off L or G (so a store cannot plant
a function somewhere the program will call later), except the frame's own values set on its own
objects under an attribute name its code stores (`_stores_own_attribute`). A second line behind the cache directory's
permission check (kiln.runtime.store), not a sandbox: a read of an attribute or an operator still
runs the program's own properties and dunder methods, as the program itself does.
No PyTorch counterpart (Dynamo does not persist its bytecode).
"""
from __future__ import annotations

import ast
from typing import Iterable

# Dunder attributes a source reads. Capture's own (sources.py, builder.py): closure cells, a module's
# or instance's dict, a bound method's parts, a decorator's inner function, a function's name. Read
# because programs read them (and the trace guards what it read): `self.__class__.__name__`, a
# dict type's `__getitem__` (a method identity), the `__init__` of a class the program instantiates,
# the `__len__` and `__bool__` written in Python that `len(obj)` and `bool(obj)` inlined
# (user_object.py), the validators a transformers config class holds, the `__code__` of a function a
# decorator's closure holds (a code object, compared by its type and identity, never run), and the
# protocol methods a trace inlines from an object's class (`type(obj).__getattribute__`, a
# descriptor's `__get__`, a manager's `__enter__`: functions.py gives them the class's source, so the
# cells of their closures are guarded where the trace read them): method identities, never called.
# A function's `__defaults__`/`__kwdefaults__`: the default values a call read (tensors, a mutable
# default list), guarded like any input. `type(obj).__mro__[i].__dict__[name]`: the class-dict entry
# a lookup found (functions.class_dict_source; a property's fget whose cells are guarded), a class
# as `__class__` reaches one (no call is in the grammar, so no `__subclasses__()` beyond it).
# Any other dunder (__globals__, __builtins__, __subclasses__, __bases__...) is outside the grammar:
# such an entry is not stored, or not used.
DUNDER_READS = frozenset({"__closure__", "__dict__", "__self__", "__func__", "__wrapped__", "__name__",
                          "__class__", "__getitem__", "__init__", "__len__", "__bool__", "__validators__",
                          "__code__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__get__",
                          "__set__", "__delete__", "__enter__", "__exit__", "__call__", "__eq__", "__hash__",
                          "__iter__", "__next__", "__contains__", "__defaults__", "__kwdefaults__", "__mro__"})
# Methods a source calls, always without arguments: sizes and strides of a tensor (shape guards,
# TensorSpec), a constant-folded `.item()` (constant_fold.py), `__reduce__` of a singleton key.
ZERO_ARG_METHODS = frozenset({"size", "stride", "storage_offset", "item", "__reduce__"})
# Builtins that shape guards call (symbolic/render.py), each on expressions of the same grammar.
SHAPE_BUILTINS = frozenset({"min", "max", "abs", "int", "float", "round"})
# nn.Module's own tables: what they hold belongs to the module (a frame's own data, for a break)
MODULE_TABLES = frozenset({"_modules", "_parameters", "_buffers"})
# Methods the glue calls as a statement on its own containers (side_effects.py: a dict rewritten).
CONTAINER_UPDATES = frozenset({"clear", "update"})
_LITERALS = (int, float, complex, str, bytes, bool, type(None))
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult, ast.BitAnd,
              ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot, ast.In, ast.NotIn)


class UnsafeSource(ValueError):
    """Stored text outside the vocabulary capture writes: the entry is not stored or not used."""


def _text(node: ast.AST) -> str:
    return ast.unparse(node)[:80]


def _literal(node: ast.AST) -> bool:
    """A literal key or argument: a number, string, bytes, bool, None, or a tuple of them."""
    if isinstance(node, ast.Constant):
        return type(node.value) in _LITERALS
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)
    if isinstance(node, ast.Tuple):
        return all(_literal(e) for e in node.elts)
    return False


def _literal_slice(node: ast.AST) -> bool:
    """`[a:b:c]` with literal bounds (an iterator's unread rest: iterator.py)."""
    return isinstance(node, ast.Slice) and all(
        part is None or _literal(part) for part in (node.lower, node.upper, node.step))


def _str_constant(node: ast.AST, values: Iterable[str] | None = None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is str and (values is None or node.value in values)


def _plain_call(node: ast.Call, nargs: int) -> bool:
    return len(node.args) == nargs and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)


def _read(node: ast.AST, roots: set[str]) -> None:
    """A source expression (sources.py): a root name, then attribute reads, literal subscripts and
    the fixed calls of the Source kinds. Raises UnsafeSource for anything else."""
    if isinstance(node, ast.Name):
        if node.id not in roots:
            raise UnsafeSource(f"stored code reads {node.id!r}")
        return
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("__") and node.attr not in DUNDER_READS:
            raise UnsafeSource(f"stored code reads attribute {node.attr!r}")
        _read(node.value, roots)
        return
    if isinstance(node, ast.Subscript):
        if not _literal(node.slice) and not _literal_slice(node.slice):
            raise UnsafeSource(f"stored code subscripts with {_text(node.slice)}")
        if _import_modules(node.value):  # __import__('sys').modules['name']
            if not _str_constant(node.slice):
                raise UnsafeSource("stored code reads sys.modules with a key that is not a name")
            return
        _read(node.value, roots)
        return
    if isinstance(node, ast.Call):
        _read_call(node, roots)
        return
    raise UnsafeSource(f"{type(node).__name__} where stored code reads a value: {_text(node)}")


def _import_modules(node: ast.AST) -> bool:
    """`__import__('sys').modules`."""
    return (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Call)
            and _is_import(node.value, "sys"))


def _is_import(node: ast.Call, module: str) -> bool:
    return (isinstance(node.func, ast.Name) and node.func.id == "__import__" and _plain_call(node, 1)
            and _str_constant(node.args[0], (module,)))


def _read_call(node: ast.Call, roots: set[str]) -> None:
    """The calls of sources.py, each in its one form."""
    func = node.func
    if isinstance(func, ast.Name) and func.id == "type" and _plain_call(node, 1):  # TypeSource
        _read(node.args[0], roots)
        return
    if isinstance(func, ast.Name) and func.id == "list" and _plain_call(node, 1):  # DictValueSource
        inner = node.args[0]
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "values" \
                and _plain_call(inner, 0):
            _read(inner.func.value, roots)
            return
    if isinstance(func, ast.Attribute):
        if func.attr == "__getitem__" and isinstance(func.value, ast.Name) and func.value.id == "dict" \
                and _plain_call(node, 2) and _literal(node.args[1]):  # RawItemSource
            _read(node.args[0], roots)
            return
        if func.attr == "get" and _plain_call(node, 1) and _str_constant(node.args[0]) \
                and isinstance(func.value, ast.Attribute) and func.value.attr == "environ" \
                and isinstance(func.value.value, ast.Call) and _is_import(func.value.value, "os"):  # EnvironSource
            return
        if func.attr in ZERO_ARG_METHODS and _plain_call(node, 0):  # CallSource, sizes and strides
            _read(func.value, roots)
            return
    raise UnsafeSource(f"stored code calls {_text(func)}")


def _guard_expression(node: ast.AST, roots: set[str]) -> None:
    """A guard's text: a source, or a shape guard's arithmetic, comparisons and boolean logic over
    sources and numbers (symbolic/render.py)."""
    if _literal(node):
        return
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _guard_expression(value, roots)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        _guard_expression(node.operand, roots)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        _guard_expression(node.left, roots)
        _guard_expression(node.right, roots)
    elif isinstance(node, ast.Compare) and all(isinstance(op, _COMPARISONS) for op in node.ops):
        for part in (node.left, *node.comparators):
            _guard_expression(part, roots)
    elif isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _guard_expression(part, roots)
    elif isinstance(node, ast.Call) and (_shape_function(node.func)) \
            and not node.keywords and node.args and not any(isinstance(a, ast.Starred) for a in node.args):
        for arg in node.args:
            _guard_expression(arg, roots)
    else:
        _read(node, roots)


def _shape_function(func: ast.AST) -> bool:
    """A function shape guards call: a builtin of SHAPE_BUILTINS, or math.sqrt / math.log2 of a float."""
    if isinstance(func, ast.Name):
        return func.id in SHAPE_BUILTINS
    return isinstance(func, ast.Attribute) and func.attr in ("sqrt", "log2") and isinstance(func.value, ast.Name) \
        and func.value.id == "math"


def check_guard_source(text: str) -> None:
    """A guard's source (or a shape guard's whole Python text)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise UnsafeSource(f"guard source does not parse: {text!r:.80}") from exc
    _guard_expression(tree.body, {"L", "G", "F"})


def rooted_at_locals(text: str) -> bool:
    """Whether a source reads the frame's locals through attributes and subscripts only
    (`L['cache'].layer_class`): a value of the frame's own data, not one reached from the globals."""
    try:
        node: ast.AST = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not _literal(node.slice):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


class _Glue:
    """The names of one glue function while it is checked: what may be called and what may be read."""

    def __init__(self, graphs: set[str], constants: set[str], callees: set[str], methods: set[str],
                 classes: Iterable[str] = (), contexts: Iterable[str] = ()) -> None:
        self.graphs = graphs
        self.classes = set(classes)  # classes whose instances the glue rebuilds (`C.__new__(C)`)
        self.constants = constants
        self.callees = callees  # resume functions and break callees, regenerated by kiln.capture.persist.frames
        self.methods = methods  # methods a break may call on a graph output: names the frame's code uses
        self.locals: set[str] = set()
        self.tainted: set[str] = set()  # locals holding something read off L, G or F
        self.outputs: set[str] = set()  # locals holding a graph call's outputs (`__out`)
        self.frame_values: set[str] = set()  # locals holding the frame's own values (`_break_argument`)
        self.scalars: set[str] = set()  # sources the entry's guards pin to ints, floats, bools or plain tensors
        self.scalar_locals: set[str] = set()  # locals holding a display of literals and those
        self.context_classes = set(contexts)  # constants that are context managers (torch.no_grad)
        self.contexts: set[str] = set()  # locals holding a context manager made from one of them
        self.containers: dict[str, str] = {}  # local -> the frame's container it holds (`L['c'].states`)
        self.items_of: dict[str, str] = {}  # local -> the frame's container it holds an item of
        self.attributes: set[str] = set()  # attributes the frame's code stores (`_stores_own_attribute`)
        self.own_values: set[str] = set()  # locals holding the frame's own values or displays of them
        self.cells: set[str] = set()  # constants that are types.CellType (`_break_argument`)
        self.setattrs: set[str] = set()  # constants that are object.__setattr__ (`_plain_setattr`)

    @property
    def roots(self) -> set[str]:
        return {"L", "G", "F"} | self.locals | self.constants


def _glue_value(node: ast.AST, glue: _Glue) -> None:
    """An expression of the glue: a read (a source, a glue local, an admitted constant), a literal,
    a display of glue values, a call of a graph, of an admitted constant (a ModelOutput class, grad
    mode, a container type) or of a regenerated resume function or callee."""
    if _literal(node):
        return
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            _glue_value(element.value if isinstance(element, ast.Starred) else element, glue)
        return
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is not None:
                _glue_value(key, glue)
            _glue_value(value, glue)
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in glue.graphs | glue.constants:
        for arg in node.args:
            _glue_value(arg.value if isinstance(arg, ast.Starred) else arg, glue)
        for keyword in node.keywords:
            _glue_value(keyword.value, glue)
        return
    if isinstance(node, ast.Call) and _break_callee(node.func, glue):
        _break_arguments(node, glue)
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "iter" \
            and _plain_call(node, 1) and _tuple_items(node.args[0]):
        _glue_value(node.args[0], glue)  # a loop's iterator at a break (iterator.py)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _tuple_items(node):
        _glue_value(node.left, glue)
        _glue_value(node.right, glue)
        return
    if isinstance(node, ast.Compare) and all(isinstance(op, _VALUE_COMPARISONS) for op in node.ops) \
            and all(_scalar_value(part, glue) for part in (node.left, *node.comparators)):
        # a comparison at a break (`list(t.size()) == [8, n, 8]` with n a 0-d tensor): only of
        # values whose types the guards pin, so no comparison method but Python's and torch's runs
        for part in (node.left, *node.comparators):
            _glue_value(part, glue)
        return
    if _context_exit(node, glue):
        return  # a with block's bound exit, handed to the resume function that leaves the block
    if isinstance(node, ast.Subscript) and not _literal(node.slice) and not _literal_slice(node.slice):
        # a graph output's slot is a literal; a stored glue indexes nothing with a computed key
        raise UnsafeSource(f"glue subscripts with {_text(node.slice)}")
    _read(node, glue.roots)


_VALUE_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _scalar_value(node: ast.AST, glue: _Glue) -> bool:
    """A literal, a source the entry's guards pin to an int, float, bool or plain tensor, a local
    holding a display of those, or a list or tuple display of them."""
    if _literal(node):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_scalar_value(e, glue) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in glue.scalar_locals:
        return True
    return _rooted_at_l(node) and ast.unparse(node) in glue.scalars


def _rooted_at_l(node: ast.AST) -> bool:
    while isinstance(node, ast.Subscript) and _literal(node.slice):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


def _context_exit(node: ast.AST, glue: _Glue) -> bool:
    """`__ctx0.__exit__` of a context manager the glue made from an admitted class and entered."""
    return isinstance(node, ast.Attribute) and node.attr == "__exit__" and isinstance(node.value, ast.Name) \
        and node.value.id in glue.contexts


def _tuple_items(node: ast.AST) -> bool:
    """What iterator.py iterates over: a tuple display, the rest of a tuple read with a literal
    slice, or the two added."""
    if isinstance(node, ast.Tuple):
        return True
    if isinstance(node, ast.Subscript) and _literal_slice(node.slice):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _tuple_items(node.left) \
        and _tuple_items(node.right)


def _break_callee(func: ast.AST, glue: _Glue) -> bool:
    """What a glue calls at a graph break: a resume function or compiled callee frames.py made
    again (`__resume0`, `__resume0(F)` for a frame with a closure), or a method the frame's code
    names of a value the graphs computed (`__out[0].item`)."""
    if isinstance(func, ast.Name):
        return func.id in glue.callees
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id in glue.callees \
            and _plain_call(func, 1) and isinstance(func.args[0], ast.Name) and func.args[0].id == "F":
        return True
    if isinstance(func, ast.Attribute) and func.attr in glue.methods and not func.attr.startswith("__"):
        receiver = func.value
        while isinstance(receiver, ast.Subscript) and _literal(receiver.slice):
            receiver = receiver.value
        if isinstance(receiver, ast.Name) and receiver.id in glue.outputs:  # a tensor or number a graph computed
            _glue_value(func.value, glue)
            return True
    return False


def _break_arguments(call: ast.Call, glue: _Glue) -> None:
    """The arguments of a break's call: graph outputs, literals, the glue's own values, and the
    frame's locals as they are (`L['x']`); never an object reached through an attribute or a global,
    which a forged entry could otherwise hand to code that calls it."""
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, ast.Starred):
            arg = arg.value
        if not _break_argument(arg, glue):
            raise UnsafeSource(f"a break's call takes an object read off L, G or F: {_text(arg)}")
        _glue_value(arg, glue)


def _break_argument(node: ast.AST, glue: _Glue) -> bool:
    """What `_break_arguments` admits: a value that reads no object off L, G or F, the frame's own
    value (`_frame_own`), one attribute of it that the frame's code names (`L['self'].loss_function`:
    a break at a LOAD_ATTR the trace could not run), a glue local holding one, or a display
    (`(L['self'],)`, `{'a': L['a']}`: the star-arguments of a call) of those."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_break_argument(e.value if isinstance(e, ast.Starred) else e, glue) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is None or _literal(k) for k in node.keys) and all(_break_argument(v, glue) for v in node.values)
    if isinstance(node, ast.Name) and node.id in glue.frame_values or _context_exit(node, glue):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in glue.cells \
            and not node.keywords and len(node.args) <= 1:  # a cell around one of those (or empty)
        return all(not isinstance(a, ast.Starred) and _break_argument(a, glue) for a in node.args)
    if isinstance(node, ast.Attribute) and node.attr in glue.methods and not node.attr.startswith("__") \
            and _frame_own(node.value):
        return True
    return _frame_own(node) or not _reads_objects(node, glue.tainted, glue.graphs)


def _frame_own(node: ast.AST) -> bool:
    """A value of the frame's own locals: `L['x']`, items of it, what a passed-in iterator
    iterates (`L['___stack0'].__reduce__()[1][0][2]`) and a module's own submodules and tensors
    (`L['self']._modules['encoder']`): subscripts, `__reduce__()` and nn.Module's tables from L, no
    other attribute read, so nothing reached through an object's attributes or the globals."""
    while True:
        if isinstance(node, ast.Subscript) and (_literal(node.slice) or _literal_slice(node.slice)):
            node = node.value
            if isinstance(node, ast.Attribute) and node.attr in MODULE_TABLES:
                node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__reduce__" \
                and _plain_call(node, 0):
            node = node.func.value
        else:
            return isinstance(node, ast.Name) and node.id == "L"


def _loop_iterator(value: ast.AST, glue: _Glue) -> bool:
    """`iter(...)` over a tuple display of the glue's own values and the rest of a tuple of the
    frame's own (iterator.py): what a loop broken inside hands its resume function. The display's
    items are what a break's call may take (`_break_argument`): an enumerate over a module's
    layers leaves `(1, <the frame's own layer>)` pairs to iterate."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "iter"
            and _plain_call(value, 1)):
        return False
    parts = [value.args[0]]
    while parts:
        part = parts.pop()
        if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Add):
            parts += [part.left, part.right]
        elif isinstance(part, ast.Tuple):
            if not _break_argument(part, glue):
                return False
        elif not _frame_own(part):
            return False
    return True


def check_glue_source(source: str, glue_name: str, graph_names: Iterable[str],
                      constant_names: Iterable[str] = (), callee_names: Iterable[str] = (),
                      method_names: Iterable[str] = (), class_names: Iterable[str] = (),
                      scalar_sources: Iterable[str] = (), context_names: Iterable[str] = (),
                      attribute_names: Iterable[str] = (), cell_names: Iterable[str] = (),
                      setattr_names: Iterable[str] = ()) -> None:
    """The glue of a stored entry: one function `glue_name(L, G, F)` of assignments, dict rewrites,
    grad-mode switches and a return. `constant_names`: the entry's admitted constants (ModelOutput
    classes and the few callables capture binds, checked by kiln.capture.persist), which the glue
    may read and call; `callee_names`: the resume functions and break callees frames.py rebuilt
    (and `print`), called only with what `_break_arguments` admits; `method_names`: the methods a
    break may call on graph outputs (those the frame's code names); `class_names`: classes whose
    instances the glue rebuilds, only as `C.__new__(C)` then `obj.__dict__.update({...})` with
    values that are not objects read off L, G or F (user_object.py); `scalar_sources`: sources of
    L the entry's guards pin to ints, floats, bools or plain tensors, which the glue may compare
    (unless it stores anything under L, which could replace them after the guards ran);
    `context_names`: constants that are context managers (torch.no_grad), which the glue may make
    (`__ctx0 = C()`), enter (`__ctx0.__enter__()`) and whose `__exit__` it may hand a resume function;
    `attribute_names`: the attributes the frame's own code stores (its STORE_ATTR names), which the
    glue may set on the frame's own objects to the frame's own values (`_stores_own_attribute`).
    `cell_names`: constants that are types.CellType: a cell made around what a break's call may take
    (`__const_cell_0(L['self'])`, a cell variable of the frame handed to its resume function) is one too.
    `setattr_names`: constants that are object.__setattr__, called only as an attribute store the
    rules above admit (`__const___setattr___0(owner, 'name', value)`, checked as `owner.name = value`).
    A break inside a try or with block is a top-level `try:` around the break's call, whose one
    `except BaseException as __excN:` returns a resume function's call (kiln/capture/glue.py).

    Objects read off L or G (tainted values) may be stored only where the frame's own data lives
    or where the glue's own containers are: a subscript chain rooted at L (the caller's
    containers, as a rewritten `kwargs` dict) or a container the glue built (a dict or list
    display, a ModelOutput it constructed). Never under G, and into an attribute only as the
    frame's code itself does (`_stores_own_attribute`: an autograd Function's `ctx.layers = layers`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UnsafeSource("glue source does not parse") from exc
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != glue_name:
        raise UnsafeSource("glue source is not one function")
    fn = tree.body[0]
    if fn.decorator_list or fn.returns or [a.arg for a in fn.args.args] != ["L", "G", "F"] or fn.args.defaults \
            or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs \
            or any(a.annotation for a in fn.args.args):
        raise UnsafeSource("glue function has another signature")
    graphs, constants, callees, classes = set(graph_names), set(constant_names), set(callee_names), set(class_names)
    reserved = {"L", "G", "F"} | graphs | constants | callees | classes
    glue = _Glue(graphs, constants, callees, set(method_names), classes, context_names)
    glue.attributes = {name for name in attribute_names if name.isidentifier() and not name.startswith("__")}
    glue.cells = set(cell_names) & constants
    glue.setattrs = set(setattr_names) & constants
    stores_under_l = any(isinstance(t, ast.Subscript) and _own_data(t, set()) for node in ast.walk(fn)
                         if isinstance(node, ast.Assign) for t in node.targets)
    if not stores_under_l and any(isinstance(node, ast.Compare) for node in ast.walk(fn)):  # parsed only then
        try:
            glue.scalars = {ast.unparse(ast.parse(s, mode="eval").body) for s in scalar_sources}
        except SyntaxError as exc:
            raise UnsafeSource("a guard source does not parse") from exc
    fresh: set[str] = set()  # locals holding a container the glue built
    _check_body(fn.body, glue, reserved, glue.tainted, fresh, top=True)


def _check_body(body: list[ast.stmt], glue: _Glue, reserved: set[str], tainted: set[str], fresh: set[str],
                top: bool) -> None:
    for statement in body:
        if isinstance(statement, ast.Return) and statement.value is not None:
            _glue_value(statement.value, glue)
        elif isinstance(statement, ast.Assign):
            _check_assign(statement, glue, reserved, tainted, fresh)
        elif isinstance(statement, ast.Expr) and _container_update(statement.value, fresh):
            call = statement.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            _glue_value(call.func.value, glue)  # the method itself is no expression's to call
            for arg in call.args:
                _glue_value(arg, glue)
        elif isinstance(statement, ast.Expr) and _fills_new_object(statement.value, glue, fresh):
            pass
        elif isinstance(statement, ast.Expr) and _plain_setattr(statement.value, glue):
            # `object.__setattr__(owner, 'name', value)`: an attribute write whose class's own
            # __setattr__ the trace ran already, checked as the store `owner.name = value` is
            call = statement.value
            assert isinstance(call, ast.Call) and isinstance(call.args[1], ast.Constant)
            store = ast.Assign(targets=[ast.Attribute(value=call.args[0], attr=str(call.args[1].value), ctx=ast.Store())],
                               value=call.args[2], lineno=statement.lineno)
            _check_assign(store, glue, reserved, tainted, fresh)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) \
                and isinstance(statement.value.func, ast.Name) and statement.value.func.id in glue.constants \
                and statement.value.func.id not in glue.setattrs:
            _glue_value(statement.value, glue)  # `__const__set_grad_enabled_0(False)`
        elif isinstance(statement, ast.Expr) and _enters_context(statement.value, glue):
            pass
        elif isinstance(statement, ast.Try) and top:
            _check_try(statement, glue, reserved, tainted, fresh)
        elif isinstance(statement, ast.If) and top and not statement.orelse and len(statement.body) == 1 \
                and isinstance(statement.body[0], ast.Expr) and isinstance(statement.body[0].value, ast.Call) \
                and isinstance(statement.body[0].value.func, ast.Name) \
                and statement.body[0].value.func.id in glue.constants and _plain_call(statement.body[0].value, 0):
            # `if (<an argument's number>) == 0: <divides_by_zero>()`: a zero divisor of Python numbers
            # (kiln.capture.deferred_checks.divisor_checks), the constant admitted by the frame's checks
            _glue_value(statement.test, glue)
            _glue_value(statement.body[0].value, glue)
        elif isinstance(statement, ast.If) and top and not statement.orelse \
                and all(isinstance(s, ast.Return) for s in statement.body):
            # a data-dependent branch: `if <graph output>: return <resume>(...)`
            _glue_value(statement.test, glue)
            _check_body(statement.body, glue, reserved, tainted, fresh, top=False)
        else:
            raise UnsafeSource(f"glue holds a {type(statement).__name__} statement")


def _plain_setattr(call: ast.AST, glue: _Glue) -> bool:
    """A call of an admitted `object.__setattr__` constant with an owner, an identifier that is
    a string literal and a value, nothing else."""
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in glue.setattrs \
        and _plain_call(call, 3) and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str) \
        and call.args[1].value.isidentifier() and not call.args[1].value.startswith("__")


def _enters_context(call: ast.AST, glue: _Glue) -> bool:
    """`__ctx0.__enter__()` on a context manager the glue made from an admitted class."""
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__enter__" \
        and isinstance(call.func.value, ast.Name) and call.func.value.id in glue.contexts and _plain_call(call, 0)


def _check_try(statement: ast.Try, glue: _Glue, reserved: set[str], tainted: set[str], fresh: set[str]) -> None:
    """`try: <break's call> except BaseException as __excN: return <resume>(...)`: the call runs
    under the frame's own handlers (the resume function continues at the call with the caught
    exception to re-raise, glue.py's _call_under_handlers); nothing else may sit in a try."""
    body, handlers = statement.body, statement.handlers
    if statement.orelse or statement.finalbody or len(body) != 1 or len(handlers) != 1:
        raise UnsafeSource("a glue try block of another shape")
    if _deferred_checks_call(body[0], handlers[0], glue):
        # `try: __out = <graph>(...) except Exception as __excN: <constant>(__excN, <state>)`: a
        # graph with deferred checks (kiln.capture.deferred_checks.graph_raised, an admitted constant)
        glue.locals.add(str(handlers[0].name))
        try:
            _glue_value(handlers[0].body[0].value, glue)  # type: ignore[attr-defined]
        finally:
            glue.locals.discard(str(handlers[0].name))
        _check_body(body, glue, reserved, tainted, fresh, top=False)
        return
    call = body[0].value if isinstance(body[0], (ast.Assign, ast.Expr)) else None
    if not (isinstance(call, ast.Call) and _break_callee(call.func, glue)):
        raise UnsafeSource("a glue try block around something else than a break's call")
    handler = handlers[0]
    name = handler.name
    if not (isinstance(handler.type, ast.Name) and handler.type.id == "BaseException" and name
            and name not in reserved and name not in glue.locals and len(handler.body) == 1):
        raise UnsafeSource("a glue except clause of another shape")
    returned = handler.body[0]
    if not (isinstance(returned, ast.Return) and isinstance(returned.value, ast.Call)
            and _break_callee(returned.value.func, glue)):
        raise UnsafeSource("a glue except clause that does not return a resume function's call")
    glue.locals.add(name)  # the caught exception: a value the glue made, not one read off L, G or F
    try:
        _glue_value(returned.value, glue)
    finally:
        glue.locals.discard(name)
    _check_body(body, glue, reserved, tainted, fresh, top=False)


def _deferred_checks_call(body: ast.stmt, handler: ast.ExceptHandler, glue: _Glue) -> bool:
    """The try block of a graph call with deferred checks (kiln.capture.deferred_checks.emit_checks)."""
    if not (isinstance(body, ast.Assign) and isinstance(body.value, ast.Call)
            and isinstance(body.value.func, ast.Name) and body.value.func.id in glue.graphs):
        return False
    if not (isinstance(handler.type, ast.Name) and handler.type.id == "Exception" and handler.name
            and handler.name not in glue.locals and len(handler.body) == 1 and isinstance(handler.body[0], ast.Expr)):
        return False
    call = handler.body[0].value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in glue.constants \
        and not call.keywords and len(call.args) in (2, 3) and isinstance(call.args[0], ast.Name) \
        and call.args[0].id == handler.name


def _new_object(value: ast.AST, glue: _Glue) -> bool:
    """`C.__new__(C)` for a class the entry admits (user_object.py: an object the frame built)."""
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "__new__"
            and isinstance(value.func.value, ast.Name) and value.func.value.id in glue.classes and _plain_call(value, 1)
            and isinstance(value.args[0], ast.Name) and value.args[0].id == value.func.value.id)


def _fills_new_object(call: ast.AST, glue: _Glue, fresh: set[str]) -> bool:
    """`obj.__dict__.update({'name': value, ...})` on an object `_new_object` made, with string
    keys and values that are not objects read off L, G or F."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "update"
            and _plain_call(call, 1) and isinstance(call.func.value, ast.Attribute)
            and call.func.value.attr == "__dict__" and isinstance(call.func.value.value, ast.Name)
            and call.func.value.value.id in fresh and call.func.value.value.id in glue.locals
            and isinstance(call.args[0], ast.Dict)):
        return False
    items = call.args[0]
    assert isinstance(items, ast.Dict)
    for key, value in zip(items.keys, items.values):
        if key is None or not _str_constant(key) or _reads_objects(value, glue.tainted, glue.graphs):
            raise UnsafeSource("glue fills an object with an object read off L, G or F")
        _glue_value(value, glue)
    return True


def _check_assign(statement: ast.Assign, glue: _Glue, reserved: set[str], tainted: set[str],
                  fresh: set[str]) -> None:
    value = statement.value
    if _new_object(value, glue):
        if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name) \
                or statement.targets[0].id in reserved or statement.targets[0].id.startswith("__") \
                and statement.targets[0].id.endswith("__"):
            raise UnsafeSource("glue makes an object it does not keep in a local")
        name = statement.targets[0].id
        glue.locals.add(name)
        tainted.discard(name)
        glue.own_values.discard(name)
        fresh.add(name)
        return
    # a break's call returns what the program's own call returns: its callee and arguments are
    # pinned (`_break_callee`, `_break_arguments`), so its result may go on to the resume function
    break_call = isinstance(value, ast.Call) and _break_callee(value.func, glue)
    _glue_value(value, glue)
    graph_call = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in glue.graphs
    scalar = _scalar_value(value, glue)
    reads_objects = not break_call and not scalar and not _loop_iterator(value, glue) \
        and _reads_objects(value, tainted, glue.graphs)
    own_value = reads_objects and _own_value(value, glue)
    for target in statement.targets:
        if isinstance(target, ast.Name):
            if target.id in reserved or target.id.startswith("__") and target.id.endswith("__"):
                raise UnsafeSource(f"glue rebinds {target.id}")
            glue.locals.add(target.id)
            tainted.discard(target.id)
            fresh.discard(target.id)
            glue.outputs.discard(target.id)
            glue.frame_values.discard(target.id)
            glue.scalar_locals.discard(target.id)
            glue.contexts.discard(target.id)
            glue.containers.pop(target.id, None)
            glue.items_of.pop(target.id, None)
            glue.own_values.discard(target.id)
            if own_value:
                glue.own_values.add(target.id)
            if _frame_chain(value):
                glue.containers[target.id] = ast.unparse(value)
            if isinstance(value, ast.Subscript) and _literal(value.slice) and _frame_chain(value.value):
                glue.items_of[target.id] = ast.unparse(value.value)
            if scalar:
                glue.scalar_locals.add(target.id)
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and value.func.id in glue.context_classes:
                glue.contexts.add(target.id)
            if graph_call:
                glue.outputs.add(target.id)
            if reads_objects and _break_argument(value, glue):
                glue.frame_values.add(target.id)
            if reads_objects:
                tainted.add(target.id)
            if _builds_container(statement.value, glue.constants):
                fresh.add(target.id)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            if reads_objects and not (isinstance(target, ast.Subscript) and _own_data(target.value, fresh)) \
                    and not _refills_own_container(target, value, glue):
                if not _stores_own_attribute(target, value, glue):
                    raise UnsafeSource("glue stores an object read off L, G or F")
                glue.scalars = set()  # the object's own __setattr__ runs: compare nothing under L after it
            if isinstance(target, ast.Attribute) and target.attr.startswith("__"):
                raise UnsafeSource(f"glue stores attribute {target.attr!r}")
            _glue_value(target.value, glue)
            if isinstance(target, ast.Subscript):
                if isinstance(target.slice, ast.Slice):
                    for part in (target.slice.lower, target.slice.upper, target.slice.step):
                        if part is not None and not _literal(part):
                            raise UnsafeSource("glue stores into a slice with computed bounds")
                elif not _literal(target.slice):
                    raise UnsafeSource(f"glue stores under a computed key {_text(target.slice)}")
        else:
            raise UnsafeSource(f"glue assigns to a {type(target).__name__}")


def _stores_own_attribute(target: ast.AST, value: ast.AST, glue: _Glue) -> bool:
    """`L['ctx'].layers = L['layers']`: an attribute the frame's own code stores (one of its
    STORE_ATTR names, `glue.attributes`; that code's digest is in the entry's key), set on one of
    the frame's own objects (`_frame_own`: no attribute read, nothing under G) to the frame's own
    values (`_own_value`), as the program does when its code runs natively (an autograd Function's
    forward keeping its inputs on `ctx` for its backward, Reformer's reversible layers). What a
    forged glue could do with this is move the program's own objects between its own objects
    under names its code writes; it names no function Kiln did not write."""
    return isinstance(target, ast.Attribute) and target.attr in glue.attributes \
        and not target.attr.startswith("__") and _frame_own(target.value) and _own_value(value, glue)


def _own_value(node: ast.AST, glue: _Glue) -> bool:
    """A value of the frame's own locals (`_frame_own`), a glue local holding one, a value that
    reads no object off L, G or F (a graph output, a literal), or a tuple or list display of those."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(not isinstance(e, ast.Starred) and _own_value(e, glue) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in glue.own_values:
        return True
    return _frame_own(node) or not _reads_objects(node, glue.tainted, glue.graphs)


def _frame_chain(node: ast.AST) -> bool:
    """An attribute and literal-subscript chain rooted at L with at least one attribute: a
    container of the frame's own data (`L['cache'].states_cache`)."""
    attribute = False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not _literal(node.slice):
            return False
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("__"):
                return False
            attribute = True
        node = node.value
    return attribute and isinstance(node, ast.Name) and node.id == "L"


def _refills_own_container(target: ast.AST, value: ast.AST, glue: _Glue) -> bool:
    """`__c0[:] = [...]` on a list of the frame's own data (a replayed `cache.states.append(t)`)
    with items that are graph outputs, literals or items of that same container: nothing from
    elsewhere in the frame is moved into it."""
    if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
            and target.value.id in glue.containers
            and isinstance(target.slice, ast.Slice) and target.slice.lower is None and target.slice.upper is None
            and target.slice.step is None and isinstance(value, (ast.List, ast.Tuple))):
        return False
    container = glue.containers[target.value.id]
    for item in value.elts:
        own = isinstance(item, ast.Name) and glue.items_of.get(item.id) == container or (
            isinstance(item, ast.Subscript) and _literal(item.slice) and ast.unparse(item.value) == container)
        if not own and _reads_objects(item, glue.tainted, glue.graphs):
            return False
    return True


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
            and call.func.attr in CONTAINER_UPDATES and _own_data(call.func.value, fresh)):
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
