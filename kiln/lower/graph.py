"""The `lower_to_loop_ir` pass: walk an ATen FX graph and build the LoopIR with the lowering table.

Inputs become InputBuffers (their sizes' symbols are recorded so the wrapper can read them from the
real tensors), each node goes through its rule (or falls back to an ATen call), and a lazy value is
realized into a buffer when it is used more than once and costly to recompute, or is an output.
Corresponds to torch/_inductor/graph.py (GraphLowering), without the ambient V.graph.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence

import sympy
import torch
import torch._dispatch.python
import torch.fx
from torch.utils import _pytree as pytree

from kiln import config
from kiln.lower import ops
from kiln.lower.checks import zero_division_kind
from kiln.lower.coverage import CheckTracker, add_check_passes
from kiln.lower.eager_dtypes import EAGER_REFUSES
from kiln.lower.ir import (BufferRef, ConstantBuffer, FloorDiv, InputBuffer, Layout, Load, LoopIR, SymExpr, Value,
                           contiguous_strides, index_vars, walk)
from kiln.lower.lowerings import (LOWERINGS, SUPPORTED_DTYPES, LoweringContext, TensorValue, compute_dtype,
                                  dense_layout, stride_hint, stride_order_layout, strided_value, to_expr,
                                  value_cost)
from kiln.lower.lowerings.convolution import channels_last_strides, reads_channels_last
from kiln.lower.lowerings.reductions import ROUNDED_OUTPUTS, rounded_on_read
from kiln.lower.lowerings.extern import EXTERN_BY_DESIGN, fallback, is_random, vector_bmm
from kiln.lower.schedule import MIN_STORAGE_INNER
from kiln.symbolic.expr import (BitwiseAnd, BitwiseOr, BitwiseXor, LShift, RShift, float_symbol, is_truth_value, negate,
                               relation)
from kiln.symbolic.floats import (FloatAdd, FloatFloorDiv, FloatLog2, FloatMod, FloatMul, FloatPow, FloatSqrt,
                                  FloatTrueDiv, RoundHalfEven, TruncToInt, float_floor, is_float_valued, to_float)
from kiln.symbolic.node import sym_floordiv, sym_log2

aten = torch.ops.aten

RECOMPUTE_LIMIT = 12  # a value used twice is recomputed when its body costs at most this
BODY_LIMIT = 160  # past this a body is stored even when used once, so bodies stay readable
REUSE_READS = 4  # a value used twice is stored when its body reads more than this many places
# ops whose kernel reads an input in several passes over each row (a layer norm's mean, variance and
# normalization): a value used by one of them and by another node is stored when it reads two places
# or more, else each pass and each other user recomputes it (a residual stream x + f(x) + g(...)
# read by every block's LayerNorm was recomputed whole, its transposed reads included, by each pass
# of each LayerNorm of an MLP-Mixer: 6 adds and 3 stride-64 loads per element per pass)
MULTI_PASS = frozenset({aten.native_layer_norm.default, aten._softmax.default, aten._log_softmax.default,
                        aten.var_mean.correction, aten.var.correction, aten.std.correction,
                        aten.native_group_norm.default, aten.native_layer_norm_backward.default,
                        aten._softmax_backward_data.default, aten._log_softmax_backward_data.default})


def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def node_metas(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[torch.fx.Node, Any]:
    """Each node's example value: node.meta['val'] where the tracer left one, else computed on meta."""
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(example_inputs)
    with torch._dispatch.python.enable_python_dispatcher():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                ex = next(inputs)
                # the example input itself: a tracer's meta value may have lost the storage offset
                env[node] = node.meta.get("val") if ex is None else ex
            elif node.op == "call_function":
                if "val" in node.meta:
                    env[node] = node.meta["val"]
                    continue
                args, kwargs = pytree.tree_map(
                    lambda a: env[a] if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
                args, kwargs = pytree.tree_map(
                    lambda a: _meta_tensor(a) if isinstance(a, torch.Tensor) else a, (args, kwargs))
                env[node] = node.target(*args, **kwargs)
            elif node.op == "get_attr":
                env[node] = getattr(gm, node.target)
    return env


def _has_unsupported_dtype(metas: Any) -> bool:
    return any(isinstance(m, (torch.Tensor, TensorValue)) and m.dtype not in SUPPORTED_DTYPES
               for m in pytree.tree_leaves(metas))


def lower_to_loop_ir(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     aten_fallback: frozenset[str] = frozenset(),
                     input_updates: tuple[tuple[int, int], ...] = ()) -> tuple[LoopIR, list[str]]:
    """The ATen graph as loop IR; also returns the perf hints (ops that fell back to ATen calls).
    Ops named in `aten_fallback` (`str(overload)`) run as ATen calls even when they have a rule.
    `input_updates`: the graph's (output, input) pairs of mutated inputs (LoopIR.input_updates)."""
    metas = node_metas(gm, example_inputs)
    ctx = LoweringContext()
    tracker = CheckTracker()  # where the lazy values of checking ops are loaded (kiln.lower.coverage)
    env: dict[torch.fx.Node, Any] = {}
    symbols: dict[str, tuple[int, int | None]] = {}
    input_layouts: list[tuple[int, Layout]] = []
    position = 0
    outputs: list[Any] = []
    output_spec = None

    def note_symbols(expr: sympy.Expr, pos: int, dim: int | None) -> None:
        if isinstance(expr, sympy.Symbol) and str(expr) not in symbols:
            symbols[str(expr)] = (pos, dim)

    for node in gm.graph.nodes:
        ctx.origins = (node.name,)
        ctx.meta = metas.get(node)
        ctx.node = node
        if node.op == "placeholder":
            m = ctx.meta
            if isinstance(m, torch.Tensor):
                lay = Layout(m.dtype, tuple(to_expr(s) for s in m.shape), tuple(to_expr(s) for s in m.stride()),
                             to_expr(m.storage_offset()))
                for d, s in enumerate(lay.sizes):
                    note_symbols(s, position, d)
                for d, s in enumerate(lay.strides):
                    note_symbols(s, position, -1 - d)
                input_layouts.append((position, lay))
                # the buffer's layout starts at its own data pointer (the wrapper passes data_ptr())
                name = f"arg{position}"
                ctx.storage_offsets[name] = lay.offset
                lay = Layout(lay.dtype, lay.sizes, lay.strides)
                ctx.add(InputBuffer(name, lay, (node.name,), position))
                env[node] = strided_value(BufferRef(name, lay))
            elif isinstance(m, (torch.SymInt, torch.SymFloat)):
                # a SymFloat is a float argument: the wrapper passes it on to kernels as a double
                env[node] = to_expr(m)
                if isinstance(m, torch.SymFloat) and not env[node].is_Symbol and not env[node].is_number:
                    # a value computed from one (a backward's saved f / 3): a symbol of its own
                    env[node] = float_symbol(f"zfp{position}")
                note_symbols(env[node], position, None)
            else:
                env[node] = m
            position += 1
        elif node.op == "get_attr":
            t = ctx.meta
            name = f"const_{node.target}".replace(".", "_")
            lay = Layout(t.dtype, tuple(to_expr(s) for s in t.shape), tuple(to_expr(s) for s in t.stride()))
            ctx.add(ConstantBuffer(name, lay, (node.name,), t))
            env[node] = strided_value(BufferRef(name, lay))
        elif node.op == "call_function":
            env[node] = _lower_node(ctx, node, env, aten_fallback)
            for k, tv in enumerate(pytree.tree_leaves(env[node])):
                if isinstance(tv, TensorValue):
                    tracker.track(node.name if k == 0 else f"{node.name}_{k}", tv)
            if isinstance(env[node], TensorValue):
                env[node] = _maybe_realize(ctx, env[node], node)
        elif node.op == "output":
            result = node.args[0]
            # a single tensor result is returned as a 1-tuple (the seam's graphs always return tuples)
            flat = not isinstance(result, (tuple, list)) or not any(isinstance(r, (tuple, list)) for r in result)
            leaves, spec = pytree.tree_flatten(result)
            output_spec = None if flat else pytree.treespec_dumps(spec)
            for out in leaves:
                outputs.append(_output(ctx, out, env, metas))
    ctx.origins = ()
    add_check_passes(ctx, tracker, outputs)  # checks no kernel runs over every element: a pass of their own
    derived = solve_symbols(input_layouts, symbols)
    ir = LoopIR(tuple(ctx.buffers), tuple(outputs), symbols, seed_needed=ctx.random_offset != 0,
                output_spec=output_spec, input_count=position, derived=derived,
                input_updates=input_updates, divisors=_bound_divisors(ctx.divisors, symbols, derived))
    return ir, ctx.perf_hints


SIZE_READ_PREFIX = "sz"  # a symbol standing for one input size or stride read as it is (solve_symbols)


def solve_symbols(input_layouts: Sequence[tuple[int, Layout]], symbols: dict[str, tuple[int, int | None]]
                  ) -> tuple[tuple[str, sympy.Expr], ...]:
    """Bindings of the size symbols that no input has as a size, stride or SymInt of its own, solved
    from an input size or stride that is linear in one of them once the others are known: s1 from a
    dim of s0*s1 where s0 is bound, s2 from s2 + 1. Each size read this needs becomes an entry of
    `symbols` (sz<k> -> (input position, dim)); each solved symbol an expression over those, in the
    order the wrappers bind them. Without this a kernel whose range is such a size names a symbol
    the wrapper never defines (a C++ build error, a Python NameError). Symbols left unsolved are
    reported by the IR's verifier."""
    bound = set(symbols)
    derived: list[tuple[str, sympy.Expr]] = []
    reads: dict[tuple[int, int], sympy.Symbol] = {}
    progress = True
    while progress:
        progress = False
        for position, lay in input_layouts:
            parts = [(d, e) for d, e in enumerate(lay.sizes)] + [(-1 - d, e) for d, e in enumerate(lay.strides)]
            for dim, expr in parts:
                unknown = {str(x) for x in expr.free_symbols} - bound
                if len(unknown) != 1:
                    continue
                name = unknown.pop()
                symbol = next(x for x in expr.free_symbols if str(x) == name)
                try:
                    poly = sympy.Poly(sympy.expand(expr), symbol)
                except sympy.PolynomialError:  # the symbol under a floor division or a modulo
                    continue
                if poly.degree() != 1:
                    continue
                scale, rest = poly.coeff_monomial(symbol), poly.coeff_monomial(1)
                if scale == 0 or (scale.is_number and scale < 0):
                    continue
                read = reads.get((position, dim))
                if read is None:
                    read = sympy.Symbol(f"{SIZE_READ_PREFIX}{len(reads)}", integer=True, nonnegative=True)
                    reads[(position, dim)] = read
                    symbols[str(read)] = (position, dim)
                solved = read - rest if scale == 1 else FloorDiv(read - rest, scale)
                derived.append((name, solved))
                bound.add(name)
                progress = True
    return tuple(derived)


def _lower_node(ctx: LoweringContext, node: torch.fx.Node, env: dict[torch.fx.Node, Any],
                aten_fallback: frozenset[str] = frozenset()) -> Any:
    args, kwargs = pytree.tree_map(lambda a: env[a] if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs))
    target = node.target
    if target is operator.getitem:
        return args[0][args[1]]
    if target is aten.sym_size.int:
        return args[0].sizes[args[1]]
    if target is aten.sym_stride.int:
        return args[0].view.layout.strides[args[1]] if args[0].view is not None else None
    if target is aten.sym_numel.default:
        return sympy.Mul(*args[0].sizes)
    if getattr(target, "__module__", None) in ("_operator", "operator") or target in (
            torch.sym_max, torch.sym_min, torch.sym_sqrt, sym_log2, torch.sym_float, math.floor, math.ceil,
            round, torch.sym_int, math.trunc, sym_floordiv):
        _note_divisor(ctx, target, args)
        return _sym_arith(target, args)
    args, kwargs = pytree.tree_map(lambda a: to_expr(a) if isinstance(a, (torch.SymInt, torch.SymFloat)) else a,
                                   (args, kwargs))
    rule = LOWERINGS.get(target)
    if aten_fallback and str(target) in aten_fallback:
        return fallback(ctx, target, args, kwargs, reason="its lowering is switched off (bisect)")
    if EAGER_REFUSES in node.meta:  # the ATen call raises what eager raises for these dtypes
        return fallback(ctx, target, args, kwargs, reason=f"eager refuses its dtypes ({node.meta[EAGER_REFUSES]})")
    if config.fallback_random and is_random(target):  # torch's generator draws, in eager's order
        return fallback(ctx, target, _realize_as_traced(ctx, node, env, args, random=True), kwargs,
                        reason="kiln.config.fallback_random")
    if target in _LAYOUT_FOLLOWS_INPUTS:
        args = _realize_as_traced(ctx, node, env, args)
    elif target in EXTERN_BY_DESIGN and not vector_bmm(node):
        args = _realize_extern_inputs(ctx, node, env, args)
    lazy_inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorValue) and a.view is None]
    ctx.pending_origins = tuple(dict.fromkeys(o for a in lazy_inputs for o in a.origins))
    if rule is not None and not _has_unsupported_dtype((ctx.meta, [m for m in pytree.tree_leaves(args)])):
        try:
            out = rule(ctx, *args, **kwargs)
            for tv in pytree.tree_leaves(out):
                if isinstance(tv, TensorValue) and tv.view is None and any(s == 0 for s in tv.sizes):
                    tv.loader = _never_loaded(tv.dtype)
            for tv in pytree.tree_leaves(out):  # loaders run lazily: surface their errors here
                if isinstance(tv, TensorValue) and tv.view is None:
                    tv.load(index_vars("i", tv.ndim))
        except (NotImplementedError, TypeError, KeyError, IndexError, ValueError, AttributeError) as e:
            return fallback(ctx, target, args, kwargs, reason=f"its lowering refused: {e}")
        if target in ROUNDED_OUTPUTS:
            out = pytree.tree_map(rounded_on_read, out)
        origins = ctx.pending_origins + ctx.origins
        for tv in pytree.tree_leaves(out):
            if isinstance(tv, TensorValue) and tv.view is None:
                tv.origins = tuple(dict.fromkeys(origins + tv.origins))
        return out
    reason = "no lowering" if rule is None else "unsupported dtype"
    return fallback(ctx, target, args, kwargs, reason=reason)


def _never_loaded(dtype: torch.dtype) -> Any:
    """The loader of a tensor with no elements. No loop ever reaches one of them (a consumer's range
    is empty too, or its read sits under a mask or a bounds check that fails), so its index
    arithmetic, which would divide by the zero size (a reshape's `//` and `%`, a roll's `%`), is
    never built at all."""
    zero = ops.constant(0, compute_dtype(dtype))
    return lambda idx: zero


def _realize_extern_inputs(ctx: LoweringContext, node: torch.fx.Node, env: dict[torch.fx.Node, Any],
                           args: tuple) -> tuple:
    """A matmul reads its inputs from memory, so a lazy input is stored once and the FX node's other
    users read that buffer too: a transpose of it for the weight gradient's mm becomes a strided view
    (BLAS takes it as is) instead of a second kernel recomputing the value in another layout."""
    out = list(args)
    for k, a in enumerate(node.args):
        if not isinstance(a, torch.fx.Node):
            continue
        value = env.get(a)
        if not isinstance(value, TensorValue) or value.view is not None:
            continue
        viewed = _permutation_of_stored(ctx, a, env)
        if viewed is not None:
            env[a] = out[k] = viewed
            continue
        saved, ctx.origins = ctx.origins, (a.name,)
        env[a] = out[k] = ctx.realize(value)
        ctx.origins = saved
    return tuple(out)


# Externs whose result takes its layout from an input's (ATen's CPU flash attention returns its
# output in its query's stride order): their lazy inputs are stored in the layouts the trace gave
# them, so the result has the layout the node's meta declares, which the kernels after it are written
# for. Stored contiguous, a query computed [B, L, H, D] in memory (a rotary embedding of heads split
# off a projection) came back [B, H, L, D] and the wrapper re-laid it out on every call.
_LAYOUT_FOLLOWS_INPUTS = (aten._scaled_dot_product_flash_attention_for_cpu.default,)


def _realize_as_traced(ctx: LoweringContext, node: torch.fx.Node, env: dict[torch.fx.Node, Any], args: tuple,
                       random: bool = False) -> tuple:
    """A random op run as the ATen call draws in its input's memory order (dropout's
    `empty_like(x).bernoulli_(p)`): a lazy input is stored in the layout the trace gave it (a
    transposed product stays transposed; a slice of one, not dense, in the same order of strides),
    so the draws land where eager's do (and an op of _LAYOUT_FOLLOWS_INPUTS returns the layout its
    meta has)."""
    out = list(args)
    for k, a in enumerate(node.args):
        if not isinstance(a, torch.fx.Node):
            continue
        value, meta = env.get(a), a.meta.get("val")
        if isinstance(value, TensorValue) and value.view is None and isinstance(meta, torch.Tensor):
            saved, ctx.origins = ctx.origins, (a.name,)
            env[a] = out[k] = ctx.realize(value, stride_order_layout(meta) if random else dense_layout(meta))
            ctx.origins = saved
    return tuple(out)


_PERMUTATIONS = (aten.t.default, aten.transpose.int, aten.permute.default)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _permutation_of_stored(ctx: LoweringContext, a: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    """For a matmul input that is a transpose (or permute) of a lazy value: store that value in its
    own layout and return the transpose as a strided view of it, or None. A weight gradient's
    `mm(t(g), h)` and the input gradient's `mm(g, w)` then read one stored g, where storing t(g)
    would write a second, transposed copy of it in the same kernel (as much memory again). So for
    a reshape of a value with other readers."""
    if a.op != "call_function" or not isinstance(a.args[0], torch.fx.Node):
        return None
    # A reshape of a value read by several (`view(norm(x))` once per q, k and v projection, each its
    # own node) is a view of the one stored value: it stored one copy of the value per reshape.
    if a.target not in _PERMUTATIONS and not (a.target in _RESHAPES and len(a.args[0].users) > 1):
        return None
    base = a.args[0]
    base_value = env.get(base)
    if not isinstance(base_value, TensorValue) or base_value.view is not None:
        return None
    saved, ctx.origins = ctx.origins, (base.name,)
    env[base] = ctx.realize(base_value)
    ctx.origins = saved
    saved_meta, ctx.meta = ctx.meta, a.meta.get("val")
    try:
        viewed = _lower_node(ctx, a, env)
    finally:
        ctx.meta = saved_meta
    return viewed if isinstance(viewed, TensorValue) and viewed.view is not None else None


# Size arithmetic with a float operand (or a true division): one IEEE operation each, as eager
# computes it (kiln.symbolic.floats), never sympy's exact arithmetic that folds (s0 / 3) * 2.
_FLOAT_ARITH: dict[Any, Callable[..., Any]] = {
    operator.add: FloatAdd, operator.sub: lambda a, b: FloatAdd(a, -b), operator.mul: FloatMul,
    operator.truediv: FloatTrueDiv, operator.floordiv: FloatFloorDiv, sym_floordiv: FloatFloorDiv,
    operator.mod: FloatMod, operator.pow: FloatPow, torch.sym_sqrt: FloatSqrt, torch.sym_float: to_float,
    sym_log2: FloatLog2, math.floor: float_floor, math.ceil: lambda a: float_floor(a, ceiling=True),
    round: RoundHalfEven, torch.sym_int: TruncToInt, math.trunc: TruncToInt,
}


_DIVISIONS = {operator.floordiv: "floordiv", sym_floordiv: "floordiv", operator.mod: "mod", operator.truediv: "truediv"}


def _note_divisor(ctx: LoweringContext, target: Any, args: Sequence[Any]) -> None:
    """A division of Python numbers whose divisor may be 0 at run time (an int or float argument,
    not a size, which is >= 2): kept for the wrapper's check (LoopIR.divisors)."""
    if target not in _DIVISIONS or len(args) != 2:
        return
    divisor = to_expr(args[1]) if isinstance(args[1], (torch.SymInt, torch.SymFloat)) else args[1]
    if not isinstance(divisor, sympy.Expr) or divisor.is_number or divisor.is_nonzero:
        return  # a constant divisor of 0 raised at trace time already
    floats = any(isinstance(a, float) or (isinstance(a, sympy.Basic) and is_float_valued(a)) for a in args)
    ctx.divisors.append((divisor, zero_division_kind(_DIVISIONS[target], floats)))


def _bound_divisors(divisors: list[tuple[sympy.Expr, str]], symbols: dict[str, tuple[int, int | None]],
                    derived: Sequence[tuple[str, sympy.Expr]]) -> tuple[tuple[sympy.Expr, str], ...]:
    """The divisors the wrapper can test before its first step: those over input symbols only."""
    bound = set(symbols) | {name for name, _ in derived}
    out: dict[tuple[sympy.Expr, str], None] = {}
    for d in divisors:
        if all(str(s) in bound for s in d[0].free_symbols):
            out[d] = None
    return tuple(out)


def _sym_arith(target: Any, args: Sequence[Any]) -> Any:
    vals = [sympy.sympify(a) if isinstance(a, (int, float, sympy.Basic)) and not isinstance(a, bool) else a
            for a in args]
    floats = target in (operator.truediv, torch.sym_sqrt, sym_log2, torch.sym_float, sym_floordiv) or any(
        isinstance(v, sympy.Basic) and not is_truth_value(v) and is_float_valued(v) for v in vals)
    if floats and target in _FLOAT_ARITH:
        return _FLOAT_ARITH[target](*vals)
    table: dict[Any, Callable[..., Any]] = {
        operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b, operator.mul: lambda a, b: a * b,
        operator.floordiv: lambda a, b: FloorDiv(a, b), operator.neg: lambda a: -a,
        operator.mod: lambda a, b: sympy.Mod(a, b),
        torch.sym_max: lambda a, b: sympy.Max(a, b), torch.sym_min: lambda a, b: sympy.Min(a, b),
        operator.pow: lambda a, b: sympy.Pow(a, b),
        math.floor: lambda a: sympy.floor(a), math.ceil: lambda a: sympy.ceiling(a), operator.abs: lambda a: sympy.Abs(a),
        torch.sym_int: TruncToInt, math.trunc: TruncToInt,
        operator.gt: lambda a, b: relation("gt", a, b), operator.ge: lambda a, b: relation("ge", a, b),
        operator.lt: lambda a, b: relation("lt", a, b), operator.le: lambda a, b: relation("le", a, b),
        operator.eq: lambda a, b: relation("eq", a, b), operator.ne: lambda a, b: relation("ne", a, b),
        torch.sym_not: lambda a: negate(a), operator.and_: lambda a, b: sympy.And(a, b),
        operator.or_: lambda a, b: sympy.Or(a, b)}
    if target in _BITWISE and not any(isinstance(v, sympy.Basic) and is_truth_value(v) for v in vals):
        return _BITWISE[target](*vals)  # & and | of ints (not of conditions), ^, << and >>
    if target not in table:
        raise NotImplementedError(f"symbolic {target}")
    return table[target](*vals)


_BITWISE: dict[Any, Callable[..., Any]] = {operator.and_: BitwiseAnd, operator.or_: BitwiseOr,
                                           operator.xor: BitwiseXor, operator.lshift: LShift,
                                           operator.rshift: RShift}


def _maybe_realize(ctx: LoweringContext, tv: TensorValue, node: torch.fx.Node) -> TensorValue:
    if tv.view is not None:
        return tv
    body = tv.load(index_vars("i", tv.ndim))
    cost = value_cost(body)
    users = len(node.users)
    if ((users > 1 and _reused_costly(tv, body, cost, node)) or _strided_for_passes(tv, body, node)
            or cost > BODY_LIMIT or len(walk(body)) > BODY_LIMIT):
        # a graph output is stored in eager's strides once, not copied into them at the end
        returned = isinstance(ctx.meta, torch.Tensor) and any(user.op == "output" for user in node.users)
        if returned:
            return ctx.realize(tv, dense_layout(ctx.meta))
        if _nhwc_sized(tv) and reads_channels_last(tv):
            # computed from NHWC data (a BatchNorm and SiLU of a convolution's result): stored NHWC
            # as eager's pointwise ops would, so its kernel and every reader run along the channels
            # (stored NCHW, an EfficientNet's squeeze-excite block transposed it twice)
            return ctx.realize(tv, Layout(tv.dtype, tv.sizes, channels_last_strides(tv.sizes)))
        return ctx.realize(tv)
    return tv


def _reused_costly(tv: TensorValue, body: Value, cost: int, node: torch.fx.Node) -> bool:
    """Whether a value used more than once costs more recomputed by each user than stored once.
    Reads are counted where a load's place moves with every dim of the value (a bias broadcast
    along rows stays in cache: storing `x + bias` for a LayerNorm and another reader cost one more
    store than reading x twice, 0.84x)."""
    if cost > RECOMPUTE_LIMIT:
        return True
    dims = {i for i, size in zip(index_vars("i", tv.ndim), tv.sizes) if size != 1}
    reads = sum(isinstance(v, Load) and (dims <= v.index.free_symbols or v.extra is not None) for v in walk(body))
    return reads > REUSE_READS or (reads > 1 and any(user.target in MULTI_PASS for user in _readers(node)))


def _strided_for_passes(tv: TensorValue, body: Value, node: torch.fx.Node) -> bool:
    """Whether a multi-pass reader (a LayerNorm over the last dim) would run each pass over a load
    that strides along that dim (x + y.transpose(1, 2): stride 64 per element, three times): stored,
    the kernel computes it into a row in cache once and its passes read that row."""
    if tv.ndim == 0 or not any(user.target in MULTI_PASS for user in _readers(node)):
        return False
    last = index_vars("i", tv.ndim)[-1]
    return any(isinstance(v, Load) and v.extra is None and last in v.index.free_symbols
               and sympy.expand(v.index).coeff(last) != 1 for v in walk(body))


# ops that only re-index their input: a reader of their result reads the value they view
_VIEWS = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
                    aten.squeeze.dim, aten.squeeze.default, aten.permute.default, aten.transpose.int, aten.t.default,
                    aten.expand.default, aten.alias.default})


def _readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes that read `node`'s value, through views of it (a GroupNorm's var_mean reads its
    input through a reshape into groups)."""
    out: list[torch.fx.Node] = []
    for user in node.users:
        out += _readers(user) if user.target in _VIEWS else [user]
    return out


def _nhwc_sized(tv: TensorValue) -> bool:
    """A 4-d value of static sizes with enough channels for a vectorized loop along them."""
    return (tv.ndim == 4 and all(getattr(s, "is_number", False) for s in tv.sizes)
            and int(tv.sizes[1]) >= MIN_STORAGE_INNER and int(tv.sizes[2] * tv.sizes[3]) > 1)


def _output(ctx: LoweringContext, out: Any, env: dict[torch.fx.Node, Any], metas: dict[torch.fx.Node, Any]) -> Any:
    if not isinstance(out, torch.fx.Node):
        return out
    value = env[out]
    if isinstance(value, sympy.Basic):
        return SymExpr(value)
    if not isinstance(value, TensorValue):
        return value
    if value.view is None:
        ctx.origins = (out.name,)
        value = ctx.realize(value, dense_layout(metas[out]))
        env[out] = value
    elif value.view.name in ctx.relaid_out and value.view.layout != dense_layout(metas[out]):
        value = ctx.realize(value, dense_layout(metas[out]))  # stored NHWC inside: eager's strides out
    assert value.view is not None
    return value.view
