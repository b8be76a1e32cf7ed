"""An exception raised in the compiled frame, seen after it (kiln/capture/variables/exception.py):
raised where no handler of the traced frames runs, its __context__ is the exception the caller
handles (sys.exception() where the compiled function is called), as eager's raise sets it; one
that leaves the frame as a value (returned, stored in an argument) has a traceback, as eager's."""
from __future__ import annotations

import torch

import kiln


class Coded(Exception):
    def __init__(self, code):
        super().__init__(f"code {code}")
        self.code = code


def _reads_context(x):
    try:
        raise ValueError("inner")
    except ValueError as e:
        return x + 1, type(e.__context__).__name__


def _returns_exception(x):
    try:
        raise ValueError("inner")
    except ValueError as e:
        return x + 1, e


def _in_handler(fn, *args):
    try:
        raise KeyError("the caller's")
    except KeyError:
        return fn(*args)


def test_context_read_in_the_frame_is_the_callers() -> None:
    kiln.reset()
    compiled = kiln.compile(_reads_context, backend="eager")
    x = torch.ones(2)
    assert _in_handler(compiled, x)[1] == _in_handler(_reads_context, x)[1] == "KeyError"


def test_compiled_outside_a_handler_then_called_in_one() -> None:
    kiln.reset()
    compiled = kiln.compile(_reads_context, backend="eager")
    x = torch.ones(2)
    assert compiled(x)[1] == "NoneType"
    assert _in_handler(compiled, x)[1] == "KeyError"
    assert compiled(x)[1] == "NoneType"


def test_a_returned_exception_has_a_traceback_and_the_callers_context() -> None:
    kiln.reset()
    compiled = kiln.compile(_returns_exception, backend="eager", fullgraph=True)
    _, e = compiled(torch.ones(2))
    assert e.__traceback__ is not None and e.__context__ is None and e.args == ("inner",)
    _, e = _in_handler(compiled, torch.ones(2))
    assert e.__traceback__ is not None and type(e.__context__) is KeyError


def test_an_exception_stored_in_an_argument_has_a_traceback() -> None:
    def f(x, out):
        try:
            raise Coded(3)
        except Coded as e:
            out.append(e)
        return x * 2
    kiln.reset()
    out: list = []
    kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(2), out)
    e = out[0]
    assert type(e) is Coded and e.code == 3 and str(e) == "code 3"
    assert e.__traceback__ is not None


def test_a_chained_exception_keeps_its_chain_and_gets_a_traceback() -> None:
    def f(x):
        try:
            try:
                raise KeyError("first")
            except KeyError as k:
                raise ValueError("second") from k
        except ValueError as e:
            return x + 1, e
    kiln.reset()
    _, e = kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    assert e.__traceback__ is not None and e.__suppress_context__
    assert type(e.__cause__) is KeyError and e.__cause__ is e.__context__
    assert e.__cause__.__traceback__ is not None and e.__cause__.__context__ is None
