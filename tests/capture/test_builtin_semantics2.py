"""Builtins and container methods on values known at trace time that eager answers with an
exception or that SymInts cannot do natively (kiln/capture/variables/sequence.py,
number_builtins.py): the exception is raised in the trace where the program's handlers catch it
(not an internal error that runs the whole frame eagerly), the list left as eager leaves it, and
pow(size, k, m) stays in the graph."""
from __future__ import annotations

import collections
import itertools

import pytest
import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _catching(body):
    def f(x, items):
        try:
            body(items)
        except (ValueError, IndexError, TypeError) as error:
            return x - 1, type(error).__name__, str(error)
        return x + 1, None, None
    return f


LIST_BODIES = {
    "extended_slice_too_few": lambda items: items.__setitem__(slice(None, None, 2), [0]),
    "extended_slice_too_many": lambda items: items.__setitem__(slice(1, None, 2), [0, 1, 2]),
    "index_out_of_range": lambda items: items.__setitem__(9, 0),
    "negative_index_out_of_range": lambda items: items.__setitem__(-6, 0),
    "del_out_of_range": lambda items: items.__delitem__(5),
    "del_by_string": lambda items: items.__delitem__("a"),
    "set_by_float": lambda items: items.__setitem__(1.0, 0),
}


@pytest.mark.parametrize("name", list(LIST_BODIES))
def test_list_item_writes_raise_in_the_frame(name: str) -> None:
    check_traced(_catching(LIST_BODIES[name]), fresh(X, [1, 2, 3, 4, 5]))


def test_statement_forms_of_bad_list_writes() -> None:
    def f(x, items):
        caught = []
        try:
            items[::2] = [x]
        except ValueError as error:
            caught.append(str(error))
        try:
            del items[7]
        except IndexError as error:
            caught.append(str(error))
        try:
            items[-9] = x
        except IndexError as error:
            caught.append(str(error))
        items[1::3] = [x * 2, x * 3]
        del items[::-2]
        return x + len(items), caught

    check_traced(f, fresh(X, [1, 2, 3, 4, 5]))


MINMAX_BODIES = {
    "max_mixed": lambda items: max(1, "a"),
    "min_mixed_list": lambda items: min([2, "b", 1]),
    "max_key_mixed": lambda items: max(items, key=lambda v: "s" if v == 2 else v),
    "min_key_none": lambda items: min([1, 2], key=lambda v: None if v == 2 else v),
    "max_of_none": lambda items: max([None, None]),
}


@pytest.mark.parametrize("name", list(MINMAX_BODIES))
def test_min_max_of_incomparable_constants_raise_in_the_frame(name: str) -> None:
    # torch.compile raises an internal error here; eager's TypeError is the program's to catch
    check_traced(_catching(MINMAX_BODIES[name]), fresh(X, [1, 2, 3]), oracle=False)


def test_three_argument_pow_of_a_size_stays_in_one_graph() -> None:
    import kiln

    def f(x):
        n = x.shape[0]
        return x * pow(n, 2, 5) + pow(n, 3, -4), pow(n, 0, 3), pow(n, 1, 7), pow(-n, 3, 10)

    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for size in (7, 9, 12, 3):
        x = torch.arange(float(size))
        got, want = compiled(x), f(x)
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:], (size, got, want)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert backend.frame_count == 1, backend.frame_count


def test_nan_is_found_by_identity_in_containers() -> None:
    # `in`, count and index ask `is` before `==`: a NaN is in a list holding that very float
    def f(x, a, items):
        b = float("nan")
        return x + 1, a in items, b in items, a in [b], items.count(a), items.index(a), a in (1, a)

    import kiln

    nan = float("nan")
    kiln.reset()
    got = kiln.compile(f, backend="eager", fullgraph=True)(X, nan, [nan])
    want = f(X, nan, [nan])
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:] == (True, False, False, 1, 0, True), (got, want)


def test_nan_identity_is_guarded() -> None:
    import kiln

    def f(x, a, items):
        return x + 1, a in items

    nan = float("nan")
    compiled = kiln.compile(f, backend="eager")
    for a, items in ((nan, [nan]), (nan, [float("nan")]), (nan, [nan])):
        assert compiled(X, a, items)[1] == f(X, a, items)[1]


class _Truth:
    def __init__(self, value):
        self.value = value

    def __bool__(self):
        return self.value


class _Sized:
    def __init__(self, value):
        self.value = value

    def __len__(self):
        return self.value


@pytest.mark.parametrize("obj", [_Truth(1), _Truth(None), _Truth(0), _Sized(-1), _Sized(2.0)],
                         ids=["bool_int", "bool_none", "bool_zero", "len_negative", "len_float"])
def test_bad_truth_and_length_results_raise_as_in_eager(obj) -> None:
    def f(x, o):
        caught = []
        try:
            if o:
                x = x + 1
        except (TypeError, ValueError) as error:
            caught.append(str(error))
        try:
            caught.append(not o)
        except (TypeError, ValueError) as error:
            caught.append(str(error))
        return x, caught

    check_traced(f, lambda: (X, obj), oracle=False)


def test_length_beyond_an_index_sized_integer_overflows() -> None:
    def f(x, o):
        try:
            return x + len(o)
        except OverflowError as error:
            return x - 1, str(error)

    check_traced(f, lambda: (X, _Sized(2 ** 70)), oracle=False)


def test_len_of_a_bool_length_is_an_int() -> None:
    def f(x, o):
        n = len(o)
        return x + n, n, type(n).__name__

    check_traced(f, lambda: (X, _Sized(True)), oracle=False)


def test_union_of_mappings_has_eager_type_and_factory() -> None:
    import collections

    def f(x, dd, od):
        e = dd | {"b": [2]}
        e["missing"].append(3)  # a defaultdict still: its factory fills the key
        mixed = {"a": 1} | od  # OrderedDict's __ror__ runs first
        other = od | {"z": 0}
        plain = dict(od) | {"y": 1}
        return x + 1, type(e).__name__, e, type(mixed).__name__, list(mixed.items()), type(other).__name__, type(plain).__name__

    check_traced(f, fresh(X, collections.defaultdict(list, a=[1]), collections.OrderedDict(b=2)), oracle=False)


def test_in_place_union_takes_pairs() -> None:
    def f(x, d):
        d |= [("q", 2)]
        d |= zip("ab", (x, x * 2))
        return d["a"] + d["b"] + d["q"]

    check_traced(f, fresh(X, {"q": 0}))


SEQUENCE_ERRORS = {
    "list_zero_step": lambda x: [1, 2][::0],
    "tuple_zero_step": lambda x: (1, 2)[::0],
    "tuple_out_of_range": lambda x: (1, 2)[5],
    "size_out_of_range": lambda x: x.shape[3],
    "tuple_by_string": lambda x: (1, 2)["a"],
    "islice_negative_stop": lambda x: itertools.islice([1], -1),
    "islice_bad_step": lambda x: itertools.islice([1, 2], 0, None, 0),
    "islice_float_start": lambda x: itertools.islice(iter([1, 2]), 0.5, None),
}


@pytest.mark.parametrize("name", list(SEQUENCE_ERRORS))
def test_sequence_errors_with_eager_text(name: str) -> None:
    body = SEQUENCE_ERRORS[name]

    def f(x):
        try:
            body(x)
        except (ValueError, IndexError, TypeError) as error:
            return x - 1, type(error).__name__, str(error)
        return x + 1, None, None

    check_traced(f, fresh(X), oracle=False)


BUILTIN_ERRORS = {
    "range_zero_step": lambda x: range(1, 2, 0),
    "range_of_float": lambda x: range(1.5),
    "enumerate_string_start": lambda x: enumerate([1], "a"),
    "issubclass_of_instance": lambda x: issubclass(1, int),
    "max_of_nothing": lambda x: max(),
    "min_of_nothing_with_key": lambda x: min(key=len),
    "list_remove_missing": lambda x: [1].remove(2),
    "deque_index_out_of_range": lambda x: collections.deque([1])[3],
    "ordered_dict_popitem_empty": lambda x: collections.OrderedDict().popitem(),
}


@pytest.mark.parametrize("name", list(BUILTIN_ERRORS))
def test_builtin_errors_with_eager_type_and_text(name: str) -> None:
    body = BUILTIN_ERRORS[name]

    def f(x):
        try:
            body(x)
        except (ValueError, IndexError, TypeError, KeyError) as error:
            return x - 1, type(error).__name__, str(error)
        return x + 1, None, None

    check_traced(f, fresh(X), oracle=False)
