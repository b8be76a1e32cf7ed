"""Corpus: recompiles and guards: what changes between calls (globals, closures, shapes, dtypes,
requires_grad, grad mode, container contents and lengths, object and class attributes, argument
types, None-ness, strings) must be seen by the next call, with torch.compile's number of graphs.

Cases with counts=True also require Kiln's graph count to equal torch.compile's. Each runs under
fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import math

import torch

from .program import Program, case, t

FLAG = True
LIMIT = 3
TABLE = [1, 2]


def _set_flag(value):
    global FLAG
    FLAG = value


def _set_limit(value):
    global LIMIT
    LIMIT = value


@case("recompiles", counts=True)
def global_bool_flag_flipped():
    def f(x):
        if FLAG:
            return x + 1
        return x - 1

    _set_flag(True)
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=lambda _, i: _set_flag(i % 2 == 0))


@case("recompiles", counts=True)
def global_int_loop_bound_changed():
    def f(x):
        for _ in range(LIMIT):
            x = x * 2
        return x

    _set_limit(3)
    return Program(f, ((t(2),), (t(2),)), between=lambda _, i: _set_limit(4))


@case("recompiles", counts=True)
def global_list_appended_between_calls():
    def f(x):
        return x * sum(TABLE) + len(TABLE)

    TABLE[:] = [1, 2]
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=lambda _, i: TABLE.append(i))


@case("recompiles", counts=True)
def global_list_item_replaced():
    def f(x):
        return x * TABLE[0]

    TABLE[:] = [1, 2]

    def replace(_, i):
        TABLE[0] = 10 * i
    return Program(f, ((t(2),), (t(2),)), between=replace)


@case("recompiles", counts=True)
def shape_change_then_same_shape():
    def f(x):
        return x * 2 + x.shape[0]
    return Program(f, ((t(2),), (t(3),), (t(4),), (t(5),)))


@case("recompiles", counts=True)
def rank_change():
    def f(x):
        return x.sum(-1) + x.dim()
    return Program(f, ((t(2),), (t(2, 3),), (t(2, 3, 4),)))


@case("recompiles", counts=True)
def dtype_change():
    def f(x):
        return x + 1
    return Program(f, ((t(2),), (t(2, dtype=torch.float64),), (t(2, dtype=torch.int64),), (t(2),)))


@case("recompiles", counts=True)
def requires_grad_change():
    def f(x):
        return x * 3, (x * 3).requires_grad
    return Program(f, ((t(2),), (t(2, requires_grad=True),), (t(2),)))


@case("recompiles", counts=True)
def grad_mode_change_at_call_site():
    def f(x):
        return x * 2

    def toggle(_, i):
        torch.set_grad_enabled(i % 2 == 0)
    return Program(f, ((t(2, requires_grad=True),), (t(2, requires_grad=True),), (t(2, requires_grad=True),)),
                   between=toggle)


@case("recompiles", counts=True)
def int_argument_changes():
    def f(x, n):
        return x * n
    return Program(f, ((t(2), 2), (t(2), 3), (t(2), 4), (t(2), 5)))


@case("recompiles", counts=True)
def float_argument_changes():
    def f(x, s):
        return x * s
    return Program(f, ((t(2), 0.5), (t(2), 1.5), (t(2), 2.5)))


@case("recompiles", counts=True)
def bool_argument_changes():
    def f(x, flag):
        return x + 1 if flag else x - 1
    return Program(f, ((t(2), True), (t(2), False), (t(2), True)))


@case("recompiles", counts=True)
def string_argument_changes():
    def f(x, mode):
        return x.relu() if mode == "relu" else x.tanh()
    return Program(f, ((t(2), "relu"), (t(2), "tanh"), (t(2), "relu")))


@case("recompiles", counts=True)
def none_then_tensor_argument():
    def f(x, bias):
        if bias is None:
            return x
        return x + bias
    return Program(f, ((t(2), None), (t(2), t(2)), (t(2), None)))


@case("recompiles", counts=True)
def list_argument_length_changes():
    def f(xs):
        return sum(xs)
    return Program(f, (([t(2), t(2)],), ([t(2), t(2), t(2)],), ([t(2), t(2)],)))


@case("recompiles", counts=True)
def tuple_of_ints_argument_changes():
    def f(x, shape):
        return x.reshape(shape)
    return Program(f, ((t(6), (2, 3)), (t(6), (3, 2)), (t(6), (2, 3))))


@case("recompiles", counts=True)
def dict_argument_keys_change():
    def f(d):
        return sum(d.values())
    return Program(f, (({"a": t(2)},), ({"a": t(2), "b": t(2)},), ({"b": t(2)},)))


@case("recompiles", counts=True)
def dict_argument_same_keys_new_values():
    def f(d):
        return d["a"] * d["k"]
    return Program(f, (({"a": t(2), "k": 2},), ({"a": t(2), "k": 2},), ({"a": t(2), "k": 3},)))


@case("recompiles", counts=True)
def object_attribute_changed_between_calls():
    class Cfg:
        def __init__(self):
            self.depth = 1

    cfg = Cfg()

    def f(x):
        for _ in range(cfg.depth):
            x = x + 1
        return x

    def deepen(_, i):
        cfg.depth = 1 + i
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=deepen)


@case("recompiles", counts=True)
def closure_list_mutated_between_calls():
    values = [1.0]

    def f(x):
        return x * values[0] + len(values)

    def change(_, i):
        values.append(2.0)
        values[0] = float(i)
    return Program(f, ((t(2),), (t(2),)), between=change)


@case("recompiles", counts=True)
def same_inputs_many_calls_one_graph():
    def f(x, y):
        return x @ y
    return Program(f, tuple((t(2, 2), t(2, 2)) for _ in range(5)))


@case("recompiles", counts=True)
def argument_type_changes_int_to_float():
    def f(x, k):
        return x + k
    return Program(f, ((t(2), 1), (t(2), 1.5), (t(2), 2)))


@case("recompiles", counts=True)
def argument_type_changes_list_to_tuple():
    def f(x, items):
        return x + len(items) + items[0]
    return Program(f, ((t(2), [1, 2]), (t(2), (1, 2)), (t(2), [3])))


@case("recompiles", counts=True)
def module_training_flag_flipped():
    net = torch.nn.Dropout(0.0)

    def f(x):
        return net(x) + (1 if net.training else 0)

    def flip(_, i):
        net.train(i % 2 == 0)
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=flip)


@case("recompiles", counts=True)
def tensor_attribute_on_object_replaced_same_shape():
    class State:
        def __init__(self):
            self.w = torch.ones(2)

    state = State()

    def f(x):
        return x * state.w

    def swap(_, i):
        state.w = torch.full((2,), float(i + 1))
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=swap)


@case("recompiles", counts=True)
def non_contiguous_input_then_contiguous():
    def f(x):
        return x + 1
    base = t(3, 4)
    return Program(f, ((base,), (base.t(),), (base,)))


@case("recompiles", counts=True)
def size_one_dimension_specialised():
    def f(x):
        return x.sum(0)
    return Program(f, ((t(1, 3),), (t(2, 3),), (t(3, 3),)))


@case("recompiles", counts=True)
def global_tensor_rebound():
    box = {"w": torch.ones(2)}

    def f(x):
        return x + box["w"]

    def rebind(_, i):
        box["w"] = torch.ones(3)
    return Program(f, ((t(2),), (t(3),)), between=rebind)


@case("recompiles", counts=True)
def default_argument_mutated():
    def f(x, acc=[]):  # noqa: B006
        acc.append(1)
        return x * len(acc)
    return Program(f, ((t(2),), (t(2),), (t(2),)))


@case("recompiles", counts=True)
def function_default_replaced_between_calls():
    def f(x, k=2):
        return x * k

    def change(_, i):
        f.__defaults__ = (5,)
    return Program(f, ((t(2),), (t(2),)), between=change)


@case("recompiles", counts=True)
def class_attribute_changed_recompiles():
    class Knob:
        value = 1

    def f(x):
        return x + Knob.value

    def turn(_, i):
        Knob.value = 10 * i
    return Program(f, ((t(2),), (t(2),)), between=turn)


@case("recompiles", counts=True)
def set_argument_contents_change():
    def f(x, names):
        return x + 1 if "a" in names else x - 1
    return Program(f, ((t(2), {"a"}), (t(2), {"b"}), (t(2), {"a", "b"})))


@case("recompiles", counts=True)
def hasattr_answer_changes_after_first_call_adds_attribute():
    class Bag:
        pass

    bag = Bag()

    def f(x):
        out = x * (bag.w if hasattr(bag, "w") else 1.0)
        bag.w = 3.0
        return out
    return Program(f, ((t(2),), (t(2),), (t(2),)), observe=lambda: vars(bag))


@case("recompiles", counts=True)
def getattr_default_changes_after_attribute_added_between_calls():
    class Bag:
        pass

    bag = Bag()

    def f(x):
        return x * getattr(bag, "scale", 2.0)

    def add(_, i):
        bag.scale = 5.0
    return Program(f, ((t(2),), (t(2),)), between=add)


@case("recompiles")
def float_argument_signed_zero():
    # 0.0 == -0.0, but copysign, str() and 1/v tell them apart: a graph traced for one is wrong for the other
    state = {"bias": 0.0}

    def f(x, v, pair):
        return x * math.copysign(1.0, v) + math.copysign(2.0, pair[1]) + math.copysign(3.0, state["bias"]), str(v)

    def between(subject, i):
        state["bias"] = -0.0 if i == 1 else 0.0
    return Program(f, ((t(2), 0.0, (1, 0.0)), (t(2), -0.0, (1, -0.0)), (t(2), -0.0, (1, 0.0))), between=between)


# A tensor indexed by an int argument that became symbolic (the second value seen): the row is
# picked in the graph (select), not by the int's value (Tensor.__getitem__ takes __index__: a guard
# and a recompile per index, 5 graphs where torch.compile makes 2).

@case("recompiles", counts=True)
def tensor_row_picked_by_an_int_modulo():
    def f(x, step):
        return x[step % 4] * 2 + x[(step + 1) % 4]
    table = torch.arange(12.0).reshape(4, 3)
    return Program(f, tuple((table, s) for s in range(7)))


@case("recompiles", counts=True)
def tensor_row_picked_by_a_signed_int():
    def f(x, i):
        return x[i].sum() + x[-1 - i].sum()
    table = torch.arange(10.0).reshape(5, 2)
    return Program(f, tuple((table, i) for i in (0, 1, 3, -2, 2, -5, 4)))


@case("recompiles", counts=True)
def buffer_row_picked_by_a_position_argument():
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.linspace(0, 1, 16).reshape(8, 2))

        def forward(self, x, pos):
            return x + self.table[pos]
    return Program(Positions(), tuple((t(2), p) for p in (0, 3, 5, 7, 2)))
