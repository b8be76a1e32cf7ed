"""The exceptions Kiln raises to users, in one place so that every stage raises the same kinds.

Capture turns `Unsupported` into a graph break (or, under fullgraph=True, into a user-facing
`GraphBreakError`); any other exception inside Kiln is an internal error that falls back to eager.
"""
from __future__ import annotations

from typing import Any, Callable


class KilnError(Exception):
    """Base class of every error Kiln raises on purpose."""


class Unsupported(KilnError):
    """Something capture cannot put in a graph; becomes a graph break with this message as reason.

    `kind` keys the hint table of kiln.capture.breaks (e.g. "print", "item", "data_dependent_branch");
    `hint` overrides the table's compile-friendly rewrite for this one break.
    """

    def __init__(self, reason: str, *, kind: str = "unsupported", hint: str | None = None,
                 eager_error: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.hint = hint
        # the exception eager raises here, known at trace time (an in-place op into an expanded
        # tensor): the break runs the op natively, which raises it; under fullgraph=True, where
        # there is no break, it is raised itself, as torch.compile does
        self.eager_error = eager_error


class RestartCapture(KilnError):
    """Raised inside capture when the trace changed the program's state the way its first eager
    call would (a lazy module initialized from its input's shapes): what was guarded so far may
    no longer hold, so the frame is captured again from its start. Never reaches the user."""


class InferenceModeEscapes(RestartCapture):
    """A tensor made inside `with torch.inference_mode():` (traced as a no-grad region) would be
    seen where eager's inference tensor differs from a normal one: it leaves the graph (returned,
    stored, live at a break), is written in place after the block, or meets autograd there (eager
    refuses to save it for backward). The frame is captured again with the block as a graph
    break, which runs it for real."""


class UnsafeDeferral(RestartCapture):
    """A graph with deferred checks (kiln.capture.deferred_checks) writes into an input: running the
    frame again eagerly after a failed check would write it twice, so the frame is captured again
    with such branches as graph breaks."""


class HookedTensorEscapes(RestartCapture):
    """A tensor the graph computes, with a hook a node of the graph registers on it, leaves the
    graph (returned, stored, live at a break). Under AOT autograd that hook runs inside the compiled
    backward, after any hook or retain_grad the caller adds to the output, which eager runs after
    it: the frame is captured again with such registrations as graph breaks (eager's registration
    on the real tensor)."""


class GraphBreakError(KilnError):
    """Raised under fullgraph=True at the first graph break; its message is the break record."""


class DataDependentOutputError(Unsupported):
    """An op whose output shape or value depends on tensor data (nonzero, .item(), ...)."""

    def __init__(self, op: str, message: str | None = None) -> None:
        self.op = op
        super().__init__(
            message
            or f"{op} has an output that depends on the data of its inputs, which a fake tensor does not have",
            kind="data_dependent",
        )


class MissingFakeImplError(Unsupported):
    """A custom op (or an op without a meta kernel) has no fake implementation."""

    def __init__(self, op: str, hint: str) -> None:
        self.op = op
        super().__init__(f"{op} has no fake (meta) implementation. {hint}", kind="missing_fake_impl")


class VerificationError(KilnError):
    """A stage handed the next one an IR that breaks the promise of their seam (docs/seams.md): a bug
    in Kiln, caught where it happens instead of as a wrong result later. `stage` names the seam's
    producer ("capture", "aot_autograd", "lower_to_loop_ir", "schedule")."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"[{stage}] {message}")
        self.stage = stage


class ExternMismatchError(KilnError):
    """A compiled graph's extern (an ATen op or a custom op run as is) returned a tensor whose dtype
    or sizes are not the ones its fake tensor promised at capture: the kernels after it were
    compiled for the promised layout and would read its memory wrongly, so the wrapper stops
    before they run. A bug in a fake implementation (Kiln's, PyTorch's meta kernel or a custom
    op's register_fake), never the user's program. `clean`: nothing the graph writes outside
    itself (an input's storage) was written before the check, so the frame can run eagerly in
    its place; the entry that first sees it falls back and clears it before passing it on."""

    def __init__(self, message: str, clean: bool = False) -> None:
        super().__init__(message)
        self.clean = clean


class DeferredCheckFailed(ExternMismatchError):
    """A deferred check of a graph (kiln.capture.deferred_checks: the condition of a branch whose
    other side raises, such as torch.distributions' argument validation) was false: the frame
    runs eagerly in this call's place, and raises what eager raises. `clean` as for its base: the
    entry that first sees it runs its frame again; it never disables the frame."""


def reraise(exc: BaseException) -> Callable[..., Any]:
    """A callable that raises `exc` when called: a glue hands it to the frame's own handlers in
    place of a call that already raised at a graph break inside a try or with block (kept here,
    imported with Kiln, so that a glue read back from the frame cache finds it by name)."""

    def raise_again(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return raise_again
