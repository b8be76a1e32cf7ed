"""The tensor guard kind and the native checks: the boundary extension (kiln.runtime.boundary) in guards.

`check_tensor` checks a tensor's metadata with one `tensor_ok` call of the extension where it is
built, in Python otherwise (the Python checks also say which part failed). `native_checks` finds
the extension; a check function made before it loads is switched to it once it does (`_made`,
`_adopt_native`, called from the tier-up thread), see `CheckFn.use_native`.
"""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from kiln import config, log
from kiln.capture.guards.kinds import Check, Emitter, Guard, TensorSpec, _tname, guard_kind, type_change
from kiln.symbolic.marks import DYNAMIC_ATTR, marked_dynamic

if TYPE_CHECKING:
    from kiln.capture.guards.compile import CheckFn


# Tensor types whose metadata the native check reads as Python does (no __torch_function__ of their own)
_NATIVE_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


@guard_kind
def check_tensor(spec: TensorSpec, name: str, em: Emitter) -> list[Check]:
    if em.native is None or spec.type not in _NATIVE_TENSOR_TYPES:
        return _tensor_checks(spec, name, em) + _marks_check(spec, name, em)
    # One call to the boundary extension checks what _tensor_checks spells out in Python (about a
    # tenth of the time); the Python checks only say, on a failure, which part failed.
    em_python = Emitter()
    python = _tensor_checks(spec, name, em_python) + _marks_check(spec, name, em_python)

    def why(v: Any) -> str:
        for check in python:
            try:
                ok = eval(check.render("___value"), {**em_python.constants, "___value": v})
            except Exception:
                ok = False
            if not ok:
                return check.why(v)
        return f"{name} changed"

    handle = native_spec(spec, em.native)
    if handle is None:  # a device type c10 cannot name from Python's string: Python checks
        return _tensor_checks(spec, name, em) + _marks_check(spec, name, em)
    return [Check(f"___tensor_ok({{v}}, {em.bind(handle)})", why)]


def native_spec(spec: TensorSpec, native: Any) -> Any:
    """The boundary extension's handle of `spec` for its `tensor_ok` (the marks check included), or
    None where the extension cannot express it."""
    if spec.type not in _NATIVE_TENSOR_TYPES:
        return None
    try:
        return native.tensor_spec(
            spec.type, spec.dtype, spec.device.type, -1 if spec.device.index is None else spec.device.index,
            spec.layout, spec.requires_grad, spec.sizes, spec.strides if spec.layout == torch.strided else None,
            spec.stride_links, spec.inference, True, spec.conj, spec.neg,  # True: check both view bits of any dtype
            None if spec.markable is None else frozenset(spec.markable))
    except (TypeError, ValueError):
        return None


def _tensor_checks(spec: TensorSpec, name: str, em: Emitter) -> list[Check]:
    """The checks of a tensor's metadata, in Python."""
    checks = [
        Check(f"type({{v}}) is {em.bind(spec.type)}",
              lambda v: f"{name} changed type {type_change(spec.type, type(v))}"),
        Check(f"{{v}}.dtype is {em.bind(spec.dtype)}", lambda v: f"{name}.dtype changed from {spec.dtype} to {v.dtype}"),
        Check(_device_code(spec.device, em), lambda v: f"{name}.device changed from {spec.device} to {v.device}"),
        Check(f"{{v}}.requires_grad is {spec.requires_grad}",
              lambda v: f"{name}.requires_grad changed from {spec.requires_grad} to {v.requires_grad}"),
        Check(f"{{v}}.layout is {em.bind(spec.layout)}",
              lambda v: f"{name}.layout changed from {spec.layout} to {v.layout}"),
    ]
    checks.append(_sizes_check(spec, name))
    if spec.layout == torch.strided:
        checks.append(_strides_check(spec, name))
    checks.append(Check(f"{{v}}.is_inference() is {spec.inference}",
                        lambda v: f"{name} {'is no longer' if spec.inference else 'is now'} an inference tensor"))
    # The negative bit is not only a complex tensor's: `z.conj().imag` is a real view with it set.
    # The conjugate bit is (c10 asserts it when setting it), and conjugating a real number changes
    # nothing: a real dtype, checked above by identity, leaves only the negative bit to check.
    conj = f"{{v}}.is_conj() is {spec.conj} and " if spec.conj or spec.dtype.is_complex else ""
    checks.append(Check(f"{conj}{{v}}.is_neg() is {spec.neg}",
                        lambda v: f"{name} conjugate/negative view bits changed"))
    return checks


def _marks_check(spec: TensorSpec, name: str, em: Emitter) -> list[Check]:
    markable = spec.markable
    if markable is None:
        return []
    # Marks live on the tensor object (kiln.symbolic.marks); a dim newly marked dynamic that this
    # graph specialized must make it miss, so the recompile makes that dim symbolic.
    allowed = em.bind(frozenset(markable))
    return [Check(f"getattr({{v}}, {DYNAMIC_ATTR!r}, {allowed}) <= {allowed}",
                  lambda v: f"{name} has dims newly marked dynamic: {sorted(set(marked_dynamic(v)) - set(markable))}")]


def _device_code(device: torch.device, em: Emitter) -> str:
    # `t.device` builds a new torch.device on every read; the boolean properties do not.
    if device.type == "cpu":
        return "{v}.is_cpu"
    if device.type == "cuda" and device.index is not None:
        return f"{{v}}.is_cuda and {{v}}.get_device() == {device.index}"
    return f"{{v}}.device == {em.bind(device)}"


def _sizes_check(spec: TensorSpec, name: str) -> Check:
    def why(v: torch.Tensor) -> str:
        if v.dim() != len(spec.sizes):
            return f"{name}.dim() changed from {len(spec.sizes)} to {v.dim()}"
        for d, (old, new) in enumerate(zip(spec.sizes, v.shape)):
            if old is not None and old != new:
                return f"{name}.size()[{d}] changed from {old} to {new}"
        return f"{name}.size() changed"

    if all(s is not None for s in spec.sizes):
        return Check(f"{{v}}.shape == {tuple(spec.sizes)!r}", why)
    parts = [f"{{v}}.dim() == {len(spec.sizes)}"]
    parts += [f"{{v}}.shape[{d}] == {s}" for d, s in enumerate(spec.sizes) if s is not None]
    return Check(" and ".join(parts), why)


def _strides_check(spec: TensorSpec, name: str) -> Check:
    def why(v: torch.Tensor) -> str:
        expected = tuple("?" if s is None else s for s in spec.strides)
        return f"{name}.stride() changed from {expected} to {tuple(v.stride())}".replace("'?'", "?")

    if all(s is not None for s in spec.strides):
        return Check(f"{{v}}.stride() == {tuple(spec.strides)!r}", why)
    parts = [f"{{v}}.stride()[{d}] == {s}" for d, s in enumerate(spec.strides) if s is not None]
    # Free strides keep the dense layout they had: stride[i] == size[j] * stride[j] for the dim j
    # laid out just inside i (what the ShapeEnv's symbolic strides stood for).
    for i, j in spec.stride_links:
        parts.append(f"{{v}}.stride()[{i}] == {{v}}.shape[{j}] * {{v}}.stride()[{j}]")
    return Check(" and ".join(parts) or "True", why)


def tensor_guard(source: str, t: torch.Tensor, dynamic_dims: Iterable[int] = (), description: str | None = None) -> Guard:
    """The check_tensor guard for the real tensor `t` found at `source`, with `dynamic_dims` free."""
    # Parameters and buffers are left out of the mark check: it costs a lookup per tensor per call,
    # and marks are put on the inputs a caller passes.
    module_owned = "._parameters[" in source or "._buffers[" in source
    return Guard(source, "check_tensor", TensorSpec.of(t, dynamic_dims, watch_marks=not module_owned), description)


def native_checks() -> Any:
    """The boundary extension when this process loaded it or the cache holds it built (None when
    config.native_guards is off or it is not built: nothing is compiled here)."""
    if not config.native_guards:
        return None
    from kiln.runtime import boundary  # loaded only when guards are compiled: not at `import kiln`
    try:
        return boundary.built()
    except Exception as exc:  # Python checks then, as without a compiler
        log.artifact("guards", f"native guard checks unavailable: {type(exc).__name__}: {exc}")
        return None


def when_native_loads(callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` once the boundary extension is loaded (now, if it is)."""
    from kiln.runtime import boundary  # as in native_checks: not at `import kiln`
    boundary.when_loaded(callback)


# Check functions made in Python only, to switch to the native checks when the extension loads
_AWAITING: "weakref.WeakSet[CheckFn]" = weakref.WeakSet()
_awaiting_lock = threading.Lock()
_waiting_for_boundary = [False]


def _made(check: CheckFn, upgrade_later: bool) -> CheckFn:
    if check.native or not upgrade_later or not config.native_guards:
        return check
    from kiln.runtime import boundary  # as above: not at `import kiln`
    with _awaiting_lock:
        _AWAITING.add(check)
        register = not _waiting_for_boundary[0]
        _waiting_for_boundary[0] = True
    if register:
        boundary.when_loaded(_adopt_native)
    return check


def _adopt_native(module: Any) -> None:
    """The boundary extension loaded (in the tier-up thread, usually): every check function made
    before switches to the native checks."""
    with _awaiting_lock:
        waiting = list(_AWAITING)
        _AWAITING.clear()
        _waiting_for_boundary[0] = False
    for check in waiting:
        if not config.native_guards:
            break
        try:
            check.use_native(module)
        except Exception as exc:  # it keeps its Python checks, which are as right
            log.artifact("guards", f"guards kept in Python: {type(exc).__name__}: {exc}")
