"""A part of a concatenation is evaluated (loaded, index-checked) only where the output takes it.

A fused cat computes each output element from the one input it comes from; the kernel used to
evaluate the last input everywhere, so `torch.cat([x, y.gather(1, i)], 1)` read `i` at positions
that belong to `x` (before `i` starts: an out-of-bounds read) and failed its bounds check there
(`gather(): index 139947214373888 is out of bounds`; a transformers BigBird attention layer raised
this way). Checked against eager: cat of gathered values (gather, index_select, x[i], take,
take_along_dim, embedding) in every position along every dim, stack, pad and where of such values, a
reduction over a cat, dynamic shapes, the BigBird chain (stack -> to(int64) -> expand -> gather ->
cat), the Triton code generator; and, in a subprocess, a plain cat whose last input starts right
after a page that may not be read (the old kernel read before it and died with SIGSEGV).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = pytest.mark.cpp


def _compare(fn, *args, dynamic=None) -> None:
    expected = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn: the kernels must answer
        got = kiln.compile(fn, dynamic=dynamic)(*args)
    assert kiln.stats()["fallbacks"] == 0
    torch.testing.assert_close(got, expected)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()
    torch.manual_seed(0)


def _gathered(kind: str, dim: int):
    """(fn(y, i) -> a [4, 6, 5]-shaped tensor made by an indexing op along `dim`, y, i)"""
    y = torch.randn(4, 6, 5)
    if kind == "gather":
        sizes = [4, 6, 5]
        i = torch.randint(0, y.shape[dim], sizes)
        return (lambda y, i: y.gather(dim, i)), y, i
    if kind == "index_select":
        i = torch.randint(0, y.shape[dim], (y.shape[dim],))
        return (lambda y, i: y.index_select(dim, i)), y, i
    if kind == "take_along_dim":
        i = torch.randint(0, y.shape[dim], y.shape)
        return (lambda y, i: torch.take_along_dim(y, i, dim)), y, i
    if kind == "take":
        i = torch.randint(0, y.numel(), y.shape)
        return (lambda y, i: torch.take(y, i)), y, i
    assert kind == "index"
    i = torch.randint(0, y.shape[dim], (y.shape[dim],))
    return (lambda y, i: y[(slice(None),) * dim + (i,)]), y, i


@pytest.mark.parametrize("kind", ["gather", "index_select", "take_along_dim", "take", "index"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat_with_a_gathered_part(kind, dim) -> None:
    op, y, i = _gathered(kind, dim)
    sizes = list(op(y, i).shape)
    sizes[dim] = 7
    x = torch.randn(sizes)
    _compare(lambda x, y, i: torch.cat([x, op(y, i)], dim), x, y, i)  # gathered last
    kiln.reset()
    _compare(lambda x, y, i: torch.cat([op(y, i), x, op(y, i) * 2], dim) + 1, x, y, i)  # first and last


def test_embedding_and_stack_and_pad_and_where_of_gathered_values() -> None:
    table, ids = torch.randn(10, 8), torch.randint(0, 10, (3, 5))
    _compare(lambda t, i, x: torch.cat([x, F.embedding(i, t)], 1), table, ids, torch.randn(3, 9, 8))
    kiln.reset()
    y, i = torch.randn(5, 8), torch.randint(0, 5, (3, 8))
    _compare(lambda y, i, x: torch.stack([x, y.gather(0, i)], 1), y, i, torch.randn(3, 8))
    kiln.reset()
    _compare(lambda y, i: F.pad(y.gather(0, i), (2, 3, 1, 1), value=-1.0), y, i)
    kiln.reset()
    _compare(lambda y, i, x: torch.where(x > 0, x, y[i[0]]), y, i, torch.randn(8, 8))
    kiln.reset()
    _compare(lambda y, i, x: torch.cat([x, y.gather(0, i)]).sum(0), y, i, torch.randn(6, 8))


def test_indices_valid_only_in_their_own_part() -> None:
    # the gathered part's indices are in range; the positions before it would read `i` out of its
    # bounds or, shifted, index values that are not indices at all
    y = torch.randn(64, 5)
    i = torch.randint(0, 5, (64, 2))
    x = torch.randn(64, 300)
    _compare(lambda x, y, i: torch.cat([x, y.gather(1, i)], 1), x, y, i)
    kiln.reset()
    _compare(lambda x, y, i: torch.cat([x, y.gather(1, i)], 1), x, y, i, dynamic=True)


def test_big_bird_chain() -> None:
    # block-sparse attention's random-block gather: stack -> to(int64) -> expand -> gather -> cat
    def attend(blocks, rand_a, rand_b, first):
        rand = torch.stack([rand_a, rand_b], 1).to(torch.int64)  # [heads, 2, r]
        index = rand.flatten(1)[:, :, None].expand(-1, -1, blocks.shape[-1])
        gathered = torch.gather(blocks, 1, index)
        return torch.cat([first, gathered], 1)

    heads, n, d = 4, 13, 16
    blocks = torch.randn(heads, n, d)
    rand_a = torch.randint(0, n, (heads, 3), dtype=torch.int32)
    rand_b = torch.randint(0, n, (heads, 3), dtype=torch.int32)
    _compare(attend, blocks, rand_a, rand_b, torch.randn(heads, 150, d))


def test_out_of_range_index_in_the_taken_part_still_raises() -> None:
    y, x = torch.randn(5, 8), torch.randn(3, 8)
    bad = torch.tensor([[0] * 8, [5] * 8])
    fn = lambda x, y, i: torch.cat([x, y.gather(0, i)])  # noqa: E731
    with pytest.raises(RuntimeError) as eager:
        fn(x, y, bad)
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(fn)(x, y, bad)
    assert str(eager.value) in str(compiled.value)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("dim", [0, 1])
def test_triton_evaluates_only_the_taken_part(dim) -> None:
    pytest.importorskip("triton")
    with config.patch(cpu_backend="triton"):
        op, y, i = _gathered("gather", dim)
        sizes = list(op(y, i).shape)
        sizes[dim] = 7
        _compare(lambda x, y, i: torch.cat([x, op(y, i)], dim), torch.randn(sizes), y, i)
        kiln.reset()
        _compare(lambda x, y, i: torch.cat([op(y, i), x], dim), torch.randn(sizes), y, i)


GUARD_PAGE = r'''
import ctypes, mmap
import numpy as np
import torch
import kiln

page = mmap.PAGESIZE
rows, cols = 64, 4096
memory = mmap.mmap(-1, page + rows * cols * 4)
start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
ctypes.CDLL(None).mprotect(ctypes.c_void_p(start), page, 0)  # the page before b: any read kills us
b = torch.from_numpy(np.frombuffer(memory, dtype=np.float32, offset=page, count=rows * cols)).view(rows, cols)
b.copy_(torch.randn(rows, cols))
a = torch.randn(rows, cols)
i = torch.randint(0, cols, (rows, 8))
out = kiln.compile(lambda a, b: torch.cat([a, b], 1))(a, b)
assert torch.equal(out, torch.cat([a, b], 1))
out = kiln.compile(lambda a, b, i: torch.cat([a, b.gather(1, i)], 1))(a, b, i)
assert torch.equal(out, torch.cat([a, b.gather(1, i)], 1))
print("ok")
'''


def test_no_read_before_the_last_part() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(GUARD_PAGE)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])
