"""The torch function modes a functional trace runs under (kiln.autograd.functionalize's
FunctionalSession installs them), each keeping one of eager's observable facts that the C++
functionalization alone loses: inputs' and intermediates' layouts through in-place updates
(_InputLayouts, _IntermediateLayouts), an as_strided of a view taken of the view chain's start
(_AsStridedFromBase), in-place layout changes counted as eager's version counter counts them
(_LayoutUpdates), and `t.data` updates left untracked (_DataAliasUpdates). Also the helpers they
share with the session: a wrapper's functional storage identity and size expressions.
PyTorch counterpart: the metadata collection of torch/_functorch/_aot_autograd/collect_metadata_analysis.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch
from torch.overrides import TorchFunctionMode

from kiln.autograd.tracer import expr_of

if TYPE_CHECKING:
    from kiln.autograd.functionalize import FunctionalSession


class _InputLayouts(TorchFunctionMode):
    """Inputs keep eager's layout through in-place updates.

    A functionalized in-place op computes the new value out of place and makes it the input's
    value, with the layout that op gives (`x.add_(1)` on rows `x[::2]` of a buffer gives a
    contiguous tensor), where eager keeps the input's strides. Later decisions read the layout:
    `x.contiguous()` returns `x` itself, `x.reshape(-1)` makes a view instead of a copy, and a
    mutation through either would reach the input. After each torch call, the session gives such
    an input its own strides back."""

    def __init__(self, session: FunctionalSession) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _AS_STRIDED and args and isinstance(args[0], torch.Tensor):
            self.session.note_as_strided(args[0])
        out = func(*args, **(kwargs or {}))
        self.session.keep_layouts()
        return out


class _IntermediateLayouts(TorchFunctionMode):
    """Intermediates keep eager's layout through in-place updates, as inputs do (_InputLayouts).

    `y = x.t() * 2; y.masked_fill_(m, 0)` keeps y's strides (1, 4) in eager; functionalized, y's new
    value is masked_fill's result, contiguous, and so is the output (or a view of it, `y.t().
    index_fill_(...)` updating y through a transpose gave y transposed strides). After an in-place
    call whose target's base is not an input, the base gets its strides from before the call back."""

    def __init__(self, session: FunctionalSession) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = _updated_tensor(func, args, kwargs)
        if target is None or not torch._is_functional_tensor(target) or target.layout != torch.strided:
            return func(*args, **kwargs)
        base = target._base if target._base is not None else target
        storage = _storage(base)
        if storage is None or any(isinstance(v, torch.Tensor) and _storage(v) == storage
                                  for v in self.session.visible):
            return func(*args, **kwargs)
        torch._sync(base)
        inner = torch._from_functional_tensor(base)
        shape, strides = list(inner.shape), list(inner.stride())
        out = func(*args, **kwargs)
        if torch._is_functional_tensor(base) and not torch._functionalize_has_metadata_mutation(base):
            torch._sync(base)
            if _same_expressions(torch._from_functional_tensor(base).shape, shape):
                self.session.keep_intermediate_layout(base, strides)
        return out


_AS_STRIDED = frozenset({torch.Tensor.as_strided, torch.as_strided, torch.Tensor.as_strided_})


class _AsStridedFromBase(TorchFunctionMode):
    """`v.as_strided(size, stride, offset)` of a view v is taken of v's base instead.

    as_strided addresses the storage itself (its offset and strides are the storage's, not v's), so
    the two are the same view in eager; functionalization refuses an in-place update through a view
    chain with an as_strided after its first link (`x.view(-1).as_strided(...).mul_(2)`), and taken
    of the base the as_strided is the chain's first link. A missing offset is v's own. Links `_base`
    misses are recorded as made: `detach()` (the as_strided is taken of what was detached, then
    detached: eager's has no history, shares storage and version) and inference-mode views."""

    def __init__(self) -> None:
        super().__init__()
        # id(alias) -> (alias, the tensor it was made of, whether by detach) for links _base misses
        self._made_of: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.as_strided, torch.as_strided) and args and isinstance(args[0], torch.Tensor):
            root, detach = self._root(args[0])
            if root is not args[0]:
                view, rest = args[0], list(args[1:])
                if len(rest) == 3 and rest[2] is None:
                    rest[2] = view.storage_offset()
                elif len(rest) < 3 and kwargs.get("storage_offset") is None:
                    kwargs["storage_offset"] = view.storage_offset()
                out = func(root, *rest, **kwargs)
                return out.detach() if detach else out
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out._base is None and args and isinstance(args[0], torch.Tensor) \
                and out is not args[0] and _storage(out) is not None and _storage(out) == _storage(args[0]):
            self._made_of[id(out)] = (out, args[0], func in (torch.Tensor.detach, torch.detach))
        return out

    def _root(self, view: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The tensor the view chain ending at `view` starts from, and whether a detach is in it."""
        root, detach = view, False
        while True:
            # a view made under no_grad of a base that requires grad: taken of the base, the
            # as_strided would carry the base's gradient where eager's does not, so it is detached;
            # with grad mode on it is left alone (eager refuses an in-place op on it then)
            if root._base is not None and root.requires_grad == root._base.requires_grad:
                root = root._base
                continue
            if root._base is not None and not torch.is_grad_enabled():
                root, detach = root._base, True
                continue
            made = self._made_of.get(id(root))
            if made is None or made[0] is not root:
                return root, detach
            # a recorded link whose end lost the grad its start has (a detach, an inference-mode
            # view) is kept by detaching the as_strided taken of the start
            root, detach = made[1], detach or made[2] or root.requires_grad != made[1].requires_grad


class _LayoutUpdates(TorchFunctionMode):
    """Count the in-place layout changes (t_, squeeze_, as_strided_, a resize_ to new sizes) of
    each input's storage, through the input or any view of it. Eager counts each in the version
    counter its views share with the input; functionalized they change no data, so no update of
    the input's value records them."""

    def __init__(self, session: FunctionalSession) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in _LAYOUT_UPDATES or not args or not isinstance(args[0], torch.Tensor) \
                or not torch._is_functional_tensor(args[0]):
            return func(*args, **kwargs)
        target = args[0]
        storage, sizes = _storage(target), tuple(target.shape)
        out = func(*args, **kwargs)
        if name.startswith("resize") and tuple(target.shape) == sizes:
            return out  # eager's resize_ to the sizes it has leaves the counter alone
        if storage is not None:  # an input's (input_infos) or an intermediate's (eager_version)
            self.session._layout_updates[storage] = self.session._layout_updates.get(storage, 0) + 1
        return out


_LAYOUT_UPDATES = frozenset({"t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_",
                             "as_strided_", "resize_", "resize_as_"})


class _DataAliasUpdates(TorchFunctionMode):
    """Updates through `t.data` are untracked ones: in eager that alias has a version counter of its
    own, so `w.data.add_(g)` (a hand-written optimizer step, a weight clamp) leaves w's counter where
    it was. Functionalized, the alias shares w's storage and its update counts as w's; the session
    takes it back out of the count (untracked_update), for the alias and views of it."""

    def __init__(self, session: FunctionalSession) -> None:
        super().__init__()
        self.session = session
        self.aliases: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func == _DATA_GET:
            alias = func(*args, **kwargs)
            self.aliases.append(alias)
            return alias
        target = _updated_tensor(func, args, kwargs) if self.aliases else None
        if target is not None and any(a is target or a is target._base for a in self.aliases):
            with self.session.untracked_update([target]):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


_DATA_GET = torch._C.TensorBase.__dict__["data"].__get__


def _updated_tensor(func: Any, args: Any, kwargs: dict) -> torch.Tensor | None:
    """The tensor an in-place method (`add_`, `__setitem__`) or an out= call writes, else None."""
    name = getattr(func, "__name__", "")
    if args and isinstance(args[0], torch.Tensor) and (
            name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))):
        return args[0]
    out = kwargs.get("out")
    return out if isinstance(out, torch.Tensor) else None


def _storage(t: torch.Tensor) -> int | None:
    """The identity of a wrapper's functional storage, which all its views share."""
    if t.layout != torch.strided or not torch._C._has_storage(t):
        return None  # sparse tensors have no storage; they leave the graph as they are
    # the StorageImpl's address, without making a Python storage object for each wrapper
    return torch._C._storage_id(t)  # type: ignore[attr-defined]  # bound in C++, not in the stubs


def _expressions(values: Any) -> list[sympy.Expr]:
    return [_expression(v) for v in values]


def _expression(x: int | torch.SymInt) -> sympy.Expr:
    return sympy.sympify(expr_of(x)) if isinstance(x, torch.SymInt) else sympy.Integer(x)


def _same_expressions(a: Any, b: Any) -> bool:
    """Whether two lists of sizes (or strides) are equal for every value of the size symbols the
    guards allow: the same expressions, or ones the shape environment proves equal without a new
    guard (`x.view(-1, 2)` of a size-s0 input has s0 elements as `2*FloorDiv(s0, 2)`, equal to s0
    under the divisibility guard that view recorded)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        ex, ey = _expression(x), _expression(y)
        if ex == ey:
            continue
        env = next((v.node.shape_env for v in (x, y) if isinstance(v, torch.SymInt)), None)
        if env is None or env._static_value(sympy.Eq(ex, ey)) is not True:
            return False
    return True
