"""The loop IR on its own: printer, verifier, index simplification, op table completeness."""
from __future__ import annotations

import pytest
import sympy
import torch

from kiln.lower import ops
from kiln.lower.codegen.cpp import RENDER
from kiln.lower.graph import lower_to_loop_ir
from kiln.lower.ir import (FloorDiv, InputBuffer, Layout, Load, LoopIR, ModularIndexing, Pointwise, format_ir,
                           index_vars, simplify_index, verify_ir)
from kiln.errors import VerificationError
from kiln.lower.schedule import Block, Kernel, KernelProgram, schedule, verify_program

from .conftest import aten_graph


def test_every_loop_op_has_a_cpp_rendering() -> None:
    assert RENDER.missing() == set()


def test_floor_div_and_mod_fold_back() -> None:
    (i,) = index_vars("i", 1)
    assert simplify_index(7 * FloorDiv(i, 7) + ModularIndexing(i, 7)) == i
    assert FloorDiv(3 * i + 6, 3) == i + 2
    assert ModularIndexing(5 * i, 5) == 0


def test_printer_and_verifier_on_lowered_graph() -> None:
    gm, args = aten_graph(lambda x: torch.softmax(x * 2, -1), torch.randn(4, 8))
    ir, hints = lower_to_loop_ir(gm, args)
    verify_ir(ir)
    text = format_ir(ir)
    assert "arg0: float32[4, 8]" in text and "max over [8]" in text and "sum over [8]" in text
    assert hints == []
    assert len(schedule(ir).steps) == 1


def test_verifier_rejects_read_before_write() -> None:
    lay = Layout.contiguous(torch.float32, [sympy.Integer(4)])
    (i,) = index_vars("i", 1)
    bad = Pointwise("buf0", lay, (), ops.op("exp", Load("buf1", i, torch.float32)))
    with pytest.raises(VerificationError, match=r"\[lower_to_loop_ir\] buf0 reads buf1 before it is defined"):
        verify_ir(LoopIR((InputBuffer("arg0", lay, (), 0), bad), (), {}))
    twice = Pointwise("arg0", lay, (), ops.op("exp", Load("arg0", i, torch.float32)))
    with pytest.raises(VerificationError, match="arg0 is defined twice"):
        verify_ir(LoopIR((InputBuffer("arg0", lay, (), 0), twice), (), {}))


def test_program_verifier_accepts_the_schedule_and_rejects_broken_ones() -> None:
    gm, args = aten_graph(lambda x: torch.softmax(x * 2, -1) + 1, torch.randn(4, 8))
    ir, _ = lower_to_loop_ir(gm, args)
    program = schedule(ir)
    verify_program(program)
    (kernel,) = program.steps
    assert isinstance(kernel, Kernel)
    dropped = Kernel(kernel.name, kernel.outer, kernel.inner, kernel.blocks[:-1], frozenset(), frozenset())
    with pytest.raises(VerificationError, match=r"\[schedule\] no step makes"):
        verify_program(KernelProgram(ir, (dropped,)))
    reversed_nodes = tuple(Block(b.kind, b.nodes[::-1]) for b in kernel.blocks[::-1])
    backwards = Kernel(kernel.name, kernel.outer, kernel.inner, reversed_nodes)
    with pytest.raises(VerificationError, match="before a step makes it"):
        verify_program(KernelProgram(ir, (backwards,)))
    output = next(o.name for o in ir.outputs)
    leaked = Kernel(kernel.name, kernel.outer, kernel.inner, kernel.blocks, frozenset({output}))
    with pytest.raises(VerificationError, match="a graph output"):
        verify_program(KernelProgram(ir, (leaked,)))


def test_ops_check_dtypes() -> None:
    a = ops.constant(1.0, torch.float32)
    b = ops.constant(1, torch.int64)
    with pytest.raises(VerificationError, match="disagree on dtype"):
        ops.op("add", a, b)
    assert ops.op("lt", a, a).dtype == torch.bool
    assert ops.cast(b, torch.float32).dtype == torch.float32
