"""Guards: what a captured graph assumed about its inputs, compiled into one fast check function.

The tracer records a `Guard` for every fact it relied on (a type, an object's identity, a constant,
a tensor's metadata, grad mode); the ShapeEnv adds its symbolic decisions as Python text. The entry
calls `compile_guards` once per cache entry and gets a `CheckFn`: one generated Python function with
early exit, plus `explain_failure` that names the first failing guard in the user's words.
Corresponds to torch/_dynamo/guards.py (GuardBuilder and the generated check function).

The package, in the order its modules import each other:
  - identity: how identity and type guards hold their objects (weakly where they can die; a freed
    one invalidates the check function and drops its cache entry);
  - kinds: the records (`Guard` and what each kind compares against) and the table of guard kinds;
  - global_kinds: the kinds over process-wide state (grad mode, default dtype and autocast, settings
    the trace asked for, calls whose result is promised constant, aliasing among tensor inputs);
  - native: the tensor kind, checked in one call of the boundary extension where it is built, and
    the switch of check functions made before it loaded;
  - static: the guards another guard of the set fixes (reads of a code object or tuple proven by an
    identity guard; a function's contents at its second identity guard), left out of the function;
  - compile: `compile_guards`, the generated function (`CheckFn`) and `read_source`.
"""
from __future__ import annotations

from kiln.capture.guards.compile import CheckFn, compile_guards, read_source, shape_guard
from kiln.capture.guards.global_kinds import (ConstantCall, GlobalState, ProcessQuery, aliasing_guard,
                                              note_constant_result)
from kiln.capture.guards.kinds import (ABSENT, GUARD_KINDS, PARAMETRIZE_MODULE, Check, ClassAttribute, Emitter,
                                       FunctionCode, Guard, GuardKindFn, ParametrizedClass, TensorSpec,
                                       class_lookup, describe_expected, guard_kind, parametrized_class_holds, user_name)
from kiln.capture.guards.native import native_checks, tensor_guard

__all__ = ["ABSENT", "GUARD_KINDS", "PARAMETRIZE_MODULE", "Check", "CheckFn", "ClassAttribute", "ConstantCall",
           "Emitter", "FunctionCode", "GlobalState", "Guard", "GuardKindFn", "ParametrizedClass", "ProcessQuery",
           "TensorSpec", "aliasing_guard", "class_lookup", "compile_guards", "describe_expected", "guard_kind",
           "native_checks", "note_constant_result", "parametrized_class_holds", "read_source", "shape_guard",
           "tensor_guard", "user_name"]
