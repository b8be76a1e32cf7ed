"""A lowered graph's wrapper as a runtime artifact: made from its recipe without kiln.lower.

kiln.lower's wrapper codegen writes a Python function `call(arg0, ...)` that allocates buffers
and calls C++ kernels (through ctypes) and ATen externs; it tags that function with a
`WrapperRecipe` (see `wrapper_recipe`): the source, its globals by name (dtypes, devices, ATen
overloads), each kernel's ctypes argument kinds, and the kernel library's identity (path relative
to the cache root, size, SHA-256). The loader of kind "wrapper" rebuilds the function in another
process: the library is loaded only when its bytes are the recorded ones, and the source is
executed only when it is made of what the codegen writes (a function of its arguments that calls
its own kernels, externs and a short list of tensor methods: `check_wrapper_source`), so a cache
file cannot smuggle in other calls. Corresponds to the Python wrapper half of torch's
CompiledFxGraph.
"""
from __future__ import annotations

import ast
import ctypes
import functools
import gc
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from kiln import config, log
from kiln.errors import ExternMismatchError
from kiln.runtime import build
from kiln.runtime.artifact import RECIPE_ATTR, Recipe, loader
from kiln.runtime.overlap import strided_copy
from kiln.runtime.records import record_type


def relayout(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """`t` with the strides the kernels were compiled for (the wrapper's `_relayout`, called when
    t.stride() differs): t itself where only the strides of size-1 dims differ, as no index moves
    along them; else a copy, also into strides whose elements share memory (an expanded saved
    activation, kiln.runtime.overlap)."""
    for size, have, want in zip(t.shape, t.stride(), strides):
        if size != 1 and have != want:
            return strided_copy(t, strides)
    return t


def checked_result(t: torch.Tensor, dtype: torch.dtype, sizes: tuple[int, ...] | None, strides: tuple[int, ...],
                   op: str, clean: bool) -> torch.Tensor:
    """An extern's result `t` after the wrapper's one-line test found it differs from its fake
    tensor (the wrapper's `_checked_result`): ExternMismatchError where its dtype or sizes differ
    (the kernels after it would read its memory as something else), else `t` re-laid out to
    `strides`. `sizes` None: the op may return fewer elements than its meta says (not compared)."""
    if t.dtype is not dtype or (sizes is not None and tuple(t.shape) != tuple(sizes)):
        raise ExternMismatchError(
            f"kiln internal error: the extern {op} returned a {t.dtype} tensor of sizes {tuple(t.shape)} where "
            f"its fake tensor at capture was {dtype} of sizes {sizes}: a fake (meta) implementation disagrees "
            f"with the real kernel (for a custom op, check its register_fake)", clean)
    return relayout(t, strides) if t.dim() else t


@record_type
@dataclass(frozen=True)
class WrapperRecipe:
    """Everything needed to rebuild a lowered graph's wrapper function without kiln.lower.

    `constants`: global name -> a dtype, device, layout, memory format or ATen overload (stored by
    name); `kernels`: kernel name -> its ctypes argument kinds ("p" pointer, "i" int64, "d" double);
    `library`: (path relative to the cache root, size, SHA-256) of the kernels' shared object,
    None when there are no kernels."""

    source: str
    constants: dict[str, Any]
    kernels: dict[str, str]
    library: tuple[str, int, str] | None
    output_spec: str | None

    def artifact_recipe(self) -> Recipe:
        return Recipe("wrapper", {"wrapper": self})


_PORTABLE_CONSTANTS = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch._ops.OpOverload,
                       torch.Tensor)  # small constant tensors travel as data (kiln.runtime.records)
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "d": ctypes.c_double}  # d: a float argument
# math: math.sqrt of a size (kiln.symbolic.render spells a float sqrt so: `** 0.5` rounds otherwise)
_FIXED_GLOBALS = {"torch": torch, "math": math, "_relayout": relayout, "_checked_result": checked_result}


def wrapper_recipe(source: str, env: dict[str, Any], argtypes: dict[str, list[Any]],
                   library: ctypes.CDLL | None, output_spec: str | None) -> WrapperRecipe | None:
    """The recipe of a wrapper made from `source` and its globals `env`; None when a global (a
    constant tensor, say) cannot be named in another process, the library is not in the cache,
    or the source is not one `check_wrapper_source` admits (logged under KILN_LOGS=cache)."""
    constants = {}
    for name, value in env.items():
        if name in _FIXED_GLOBALS:
            continue
        if not isinstance(value, _PORTABLE_CONSTANTS):
            return None
        constants[name] = value
    kinds = {ctypes.c_void_p: "p", ctypes.c_int64: "i", ctypes.c_double: "d"}
    kernels = {name: "".join(kinds[t] for t in types) for name, types in argtypes.items()}
    lib = build.stored_identity(library) if kernels else None
    if kernels and lib is None:
        return None
    try:
        check_wrapper_source(source, set(constants) | set(kernels) | (THREAD_GLOBALS if kernels else set()))
    except ValueError as exc:
        log.artifact("cache", f"wrapper not persistable: {exc}")
        return None
    return WrapperRecipe(source, constants, kernels, lib, output_spec)


_aten = torch.ops.aten
# Externs the lowering emits by design, each with torch's generated Python binding that selects that
# very overload for the arguments a wrapper passes (tensors and the schema's positional scalars by
# position, keyword-only scalars and out= by keyword; tests/runtime/test_extern_bindings.py records
# the overload each one dispatches to). The binding parses its arguments in code written for the
# op, while OpOverload._op (pybind11) parses them against the schema on every call: at 1 thread,
# mm.out on [16, 32] @ [32, 32] 9.4 -> 2.1 us, addmm.out 17.0 -> 13.9 us, CPU flash attention on
# [2, 4, 8, 8] 62 -> 46 us, per extern per call of the Python wrapper (a small decoder's 15 mm).
EXTERN_BINDINGS: dict[Any, Callable[..., Any]] = {
    _aten.mm.default: torch.mm, _aten.mm.out: torch.mm,
    _aten.addmm.default: torch.addmm, _aten.addmm.out: torch.addmm,
    _aten.bmm.default: torch.bmm, _aten.bmm.out: torch.bmm,
    _aten.baddbmm.default: torch.baddbmm, _aten.baddbmm.out: torch.baddbmm,
    _aten._scaled_dot_product_flash_attention_for_cpu.default: torch._scaled_dot_product_flash_attention_for_cpu,
    _aten.convolution.default: torch.convolution,
}


def bind_overloads(env: dict[str, Any]) -> None:
    """Replace each ATen overload among a wrapper's globals by the fastest callable that runs it:
    its Python binding (EXTERN_BINDINGS), else the C++ callable it forwards to (OpOverload.__call__
    is one Python frame that only calls `_op`), paid per extern per call. The recipe keeps the
    overload itself, which is stored by name."""
    for name, value in env.items():
        if isinstance(value, torch._ops.OpOverload):
            env[name] = EXTERN_BINDINGS.get(value) or getattr(value, "_op", value)


# ---------------------------------------------------------------------------------------------------
# Threads: kernels run on torch.get_num_threads() threads


# The globals a wrapper with kernels reads in its first line,
#     if _torch_threads() != _threads_applied[0]: _follow_threads()
# so a torch.set_num_threads between calls reaches the kernels; the check costs one builtin call and
# an int compare per graph call, the ctypes call happens only when the count changed.
THREAD_GLOBALS = frozenset({"_torch_threads", "_threads_applied", "_follow_threads"})


class LibraryThreads:
    """A kernel library's thread count (its `kiln_set_num_threads`, see codegen/cpp.py's prelude),
    kept equal to torch.get_num_threads(); `applied` holds the count it was last given."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        setter = getattr(lib, "kiln_set_num_threads", None)
        if setter is None:  # built from an older prelude: the caller compiles again
            raise build.LibraryError("the kernel library has no kiln_set_num_threads")
        setter.argtypes = [ctypes.c_int, ctypes.c_int]
        setter.restype = None
        self._set = setter
        self.applied = [0]
        self.follow()

    def follow(self) -> None:
        """Give the library torch's thread count and kiln.config.adaptive_threads now."""
        threads = torch.get_num_threads()
        self._set(threads, 1 if config.adaptive_threads else 0)
        self.applied[0] = threads


_library_threads: dict[int, LibraryThreads] = {}  # id(CDLL) -> its state; build keeps libraries alive


def bind_threads(env: dict[str, Any], lib: ctypes.CDLL) -> None:
    """Put THREAD_GLOBALS for `lib` into a wrapper's globals, handing the library torch's thread
    count (and the adaptive setting) now. Wrappers sharing a library share its state."""
    state = _library_threads.get(id(lib))
    if state is None:
        state = _library_threads[id(lib)] = LibraryThreads(lib)
    else:
        state.follow()  # a new compile reads kiln.config.adaptive_threads again
    env["_torch_threads"] = torch.get_num_threads
    env["_threads_applied"] = state.applied
    env["_follow_threads"] = state.follow


# ---------------------------------------------------------------------------------------------------
# What a wrapper's source may contain


_METHODS = frozenset({"size", "stride", "data_ptr", "as_strided", "storage_offset", "t", "permute", "view",
                      "expand", "item", "numel", "element_size"})
_TORCH_FUNCTIONS = frozenset({"empty_strided", "randint"})
_DATA_ATTRIBUTES = frozenset({"dtype", "shape"})  # read, never called: an extern result's check (checked_result)
_BUILTINS = frozenset({"int", "float", "max", "min", "round"})
# the exception a wrapper raises itself: a zero divisor of Python numbers, with Python's text
# (kiln/lower/codegen/wrapper.py), called with constants only
_RAISED = frozenset({"ZeroDivisionError"})
_NODES = (ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.If, ast.Expr, ast.Delete,
          ast.Return, ast.Raise, ast.Name, ast.Load, ast.Store, ast.Del, ast.Constant, ast.Attribute, ast.Call,
          ast.keyword, ast.Subscript, ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.Compare,
          ast.operator, ast.unaryop, ast.cmpop, ast.BoolOp, ast.boolop)


def check_wrapper_source(source: str, globals_: set[str]) -> ast.Module:
    """Raise ValueError unless `source` is one function `call` built only from its arguments (or
    one list `args` it unpacks and may empty with `args.clear()`), its locals, the globals named in `globals_` (kernels, externs, constants), `torch.empty_strided`,
    `torch.randint`, `_relayout`, int/max/min and the tensor methods the codegen uses. Returns the
    parsed module (what the loader compiles: the source is parsed once)."""
    # A parse makes thousands of AST objects; in a process holding torch each collection they
    # trigger walks the whole heap, every object torch holds, and they make no cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(source, globals_)
    finally:
        if enabled:
            gc.enable()


def _check(source: str, globals_: set[str]) -> ast.Module:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"wrapper source does not parse: {exc}") from exc
    if not tree.body:
        raise ValueError("wrapper source does not end with a function named call")
    *preamble, fn = tree.body
    if not isinstance(fn, ast.FunctionDef) or fn.name != "call":
        raise ValueError("wrapper source does not end with a function named call")
    checked = _check_error_preamble(preamble)
    if fn.decorator_list or fn.args.defaults or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        raise ValueError("wrapper function has decorators, defaults or starred arguments")
    params = [a.arg for a in fn.args.args]
    takes_list = params == ["args"]
    known = set(params) | globals_ | set(_FIXED_GLOBALS) | _BUILTINS | _RAISED | checked
    nodes = _all_nodes(fn)
    known |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    callables = globals_ | _BUILTINS | {"_relayout", "_checked_result"} | checked
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        if not isinstance(node, _NODES):
            raise ValueError(f"wrapper source holds a {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in known:
            raise ValueError(f"wrapper source reads an unknown name {node.id!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
            raise ValueError("wrapper source holds a constant of another type")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise ValueError(f"wrapper source reads a private attribute {node.attr!r}")
            if isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr not in _TORCH_FUNCTIONS:
                raise ValueError(f"wrapper source uses torch.{node.attr}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                ok = func.id in callables or (func.id in _RAISED and not node.keywords
                                              and all(isinstance(a, ast.Constant) for a in node.args))
            elif isinstance(func, ast.Attribute):
                ok = func.attr in _METHODS or (isinstance(func.value, ast.Name) and func.value.id == "torch")
                ok = ok or (func.attr in ("sqrt", "log2") and isinstance(func.value, ast.Name)
                            and func.value.id == "math")  # a float expression of sizes (symbolic/render.py)
                # the argument list, emptied once unpacked (see `positional`), and nothing else
                ok = ok or (takes_list and func.attr == "clear" and isinstance(func.value, ast.Name)
                            and func.value.id == "args" and not node.args and not node.keywords)
            else:
                ok = False
            if not ok:
                raise ValueError(f"wrapper source makes a call it may not make: {ast.unparse(func)}")
        if isinstance(node, ast.Attribute) and id(node) not in called and node.attr not in _DATA_ATTRIBUTES:
            raise ValueError(f"wrapper source reads an attribute {node.attr!r} it does not call")
    return tree


# The preamble of a wrapper whose kernels check indices and divisors (kiln/lower/checks.py): a
# ctypes record the kernels fill, and a function of builtins only that turns it into the exception
# eager raises. Admitted in exactly that shape.
_ERROR_IMPORT = "import ctypes as _ctypes"
_ERROR_RECORD_TYPE = re.compile(r"_ErrorRecord = _ctypes\.c_int64 \* \d+")
_ERROR_NAMES = frozenset({"err", "site", "value", "size", "RuntimeError", "IndexError", "ValueError",
                          "ZeroDivisionError"})
def _all_nodes(root: ast.AST) -> list[ast.AST]:
    """Every node under `root` (itself included), collected once: a large graph's wrapper has tens
    of thousands, and ast.walk's generators cost a warm start more than the checks on them."""
    found = [root]
    for node in found:  # the list grows as it is read: breadth first, as ast.walk
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                found.append(value)
            elif isinstance(value, list):
                found.extend(v for v in value if isinstance(v, ast.AST))
    return found


_ERROR_NODES = (ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.If, ast.Return, ast.Name, ast.Load,
                ast.Store, ast.Constant, ast.Subscript, ast.Tuple, ast.Compare, ast.Eq, ast.Call, ast.JoinedStr,
                ast.FormattedValue)


def _check_error_preamble(statements: list[ast.stmt]) -> set[str]:
    """The names the preamble defines (none without one); ValueError for anything else."""
    if not statements:
        return set()
    if len(statements) != 3 or ast.unparse(statements[0]) != _ERROR_IMPORT \
            or not _ERROR_RECORD_TYPE.fullmatch(ast.unparse(statements[1])):
        raise ValueError("wrapper source has statements before call that are not the error record's")
    fn = statements[2]
    if not isinstance(fn, ast.FunctionDef) or fn.name != "_kernel_error" or fn.decorator_list \
            or [a.arg for a in fn.args.args] != ["err"]:
        raise ValueError("wrapper source defines another function than _kernel_error")
    for node in ast.walk(fn):
        if not isinstance(node, _ERROR_NODES):
            raise ValueError(f"_kernel_error holds a {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in _ERROR_NAMES:
            raise ValueError(f"_kernel_error reads {node.id!r}")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id.endswith("Error")):
            raise ValueError("_kernel_error calls something other than an exception class")
    return {"_ErrorRecord", "_kernel_error"}


# ---------------------------------------------------------------------------------------------------
# Loading


def load_wrapper(recipe: WrapperRecipe) -> Callable[..., Any]:
    """The wrapper function of a recipe, bound to its kernels (build.LibraryError when the library
    is gone or not the recorded one, ValueError when the source is not a wrapper's)."""
    threads = THREAD_GLOBALS if recipe.kernels else set()
    tree = check_wrapper_source(recipe.source, set(recipe.constants) | set(recipe.kernels) | threads)
    for name, value in recipe.constants.items():  # a reader may name any trusted function: admit data only
        if not isinstance(value, _PORTABLE_CONSTANTS):
            raise ValueError(f"wrapper constant {name} is a {type(value).__name__}")
    env: dict[str, Any] = {**_FIXED_GLOBALS, **recipe.constants}
    bind_overloads(env)
    if recipe.kernels:
        if recipe.library is None:
            raise ValueError("a wrapper with kernels but no library")
        relative, size, sha256 = recipe.library
        lib = build.load_stored(relative, size, sha256, symbols=tuple(recipe.kernels))
        for name, kinds in recipe.kernels.items():
            fn = getattr(lib, name)
            fn.argtypes = [_CTYPES[k] for k in kinds]
            fn.restype = None
            env[name] = fn
        bind_threads(env, lib)
    exec(compile(tree, "<kiln wrapper>", "exec"), env)
    fn = tree.body[-1]
    assert isinstance(fn, ast.FunctionDef)
    takes_list = [a.arg for a in fn.args.args] == ["args"]  # a recipe stored before the list convention: positional
    return with_output_spec(positional(env["call"]) if takes_list else env["call"], recipe.output_spec)


def positional(takes_list: Callable[[list], Any]) -> Callable[..., Any]:
    """The usual `call(*args)` in front of a generated wrapper that takes one list and empties it;
    `call.steal(args)` calls the wrapper with the caller's list itself, so that the wrapper holds
    the only references and frees each argument after its last use (what the compiled backward
    does with the saved activations, as Inductor's wrapper does with `args.clear()`)."""
    def call(*args: Any) -> Any:
        return takes_list(list(args))

    call.steal = takes_list  # type: ignore[attr-defined]
    return call


def with_output_spec(call: Callable[..., Any], output_spec: str | None) -> Callable[..., Any]:
    """`call` returning its flat tuple rebuilt into `output_spec`'s structure (itself when None)."""
    if output_spec is None:
        return call
    spec = pytree.treespec_loads(output_spec)

    @functools.wraps(call)
    def nested(*args: Any) -> Any:
        return pytree.tree_unflatten(list(call(*args)), spec)
    nested.__dict__.pop("steal", None)  # wraps copied it, and it returns the flat tuple
    return nested


def tag(call: Callable[..., Any], recipe: WrapperRecipe | None) -> None:
    """Make the wrapper function `call` follow the artifact protocol with `recipe`."""
    if recipe is not None:
        setattr(call, RECIPE_ATTR, recipe.artifact_recipe)


@loader("wrapper")
def _load(fields: dict[str, Any]) -> Callable[..., Any]:
    recipe = fields.get("wrapper")
    if not isinstance(recipe, WrapperRecipe):
        raise ValueError("a wrapper recipe without its WrapperRecipe")
    return load_wrapper(recipe)
