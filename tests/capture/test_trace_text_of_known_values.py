"""Values known at trace time that capture folds: `sep.join(...)` of a generator or map over sizes or
constants, and sys.version_info (a structseq Python cannot build) compared, indexed and sliced."""
from __future__ import annotations

import sys

import torch

from trace_oracle import check_traced, fresh

X = torch.ones(2, 3, 4)


def test_join_of_a_generator_over_the_shape() -> None:
    def f(x):
        return x.flatten(), "x".join(str(s) for s in x.shape)
    check_traced(f, fresh(X))


def test_join_of_a_list_comprehension_map_and_range() -> None:
    def f(x, n):
        return (x * n, "-".join([str(d) for d in x.shape]), ",".join(map(str, x.shape)),
                ":".join(str(i) for i in range(n)), b"".join([b"a", b"b"]))
    check_traced(f, fresh(X, 3))


def test_join_of_names_picked_by_a_condition() -> None:
    def f(x):
        names = {"a": 1, "b": 2, "c": 3}
        return x + len("/".join(k for k, v in names.items() if v > 1))
    check_traced(f, fresh(X))


def test_sys_version_info_compared_indexed_and_sliced() -> None:
    def f(x):
        key = sys.intern("na" + "me")
        newer = sys.version_info >= (3, 8)
        return x + (1 if key == "name" else 0), newer, sys.version_info[:2], sys.version_info.major
    check_traced(f, fresh(X))
