"""Corpus: lists, tuples, slicing, unpacking, comprehensions, namedtuple and dataclass values.

Programs build, mutate and return containers of tensors and constants inside the frame, take
containers as inputs (mutated in place: the caller must see it), and read them through every
unpacking form CPython has. Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import collections
import dataclasses
import typing

import torch

from .program import Program, case, fn_program, t

Point = collections.namedtuple("Point", ["x", "y"])
Triple = collections.namedtuple("Triple", "a b c", defaults=[0])


class Span(typing.NamedTuple):
    start: torch.Tensor
    width: int = 2

    def end(self) -> torch.Tensor:
        return self.start + self.width


@dataclasses.dataclass
class Box:
    low: torch.Tensor
    high: torch.Tensor
    label: str = "box"

    def size(self) -> torch.Tensor:
        return self.high - self.low


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float
    shift: float = 0.5


@case("containers")
def list_append_extend_pop_insert():
    def f(x):
        items = [x, x + 1]
        items.append(x * 2)
        items.extend([x - 1, x - 2])
        last = items.pop()
        items.insert(1, last)
        first = items.pop(0)
        return items, first, len(items)
    return fn_program(f, (t(4),))


@case("containers")
def list_remove_index_count():
    def f(x):
        names = ["a", "b", "c", "b"]
        names.remove("b")
        where = names.index("b")
        return x * where + names.count("b"), names
    return fn_program(f, (t(3),))


@case("containers")
def list_reverse_and_sort_constants():
    def f(x):
        order = [3, 1, 2]
        order.sort()
        order.reverse()
        backwards = order[::-1]
        return x + order[0] - backwards[0], order, backwards
    return fn_program(f, (t(3),))


@case("containers")
def list_sort_with_key_and_reverse():
    def f(x):
        words = ["ccc", "a", "bb"]
        words.sort(key=len, reverse=True)
        return x * len(words[0]), words
    return fn_program(f, (t(2),))


@case("containers")
def list_of_tensors_mutated_in_place_by_callee():
    def f(xs):
        xs.append(xs[0] + xs[1])
        xs[0] = xs[0] * 2
        del xs[1]
        return len(xs)
    return fn_program(f, ([t(3), t(3)],))


@case("containers")
def list_input_cleared():
    def f(xs, x):
        total = sum(xs)
        xs.clear()
        return total + x
    return fn_program(f, ([t(2), t(2), t(2)], t(2)))


@case("containers")
def list_slice_assignment():
    def f(x):
        values = [x, x + 1, x + 2, x + 3]
        values[1:3] = [x * 10]
        values[::2] = [x - 5, x - 6]
        return values
    return fn_program(f, (t(2),))


@case("containers")
def list_slice_delete_and_negative_index():
    def f(x):
        values = [x * k for k in range(6)]
        del values[1:4]
        del values[-1]
        return values[-1] + values[0], len(values)
    return fn_program(f, (t(3),))


@case("containers")
def list_multiply_and_concatenate():
    def f(x):
        pair = [x] * 2
        more = pair + [x + 1]
        more += (x + 2,)
        more *= 2
        return len(more), more[3] + more[-1]
    return fn_program(f, (t(3),))


@case("containers")
def list_comparison_and_membership():
    def f(x):
        a, b = [1, 2, 3], [1, 2, 4]
        out = x
        if a < b:
            out = out + 1
        if [1, 2] == [1, 2] and 3 in a and 7 not in b:
            out = out * 2
        return out
    return fn_program(f, (t(3),))


@case("containers")
def list_copy_is_independent():
    def f(x):
        base = [x, x + 1]
        copy = base.copy()
        shallow = list(base)
        copy.append(x + 2)
        shallow[0] = x * 5
        return len(base), len(copy), base[0], shallow[0]
    return fn_program(f, (t(3),))


@case("containers")
def nested_list_index_and_mutation():
    def f(x):
        grid = [[x, x + 1], [x + 2, x + 3]]
        grid[1][0] = grid[0][1] * 2
        grid[0].append(x - 1)
        return grid[1][0] + grid[0][2], [len(row) for row in grid]
    return fn_program(f, (t(2),))


@case("containers")
def tuple_concat_slice_count_index():
    def f(x):
        a = (x, 1, 2)
        b = a + (3, x)
        numbers = b[1:4] + (2,)
        return b[1:4], numbers.count(2), numbers.index(3), len(b[::2])
    return fn_program(f, (t(2),))


@case("containers")
def tuple_comparisons_of_constants():
    def f(x):
        out = x
        for left, right in [((1, 2), (1, 3)), ((2,), (1, 9)), ((1, 2), (1, 2))]:
            if left < right:
                out = out + 1
            if left >= right:
                out = out * 2
        return out
    return fn_program(f, (t(2),))


@case("containers")
def star_unpacking_in_assignment():
    def f(x):
        first, *middle, last = [x, x + 1, x + 2, x + 3]
        head, *tail = (x * 2,)
        return first + last, len(middle), middle[1], tail
    return fn_program(f, (t(3),))


@case("containers")
def nested_unpacking_in_for_loop():
    def f(x):
        pairs = [(1, (x, 2)), (3, (x + 1, 4))]
        out = x * 0
        for a, (tensor, b) in pairs:
            out = out + tensor * a + b
        return out
    return fn_program(f, (t(3),))


@case("containers")
def unpacking_into_call_arguments():
    def g(a, b, c=1, *rest, scale=1.0, **extra):
        return (a + b + c) * scale + len(rest) + len(extra)

    def f(x):
        args = [x, x + 1]
        more = {"scale": 2.0, "tag": "t"}
        return g(*args, 3, 4, 5, **more), g(*(x, x), **{"c": 0})
    return fn_program(f, (t(3),))


@case("containers")
def build_list_and_tuple_with_star():
    def f(x, y):
        head = [x, y]
        both = [*head, *(y * 2,), x]
        packed = (*both, 7)
        return len(both), packed[-1], packed[2]
    return fn_program(f, (t(2), t(2)))


@case("containers")
def swap_by_tuple_assignment():
    def f(x, y):
        a, b = x, y
        for _ in range(3):
            a, b = b, a + b
        return a, b
    return fn_program(f, (t(2), t(2)))


@case("containers")
def list_comprehension_with_condition():
    def f(x):
        scaled = [x * k for k in range(5) if k % 2 == 1]
        return torch.stack(scaled), len(scaled)
    return fn_program(f, (t(3),))


@case("containers")
def nested_comprehension_flattens():
    def f(x):
        rows = [[x + i + j for j in range(2)] for i in range(3)]
        flat = [v for row in rows for v in row]
        return sum(flat), len(flat)
    return fn_program(f, (t(2),))


@case("containers")
def dict_and_set_comprehensions():
    def f(x):
        squares = {k: x * k for k in range(3)}
        evens = {k * 2 for k in range(4)}
        return squares[2] + len(evens), sorted(evens)
    return fn_program(f, (t(2),))


@case("containers")
def generator_expression_into_sum_and_tuple():
    def f(x):
        total = sum(x * k for k in range(4))
        parts = tuple(x + k for k in (1, 2))
        return total, parts
    return fn_program(f, (t(3),))


@case("containers")
def comprehension_reads_enclosing_variable():
    def f(x, n):
        offset = n + 1
        return [x + offset * k for k in range(n)]
    return fn_program(f, (t(2), 3))


@case("containers")
def comprehension_over_tensor_rows():
    def f(x):
        rows = [row.sum() for row in x]
        return torch.stack(rows)
    return fn_program(f, (t(3, 4),))


@case("containers")
def namedtuple_fields_replace_asdict():
    def f(x):
        p = Point(x, x + 1)
        q = p._replace(y=x * 3)
        d = q._asdict()
        return q.x + q.y, list(d.keys()), Point._fields, p[1]
    return fn_program(f, (t(3),))


@case("containers")
def namedtuple_input_and_output():
    def f(p):
        return Point(p.y, p.x * 2), p.x + p.y
    return fn_program(f, (Point(t(2), t(2)),))


@case("containers")
def namedtuple_defaults_and_make():
    def f(x):
        a = Triple(x, 1)
        b = Triple._make([x, 2, 3])
        return a.c + b.c, a, len(b)
    return fn_program(f, (t(2),))


@case("containers")
def typing_namedtuple_method_and_default():
    def f(x):
        s = Span(x)
        return s.end(), s.width, s._replace(width=5).end()
    return fn_program(f, (t(3),))


@case("containers")
def namedtuple_unpacks_and_iterates():
    def f(x):
        p = Point(x, x - 1)
        a, b = p
        return a * b, [v + 1 for v in p], isinstance(p, tuple)
    return fn_program(f, (t(2),))


@case("containers")
def dataclass_made_in_frame():
    def f(x):
        box = Box(x, x + 2)
        box.label = "wide"
        return box.size(), box.label
    return fn_program(f, (t(3),))


@case("containers")
def dataclass_input_fields_read():
    def f(box):
        return (box.high - box.low) * 2, box.label
    return fn_program(f, (Box(t(2), t(2), "in"),))


@case("containers")
def dataclass_input_mutated():
    def f(box):
        box.low = box.low - 1
        box.label = box.label + "!"
        return box.size()
    box = Box(t(2), t(2))
    return Program(f, ((box,),), observe=lambda: (box.low, box.label))


@case("containers")
def dataclass_fields_and_replace():
    def f(x):
        frozen = Frozen(2.0)
        other = dataclasses.replace(frozen, shift=1.5)
        names = [field.name for field in dataclasses.fields(frozen)]
        return x * other.scale + other.shift, names
    return fn_program(f, (t(3),))


@case("containers")
def dataclass_equality():
    def f(x):
        if Frozen(1.0) == Frozen(1.0) and Frozen(1.0) != Frozen(2.0):
            return x + 1
        return x - 1
    return fn_program(f, (t(3),))


@case("containers")
def tuple_of_shapes_and_sizes():
    def f(x):
        dims = tuple(x.shape)
        rows, cols = x.shape
        return x.reshape(cols, rows), dims, rows * cols
    return fn_program(f, (t(2, 3),))


@case("containers")
def list_index_with_tensor_size():
    def f(x):
        table = [10, 20, 30, 40]
        return x + table[x.size(0)]
    return fn_program(f, (t(2),))


@case("containers")
def enumerate_and_zip_build_pairs():
    def f(x, y):
        pairs = list(zip([x, y], ["a", "b"]))
        indexed = [(i, name) for i, (_, name) in enumerate(pairs)]
        return pairs[1][0] * 2, indexed
    return fn_program(f, (t(2), t(2)))


@case("containers")
def reversed_and_slice_step():
    def f(x):
        values = [x + k for k in range(5)]
        return list(reversed(values))[0], values[4:0:-2], values[-2:]
    return fn_program(f, (t(2),))


@case("containers")
def slice_objects():
    def f(x):
        window = slice(1, 3)
        return x[window], x[slice(None, None, 2)], [0, 1, 2, 3][window]
    return fn_program(f, (t(5),))


@case("containers")
def list_returned_aliases_input():
    def f(xs):
        xs[0].add_(1)
        return xs
    return fn_program(f, ([t(2), t(2)],))


@case("containers")
def list_of_lists_input_read_and_extended():
    def f(rows, x):
        rows[0].append(x)
        return sum(len(r) for r in rows), rows[1][0] * x
    return fn_program(f, ([[1, 2], [3]], t(2)))


@case("containers")
def tuple_hash_as_dict_key():
    def f(x):
        table = {(1, "a"): 2, (2, "b"): 3}
        key = (1, "a")
        return x * table[key], (2, "b") in table
    return fn_program(f, (t(2),))


@case("containers")
def list_constructor_from_range_and_string():
    def f(x):
        digits = list(range(2, 8, 2))
        letters = list("abc")
        return x + sum(digits), letters, tuple(digits)
    return fn_program(f, (t(2),))


@case("containers")
def mutating_list_while_building_result():
    def f(x):
        queue = [x]
        seen = []
        while queue:
            item = queue.pop()
            seen.append(item)
            if len(seen) < 3:
                queue.append(item + 1)
        return seen
    return fn_program(f, (t(2),))


@case("containers")
def input_list_sorted_in_place_by_key():
    def f(x, names):
        names.sort(key=lambda s: (len(s), s), reverse=True)
        return x * len(names[0])
    names = ["bb", "a", "ccc", "dd"]
    return Program(f, ((t(2), names),), observe=lambda: list(names))


@case("containers")
def tensors_sorted_in_place_by_size():
    def f(a, b, c):
        parts = [a, b, c]
        parts.sort(key=lambda p: p.shape[0])
        return [p.sum() for p in parts], [p.shape[0] for p in parts]
    return fn_program(f, (t(3), t(1), t(2)))


@case("containers")
def sort_key_raises_leaves_list_unchanged():
    def f(x):
        items = [3, "a", 1]
        try:
            items.sort(key=lambda v: v + 0)
        except TypeError:
            return x + 1, items
        return x, items
    return fn_program(f, (t(2),))


@case("containers")
def list_extended_slice_assign_and_del():
    def f(x):
        xs = [x * i for i in range(6)]
        xs[::2] = [x, x, x]
        del xs[1:3]
        xs[-1:] = []
        return torch.stack(xs), len(xs)
    return fn_program(f, (t(2),))


@case("containers")
def nested_input_containers_mutated_in_place():
    def f(x, cfg):
        cfg["layers"][0]["w"] = x * 3
        cfg["layers"].append({"w": x})
        cfg["count"] = len(cfg["layers"])
        return x.sum()
    return fn_program(f, (t(2), {"layers": [{"w": 1}], "count": 1}))


@case("containers")
def same_list_passed_twice_mutated_through_both():
    shared = [1]

    def f(x, a, b):
        a.append(2)
        b.append(3)
        return x * len(a), a is b, list(b)
    return fn_program(f, (t(2), shared, shared))


@case("containers", fullgraph=False)
def input_list_mutated_across_print_break():
    def f(x, xs):
        xs.append(x * 2)
        print("n", len(xs))
        xs.append(x * 3)
        del xs[0]
        return len(xs)
    return fn_program(f, (t(2), [t(2)]))


@case("containers")
def user_eq_objects_in_index_count_of_list():
    # `in`, list.index and list.count with a user __eq__ trace it item by item (a graph break
    # before); a missing item's ValueError is raised where the program catches it
    class P:
        def __init__(self, v):
            self.v = v

        def __eq__(self, o):
            return isinstance(o, P) and self.v == o.v

        __hash__ = None

    def f(x, n):
        ps = [P(1), P(2), P(1)]
        ns = [1, 2, n]
        try:
            missing = ns.index(99)
        except ValueError:
            missing = -1
        return (x * (P(2) in ps), P(5) in ps, ps.index(P(2)), ps.count(P(1)), [x].count(x),
                ns.index(n), missing)
    return fn_program(f, (t(2), 7))
