"""Python numbers a compiled graph takes or gives as symbols keep eager's values and types under every backend.

An int argument that changed becomes a symbol (automatic dynamic), which a lowered graph takes as an
int64: a value outside int64 stays a constant, and a graph made with the symbol is not reused for
one (its guards bound the symbol). `float(x.shape[0])` is a float whose expression is the size's:
the program gets a float back from a lowered graph too, stored on an object or returned; and a
size divided by an int is eager's int / int, not the lowered product with a rounded reciprocal.
"""
from __future__ import annotations

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def mod_and_floordiv(x, k):
    return x * (k % 7), k // 3, k > 10 ** 18


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_int_argument_beyond_int64_is_never_the_graph_symbol(backend: str) -> None:
    compiled = kiln.compile(mod_and_floordiv, backend=backend)
    x = torch.ones(3)
    # 12 makes k dynamic; 2**70 must not run that graph (it would wrap around in int64: k % 7 was 0)
    for k in (5, 12, 2 ** 70, -(2 ** 66), 9, 2 ** 63 - 1, -(2 ** 63)):
        got, want = compiled(x, k), mod_and_floordiv(x, k)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:], k


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_int_argument_beyond_int64_under_dynamic_true(backend: str) -> None:
    compiled = kiln.compile(mod_and_floordiv, backend=backend, dynamic=True)
    x = torch.ones(3)
    for k in (5, 2 ** 64 + 3, 7):
        got, want = compiled(x, k), mod_and_floordiv(x, k)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:], k


class Holder:
    pass


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_float_of_a_size_is_a_float(backend: str) -> None:
    holder = Holder()

    def f(x):
        holder.size = float(x.shape[0])
        holder.half = x.shape[0] / 2
        holder.third = x.shape[0] / 3  # int / int in Python: a lowered graph gave 5 * 0.333... = 1.6666666666666665
        return x * 2, float(x.shape[0] * 2), (x.shape[0] + 1) / x.shape[0]

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (3, 4, 5):
        x = torch.ones(n)
        got = compiled(x)
        stored = dict(vars(holder))
        want = f(x)
        assert type(got[1]) is float and got[1:] == want[1:]
        assert stored == vars(holder) and all(type(v) is float for v in stored.values()), stored
