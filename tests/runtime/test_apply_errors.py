"""The exception a compiled forward raises reaches the caller as eager's, also when torch's
Function.apply reports it as a SystemError.

After a few hundred compiled programs in one process, a forward that warned (var() over one
element) and then raised (an integer division by zero) came out of `Function.apply` as
`SystemError("<class 'UserWarning'> returned a result with an exception set")` with the real
exception as its cause: the buffered warning was flushed while the exception was pending. The
@slow faulting-program fuzz run (tests/fuzz/test_random_programs.py) found it on seeds 3, 85, 102,
178, 196, 211, 356 and 395 after the 2,000-program run; this checks the unwrapping itself.
"""
from __future__ import annotations

from kiln.runtime.aot import _raised_inside


def _system_error_caused_by(cause: BaseException, text: str) -> SystemError:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise SystemError(text) from inner
    except SystemError as outer:
        return outer


def test_the_forward_s_exception_comes_out_of_a_flushed_warning() -> None:
    cause = RuntimeError("ZeroDivisionError")
    exc = _system_error_caused_by(cause, "<class 'UserWarning'> returned a result with an exception set")
    assert _raised_inside(exc) is cause


def test_any_other_system_error_is_left_as_it_is() -> None:
    exc = _system_error_caused_by(RuntimeError("x"), "error return without exception set")
    assert _raised_inside(exc) is exc
    bare = SystemError("<class 'UserWarning'> returned a result with an exception set")
    assert _raised_inside(bare) is bare
