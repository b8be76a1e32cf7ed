"""The compile-hazard lint: find, in source code, what will make capture break the graph.

`lint_paths(paths)` parses each Python file (never imports or runs it) and walks every function with
a small "is this a tensor?" analysis (parameters, torch calls, tensor-only methods, what they flow
into). Findings name file:line, the hazard (print/logging, `.item()`/`float(t)`/`math.f(t)`, a branch
on a tensor, random/time/warnings, numpy on tensors, f-strings of tensors, unique and boolean masks,
calls to disabled functions or fake-less custom ops, untraceable libraries, locks, loops over a size)
and the rewrite from the hint table graph breaks use (kiln.capture.breaks.HINTS). Kiln's own addition.
"""
from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

# kind -> does capture break the graph there (False: an advisory, e.g. a loop unrolled per size)
KINDS = {"print": True, "logging": True, "item": True, "data_dependent_branch": True, "numpy": True,
         "unsupported_call": True, "format_tensor": True, "unsupported": True, "shape_loop": False,
         "guarded_branch": False, "data_dependent_shape": True, "disabled": True, "missing_fake_impl": True}
# calls that are True while a compiler traces: code behind them takes the traceable path
TRACING_CHECKS = ("is_tracing", "is_compiling", "is_torchdynamo", "is_scripting", "exporting")
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "warning_once",
               "info_once"}
# results that are Python values, not tensors (sizes, flags, metadata)
NON_TENSOR_METHODS = {"size", "dim", "numel", "nelement", "stride", "storage_offset", "element_size", "is_contiguous",
                      "is_floating_point", "is_complex", "data_ptr", "get_device", "type", "__len__", "ndimension",
                      "item", "tolist", "numpy", "keys", "items", "values", "get", "startswith", "format"}
NON_TENSOR_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "is_leaf", "layout", "training",
                    "is_sparse", "is_quantized", "is_meta", "config", "__class__", "__name__"}
TORCH_NON_TENSOR = {"is_tensor", "is_grad_enabled", "is_floating_point", "is_complex", "numel", "get_default_dtype",
                    "is_autocast_enabled", "is_inference_mode_enabled", "is_storage", "finfo", "iinfo", "Size",
                    "device", "dtype", "is_scripting", "is_compiling", "is_tracing", "is_available", "get_autocast_dtype",
                    "are_deterministic_algorithms_enabled", "manual_seed", "no_grad", "enable_grad"}
# methods only tensors have (among common Python types): their receiver and result are tensors
TENSOR_METHODS = {"sum", "any", "all", "mean", "norm", "abs", "prod", "std", "var", "isnan", "isinf", "eq", "ne",
                  "gt", "lt", "ge", "le", "argmax", "argmin", "amax", "amin", "softmax", "matmul", "masked_fill",
                  "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "float", "half", "to",
                  "contiguous", "clone", "detach", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "pow"}
_PYTHON_METHODS = {name for t in (str, bytes, list, tuple, dict, set, int, float, complex, object) for name in dir(t)}


@functools.lru_cache(maxsize=None)
def _tensor_only_methods() -> frozenset[str]:
    """Methods torch.Tensor has and no common Python type has: calling one says its receiver is a tensor."""
    import torch

    return frozenset(name for name in dir(torch.Tensor)
                     if not name.startswith("_") and name not in _PYTHON_METHODS and name not in NON_TENSOR_METHODS)


# unannotated parameters named like sizes, counts or indices are taken to be Python ints
SIZE_NAME = re.compile(r"^(n|i|j|k|dim|size|length|height|width|step|index|idx|num_\w+|\w+_(size|len|length|dim|"
                       r"count|idx|index|num))$")
NUMPY_SCALAR_TYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool_"}
UNTRACEABLE_MODULES = {"scipy", "pandas", "sklearn", "PIL", "cv2", "matplotlib", "requests", "subprocess", "pickle",
                       "json", "socket", "sqlite3"}
NON_TENSOR_BUILTINS = {"len", "isinstance", "hasattr", "getattr", "type", "range", "id", "callable", "issubclass",
                       "str", "repr", "enumerate", "zip", "tuple", "list", "dict", "set", "sorted", "reversed"}
NON_TENSOR_ANNOTATIONS = {"int", "float", "str", "bool", "None", "dict", "list", "tuple", "Optional[int]",
                          "Optional[float]", "Optional[bool]", "Optional[str]"}


@dataclass(frozen=True)
class Finding:
    """One hazard: where it is, what it is, and the compile-friendly rewrite."""

    filename: str
    lineno: int
    end_lineno: int
    kind: str
    message: str
    hint: str
    function: str

    @property
    def breaks(self) -> bool:
        """Whether capture breaks the graph here (else the finding is advice: recompiles, unrolling)."""
        return KINDS[self.kind]

    def covers(self, filename: str, lineno: int) -> bool:
        return os.path.abspath(filename) == os.path.abspath(self.filename) and self.lineno <= lineno <= self.end_lineno

    def __str__(self) -> str:
        tag = "graph break" if self.breaks else "advice"
        return f"{self.filename}:{self.lineno}: {self.message} ({tag}: {self.kind}) in {self.function}\n    hint: {self.hint}"


def hint(kind: str) -> str:
    """The rewrite graph breaks of this kind suggest (kiln.capture.breaks' table), or lint's own."""
    if kind == "guarded_branch":
        return hint("data_dependent_branch")
    if kind == "shape_loop":
        return ("a Python loop over a size is unrolled into the graph and the graph is recompiled for every "
                "size: use a tensor op over the whole dimension, or kiln.mark_dynamic(x, dim)")
    from kiln.capture.breaks import HINTS
    from kiln.errors import Unsupported

    entry = HINTS.get(kind)
    text = entry(Unsupported("lint", kind=kind)) if entry is not None else None
    return text or "move this out of the compiled function"


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for a chain of attributes over a name, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


class _Imports(ast.NodeVisitor):
    """Which local names stand for torch, numpy, random, time, logging and untraceable libraries."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}  # local name -> top-level module

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        top = (node.module or "").split(".")[0]
        for alias in node.names:
            # `import torch.nn.functional as F`, `from torch import nn`: their names act as torch
            self.modules[alias.asname or alias.name] = top if top in ("torch", "numpy", "random", "time", "logging") \
                or top in UNTRACEABLE_MODULES else f"{top}.{alias.name}"


class _FunctionLint:
    """The tensor analysis and hazard checks of one function body (nested functions are their own)."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, modules: dict[str, str],
                 filename: str, facts: "_ModuleFacts") -> None:
        self.fn, self.qualname, self.modules, self.filename = fn, qualname, modules, filename
        self.facts = facts
        self.tensor_methods = facts.tensor_methods
        # "strong": certainly a tensor (torch results, tensor methods); "weak" also holds what may be
        # one (unannotated parameters, helpers called on tensors). Branch checks trust only strong.
        self.tensors: set[str] = set()
        self.strong: set[str] = set()
        self.findings: list[Finding] = []
        self._seen: set[tuple[int, str]] = set()
        args = fn.args
        params = args.posonlyargs + args.args + args.kwonlyargs
        defaults = [None] * (len(args.posonlyargs + args.args) - len(args.defaults)) + list(args.defaults) + list(
            args.kw_defaults)
        for param, default in zip(params, defaults):
            if param.arg in ("self", "cls"):
                continue
            note = ast.unparse(param.annotation) if param.annotation is not None else ""
            literal = isinstance(default, ast.Constant)
            if note.replace(" ", "") in NON_TENSOR_ANNOTATIONS or (not note and (literal or SIZE_NAME.match(param.arg))):
                continue
            if note and "Tensor" not in note and note not in ("Any",):
                continue  # a config object, a module, a callable ...
            self.tensors.add(param.arg)
            self.strong.add(param.arg)
        for star in (args.vararg, args.kwarg):
            if star is not None:
                self.tensors.add(star.arg)

    def module_of(self, node: ast.AST) -> str:
        name = _dotted(node).split(".")[0]
        return self.modules.get(name, "")

    def report(self, node: ast.AST, kind: str, message: str) -> None:
        lineno: int = getattr(node, "lineno", 0)
        key = (lineno, kind)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(Finding(self.filename, lineno, getattr(node, "end_lineno", None) or lineno,
                                     kind, message, hint(kind), self.qualname))

    # -- is it a tensor? -------------------------------------------------------------------------

    def is_tensor(self, node: ast.AST | None, strong: bool = False) -> bool:
        """Whether `node` is (strong: certainly; else: perhaps) a tensor."""
        if node is None:
            return False
        if isinstance(node, ast.Name):
            return node.id in (self.strong if strong else self.tensors)
        if isinstance(node, ast.Attribute):
            if node.attr in NON_TENSOR_ATTRS:
                return False
            return node.attr in ("T", "mT", "H", "grad", "data", "real", "imag") and self.is_tensor(node.value, strong)
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value, strong)
        if isinstance(node, ast.BinOp):
            return self.is_tensor(node.left, strong) or self.is_tensor(node.right, strong)
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self.is_tensor(node.operand, strong)
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return False
            if any(isinstance(c, ast.Constant) and not isinstance(c.value, (int, float)) or isinstance(c.value, bool)
                   for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)):
                return False  # compared with a string, None or a bool: not a tensor comparison
            return self.is_tensor(node.left, strong) or any(self.is_tensor(c, strong) for c in node.comparators)
        if isinstance(node, ast.IfExp):
            return self.is_tensor(node.body, strong) or self.is_tensor(node.orelse, strong)
        if isinstance(node, ast.Call):
            return self._call_is_tensor(node, strong)
        return False

    def _call_is_tensor(self, node: ast.Call, strong: bool) -> bool:
        func = node.func
        if isinstance(func, ast.Name) and func.id in NON_TENSOR_BUILTINS | {"int", "float", "bool", "print"}:
            return False
        if isinstance(func, ast.Attribute):
            if func.attr in NON_TENSOR_METHODS:
                return False
            module = self.module_of(func)
            if module == "torch":
                return func.attr not in TORCH_NON_TENSOR
            if module:
                return False
            if self.is_tensor(func.value, strong):  # a tensor method: x.sum(), x.view(...)
                return True
            if (func.attr in TENSOR_METHODS or func.attr in self.tensor_methods) and self.is_tensor(func.value):
                return True  # a tensor-only method on what may be a tensor: it is one
        if strong:
            return False
        args = list(node.args) + [k.value for k in node.keywords]
        # a module or helper called on tensors (self.fc(x), act(h)) may return one
        return any(self.is_tensor(a) for a in args)

    # -- walking the body ------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        for stmt in self.fn.body:
            self.statement(stmt)
        return self.findings

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # linted on their own
        if isinstance(stmt, (ast.If, ast.While)):
            self.expressions(stmt.test)
            keyword = "if" if isinstance(stmt, ast.If) else "while"
            if self._checks_tracing(stmt.test):
                pass  # `if not is_tracing(x) and x.all()`: under capture the check short-circuits
            elif self.is_tensor(stmt.test, True):
                self.report(stmt.test, "data_dependent_branch", f"Python `{keyword}` on a tensor value")
            elif self._bool_of_tensor(stmt.test):
                first = stmt.test.values[0] if isinstance(stmt.test, ast.BoolOp) else None
                if first is not None and not self.is_tensor(first, True) and not self._bool_of_tensor(first):
                    # `a.dtype == float16 and x.isfinite().all()`: a break only when the static part holds
                    self.report(stmt.test, "guarded_branch", f"Python `{keyword}` on a tensor value when "
                                                             f"`{ast.unparse(first)}` holds")
                else:
                    self.report(stmt.test, "data_dependent_branch", f"Python `{keyword}` on a tensor value")
        elif isinstance(stmt, ast.Assert):
            self.expressions(stmt.test)
            if self.is_tensor(stmt.test, True):
                self.report(stmt, "data_dependent_branch", "assert on a tensor value")
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.expressions(stmt.iter)
            if self._size_range(stmt.iter):
                self.report(stmt.iter, "shape_loop", "Python loop over a tensor's size")
            self.assign(stmt.target, self.is_tensor(stmt.iter) or self._iterates_tensors(stmt.iter),
                        self.is_tensor(stmt.iter, True))
        elif isinstance(stmt, ast.Assign):
            self.expressions(stmt.value)
            for target in stmt.targets:
                self.assign(target, self.is_tensor(stmt.value) or self._iterates_tensors(stmt.value),
                            self.is_tensor(stmt.value, True))
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
            if stmt.value is not None:
                self.expressions(stmt.value)
                augmented = isinstance(stmt, ast.AugAssign)
                tensor = self.is_tensor(stmt.value) or (augmented and self.is_tensor(stmt.target))
                strong = self.is_tensor(stmt.value, True) or (augmented and self.is_tensor(stmt.target, True))
                self.assign(stmt.target, tensor, strong)
        else:
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self.expressions(child)
        for field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(stmt, field, []) or []:
                if isinstance(child, ast.ExceptHandler):
                    for inner in child.body:
                        self.statement(inner)
                else:
                    self.statement(child)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self.expressions(item.context_expr)
                if "lock" in _dotted(item.context_expr).lower().split(".")[-1] or \
                        _dotted(getattr(item.context_expr, "func", None) or ast.Pass()).endswith("Lock"):
                    self.report(item.context_expr, "unsupported", "`with` on a lock (only grad-mode managers "
                                                                  "and Python classes are traced)")

    def assign(self, target: ast.AST, tensor: bool, strong: bool = False) -> None:
        if isinstance(target, ast.Name):
            (self.tensors.add if tensor else self.tensors.discard)(target.id)
            (self.strong.add if tensor and strong else self.strong.discard)(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.assign(element, tensor, strong)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, tensor, strong)

    def _iterates_tensors(self, node: ast.AST) -> bool:
        """A list or tuple display holding tensors (`a, b = x.chunk(2)` is a call, caught already)."""
        return isinstance(node, (ast.Tuple, ast.List)) and any(self.is_tensor(e) for e in node.elts)

    def _checks_tracing(self, test: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and any(t in _dotted(n.func).split(".")[-1] for t in TRACING_CHECKS)
                   for n in ast.walk(test))

    def _bool_of_tensor(self, test: ast.AST) -> bool:
        if isinstance(test, ast.BoolOp):
            return any(self.is_tensor(v, True) or self._bool_of_tensor(v) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_tensor(test.operand, True)
        return False

    def _size_range(self, node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"):
            return False
        for arg in node.args:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Attribute) and sub.attr == "shape" and self.is_tensor(sub.value):
                    return True
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "size" \
                        and self.is_tensor(sub.func.value):
                    return True
        return False

    def expressions(self, root: ast.AST) -> None:
        """Hazards inside one expression (calls, f-strings), innermost last; lambdas are skipped."""
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, ast.Subscript) and self.is_tensor(node.value, True) and isinstance(node.slice, ast.Compare) \
                    and self.is_tensor(node.slice, True):
                self.report(node, "data_dependent_shape", "indexing with a boolean mask: its size depends on the data")
            elif isinstance(node, ast.JoinedStr):
                if any(isinstance(v, ast.FormattedValue) and self.is_tensor(v.value, True) for v in node.values):
                    self.report(node, "format_tensor", "f-string of a tensor")

    def call(self, node: ast.Call) -> None:
        func = node.func
        args = list(node.args) + [k.value for k in node.keywords]
        name = _dotted(func)
        module = self.module_of(func)
        if isinstance(func, ast.Name) and func.id == "print" or name in ("sys.stdout.write", "sys.stderr.write"):
            self.report(node, "print", "print() inside compiled code")
        elif isinstance(func, ast.Name) and func.id in ("int", "float", "bool") and args and self.is_tensor(args[0], True):
            self.report(node, "item", f"{func.id}() of a tensor reads its data")
        elif isinstance(func, ast.Attribute) and func.attr in ("item", "tolist", "numpy") and not node.args:
            self.report(node, "item", f".{func.attr}() turns a tensor into Python values")
        elif module == "logging" or (isinstance(func, ast.Attribute) and func.attr in LOG_METHODS
                                     and "log" in _dotted(func.value).lower()):
            self.report(node, "logging", f"logging call {name or getattr(func, 'attr', '')}()")
        elif module in ("random", "time") or name == "warnings.warn":
            self.report(node, "unsupported_call", f"{name}() runs outside the graph")
        elif module == "math" and any(self.is_tensor(a, True) for a in args):
            self.report(node, "item", f"{name}() of a tensor reads its data")
        elif (name in ("torch.unique", "torch.unique_consecutive") or (isinstance(func, ast.Attribute) and func.attr
              in ("unique", "unique_consecutive") and self.is_tensor(func.value, True))):
            self.report(node, "data_dependent_shape", f"{name or getattr(func, 'attr', '')}(): its size depends on the data")
        elif isinstance(func, ast.Name) and func.id in self.facts.disabled_names:
            self.report(node, "disabled", f"{func.id}() is marked disable and runs outside the graph")
        elif isinstance(func, ast.Name) and func.id in self.facts.custom_ops_without_fake:
            self.report(node, "missing_fake_impl", f"custom op {func.id}() has no fake implementation")
        elif module == "numpy":
            attr = func.attr if isinstance(func, ast.Attribute) else ""
            if any(self.is_tensor(a) for a in args) or attr in NUMPY_SCALAR_TYPES:
                self.report(node, "numpy", f"numpy call {name}() on traced values")
        elif module.split(".")[0] in UNTRACEABLE_MODULES:
            self.report(node, "unsupported_call", f"{name or module}() is a library capture cannot trace")


class _ModuleFacts:
    """What one file says about its functions: which are marked disable (never traced; calls to them
    break), which custom ops have no fake implementation registered in the file."""

    def __init__(self, tree: ast.AST) -> None:
        self.tensor_methods = _tensor_only_methods()
        self.disabled_functions: set[str] = set()  # bodies capture never traces
        self.disabled_names: set[str] = set()  # names bound to a disabled callable
        custom_ops: set[str] = set()
        faked: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for deco in node.decorator_list:
                    target = _dotted(deco.func if isinstance(deco, ast.Call) else deco)
                    if target.split(".")[-1] == "disable":
                        self.disabled_functions.add(node.name)
                        self.disabled_names.add(node.name)
                    elif target.endswith("custom_op"):
                        custom_ops.add(node.name)
                    elif target.endswith(".register_fake"):
                        faked.add(target.split(".")[0])
            elif isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "disable":
                self.disabled_functions.update(a.id for a in node.args if isinstance(a, ast.Name))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    _dotted(node.value.func).split(".")[-1] == "disable":
                self.disabled_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Attribute) and node.attr == "register_fake":
                faked.add(_dotted(node.value))
        self.custom_ops_without_fake = custom_ops - faked


def lint_source(source: str, filename: str = "<string>") -> list[Finding]:
    """Every finding in one file's source, in line order (functions marked disable are skipped:
    capture never traces them)."""
    tree = ast.parse(source, filename)
    imports = _Imports()
    imports.visit(tree)
    facts = _ModuleFacts(tree)
    findings: list[Finding] = []
    for fn, qualname in _functions(tree):
        if fn.name in facts.disabled_functions:
            continue
        findings += _FunctionLint(fn, qualname, imports.modules, filename, facts).run()
    return sorted(findings, key=lambda f: (f.lineno, f.kind))


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.expr):
            yield from _functions(node, prefix)


def python_files(paths: Iterable[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.exists(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"kiln lint: no such file or folder: {path}")
    return files


def lint_paths(paths: Iterable[str]) -> list[Finding]:
    """Findings of every .py file under the given files and folders (a file that does not parse is
    reported as an error, not skipped)."""
    findings: list[Finding] = []
    for path in python_files(paths):
        with open(path, encoding="utf-8") as f:
            findings += lint_source(f.read(), path)
    return findings
