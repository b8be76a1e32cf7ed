"""Corpus: views with offsets and aliasing: slices with steps and offsets, narrow/select/unbind/split/
diagonal/as_strided/view_as_real views written in place, inputs that alias each other or are views
themselves, buffers updated through views, a shifted in-place read of its own memory (eager's error),
an in-place op on a tensor saved for the backward. Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .program import Program, case, fn_program, t


def _offset_input(n, start=2):
    """A tensor that is itself a view into a larger one, at an offset."""
    base = torch.randn(n + start + 3)
    return base[start:start + n]


@case("views_aliasing")
def step_slice_inplace():
    def f(x):
        x[::2].mul_(3)
        x[1::3].add_(1)
        return x.sum()
    return fn_program(f, (t(9),))


@case("views_aliasing")
def narrow_inplace_return_view():
    def f(x):
        v = x.narrow(1, 1, 2)
        v.add_(10)
        return v
    return fn_program(f, (t(3, 4),))


@case("views_aliasing")
def select_copy_into_input():
    def f(x, y):
        x.select(0, 1).copy_(y)
        return x * 1
    return fn_program(f, (t(3, 4), t(4)))


@case("views_aliasing")
def unbind_inplace():
    def f(x):
        a, b = x.unbind(0)
        a.add_(b)
        return x
    return fn_program(f, (t(2, 3),))


@case("views_aliasing")
def split_chunk_inplace():
    def f(x):
        parts = x.split(2, dim=0)
        parts[1].zero_()
        c = x.chunk(3, dim=1)
        c[-1].fill_(7.0)
        return x
    return fn_program(f, (t(5, 6),))


@case("views_aliasing")
def diagonal_inplace():
    def f(x):
        x.diagonal().fill_(0)
        x.diagonal(offset=1).add_(5)
        return x.clone()
    return fn_program(f, (t(4, 4),))


@case("views_aliasing")
def as_strided_read_and_inplace():
    def f(x):
        a = x.as_strided((2, 2), (1, 2), 1)
        b = a * 2
        a.mul_(0.5)
        return b, x
    return fn_program(f, (t(8),))


@case("views_aliasing")
def view_as_real_inplace():
    def f(z):
        r = torch.view_as_real(z)
        r[..., 0].mul_(2)
        return z * 1
    return fn_program(f, (torch.randn(3, dtype=torch.complex64),))


@case("views_aliasing")
def index_put_into_view():
    def f(x, idx, v):
        x[1:].index_put_((idx,), v)
        return x
    return fn_program(f, (t(5), torch.tensor([0, 2]), torch.tensor([9.0, 8.0])))


@case("views_aliasing")
def aliasing_inputs_overlap():
    def f(a, b):
        b.mul_(2)
        return a + 1
    x = t(5)
    return fn_program(f, (x, x[1:]), (x, x[1:]))


@case("views_aliasing")
def buffer_inplace_through_view():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.zeros(6))

        def forward(self, x):
            self.buf[2:4].add_(x.sum())
            self.buf.view(2, 3)[1].mul_(2)
            return x + self.buf[:3]
    return Program(M(), ((t(3),), (t(3),)))


@case("views_aliasing")
def view_chain_offsets():
    def f(x):
        y = x.view(4, 6)[1:3].reshape(-1)[2:8:2]
        y.add_(100)
        return x, y
    return fn_program(f, (t(24),))


@case("views_aliasing")
def out_variant_into_view():
    def f(x, a, b):
        torch.add(a, b, out=x[1:3])
        return x
    return fn_program(f, (t(5), t(2), t(2)))


@case("views_aliasing")
def input_is_offset_view_mutated():
    def f(x):
        x.mul_(2)
        return x + 1
    return fn_program(f, (_offset_input(5),), (_offset_input(5, 1),))


@case("views_aliasing")
def aliased_inputs_both_mutated():
    def f(a, b):
        a.add_(1)
        b.mul_(2)
        return a.sum() + b.sum()
    base = t(6)
    return fn_program(f, (base[:4], base[2:]))


@case("views_aliasing")
def chained_inplace_on_aliases_of_buffer():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(2, 4))

        def forward(self, x):
            s = self.state
            s[0].copy_(x)
            s[1].add_(s[0])
            self.state.t()[0].mul_(3)
            return s.sum(1)
    return Program(M(), ((t(4),), (t(4),), (t(4),)))


@case("views_aliasing")
def setitem_views_in_loop_dynamic():
    def f(x):
        for i in range(1, x.shape[0]):
            x[i] = x[i] + x[i - 1]
        return x
    return fn_program(f, (t(3),), (t(4),), (t(5),))


@case("views_aliasing")
def alias_inputs_then_distinct():
    def f(a, b):
        a.mul_(2)
        return a + b
    x = t(4)
    return fn_program(f, (x, x), (t(4), t(4)), (x, x))


@case("views_aliasing", fullgraph=False)
def inplace_on_tensor_saved_for_backward():
    def drive(subject):
        x = torch.randn(3, requires_grad=True)
        try:
            y = subject(x)
            y.sum().backward()
            return "ok", x.grad
        except RuntimeError as e:
            return "raised", type(e).__name__
    def f(x):
        a = x * 2
        b = a.sigmoid()
        b.mul_(2)  # sigmoid saved its output: backward must raise
        return b
    return Program(f, drive=drive)


@case("views_aliasing")
def inplace_view_input_requires_grad_backward():
    def drive(subject):
        x = torch.randn(4, 3, requires_grad=True)
        out = subject(x)
        out.sum().backward()
        return out, x.grad
    def f(x):
        y = x.clone()
        y[:, 1:].mul_(2)
        y.t()[0].add_(x[:, 2])
        return y * y
    return Program(f, drive=drive)


@case("views_aliasing")
def copy_into_noncontig_input():
    def f(x, y):
        x.copy_(y)
        return x.stride(), x.sum()
    return fn_program(f, (t(3, 4).t(), t(4, 3)))


@case("views_aliasing", fullgraph=False)
def shifted_inplace_read_of_own_memory_raises():
    # eager refuses x[:n-1] += x[1:] (the read and the write overlap, shifted); x[0] = x[1] is fine
    def f(x):
        n = x.shape[0]
        x[0] = x[1]
        x[: n - 1] += x[1:]
        return x
    return fn_program(f, (t(4),), (t(5),))


@case("views_aliasing", fullgraph=False)
def transpose_added_into_itself_raises():
    def f(m):
        y = m * 1
        y.add_(y.t())
        return y
    return fn_program(f, (t(3, 3),))
