"""Corpus: graph breaks (print, .item(), data-dependent if, tolist, nonzero, explicit graph_break,
unsupported calls) with side effects before and after them: list appends, attribute and global
writes, dict updates, in-place tensor updates; breaks inside loops, with blocks, try blocks and
callees. All run under fullgraph=False: values and side effects must equal eager's, in order.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from .program import Program, case, fn_program, t

STATE = {"n": 0}
TOTAL = 0


def _reset_total():
    global TOTAL
    TOTAL = 0


def _noisy(v):
    print("noisy", v.shape)
    return v * 2


@case("graph_breaks", fullgraph=False)
def print_between_tensor_ops():
    def f(x):
        y = x * 2
        print("middle")
        return y + 1
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def item_drives_python_branch():
    def f(x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1
    return fn_program(f, (torch.ones(2),), (-torch.ones(2),))


@case("graph_breaks", fullgraph=False)
def data_dependent_if_on_tensor():
    def f(x):
        y = x.sin()
        if y.mean() > 0:
            return y * 2
        return y / 2
    return fn_program(f, (torch.ones(3),), (-torch.ones(3),))


@case("graph_breaks", fullgraph=False)
def list_append_before_and_after_break():
    def f(x, log):
        log.append(x.shape[0])
        y = x + 1
        print("break")
        log.append(y.shape[0] + 1)
        return y * 2
    log = []
    return Program(f, ((t(2), log), (t(2), log)), observe=lambda: list(log))


@case("graph_breaks", fullgraph=False)
def attribute_write_before_break_read_after():
    class Obj:
        def __init__(self):
            self.value = 0

    def f(x, obj):
        obj.value = obj.value + 1
        y = x * obj.value
        print("break")
        obj.value = obj.value * 10
        return y + obj.value
    obj = Obj()
    return Program(f, ((t(2), obj), (t(2), obj)), observe=lambda: obj.value)


@case("graph_breaks", fullgraph=False)
def global_write_before_and_after_break():
    def f(x):
        global TOTAL
        TOTAL += 1
        y = x + TOTAL
        print("break")
        TOTAL += 10
        return y * TOTAL
    _reset_total()
    return Program(f, ((t(2),), (t(2),)), observe=lambda: TOTAL)


@case("graph_breaks", fullgraph=False)
def dict_update_across_break():
    def f(x):
        STATE["n"] += 1
        y = x * STATE["n"]
        print("break")
        STATE["last"] = y.shape[0]
        return y
    STATE.clear()
    STATE["n"] = 0
    return Program(f, ((t(2),), (t(3),)), observe=lambda: dict(STATE))


@case("graph_breaks", fullgraph=False)
def in_place_update_before_break():
    def f(x):
        x.add_(1)
        print("break")
        x.mul_(2)
        return x.sum()
    return fn_program(f, (t(3),))


@case("graph_breaks", fullgraph=False)
def break_in_callee():
    def f(x):
        a = x + 1
        b = _noisy(a)
        return b - 1
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_in_nested_callee_with_locals():
    def g(v, k):
        w = v * k
        print("deep", k)
        return w + k

    def h(v):
        return g(v, 2) + g(v, 3)

    def f(x):
        s = x.sum()
        return h(x) * s
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_inside_loop():
    def f(x):
        for k in range(3):
            x = x * 2
            print("iter", k)
            x = x + k
        return x
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_inside_with_no_grad():
    def f(x):
        with torch.no_grad():
            y = x * 2
            print("inside")
            z = y + 1
        return z, z.requires_grad, (x * 2).requires_grad
    return fn_program(f, (t(2, requires_grad=True),))


@case("graph_breaks", fullgraph=False)
def break_inside_try_finally():
    def f(x, log):
        try:
            y = x + 1
            print("inside try")
            return y * 2
        finally:
            log.append("finally")
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("graph_breaks", fullgraph=False)
def tolist_then_python_arithmetic():
    def f(x):
        values = x.tolist()
        return x * sum(values), values
    return fn_program(f, (torch.tensor([1.0, 2.0, 3.0]),))


@case("graph_breaks", fullgraph=False)
def item_value_used_as_scale():
    def f(x):
        s = x.max().item()
        return x / s
    return fn_program(f, (t(4),))


@case("graph_breaks", fullgraph=False)
def nonzero_data_dependent_shape():
    def f(x):
        idx = torch.nonzero(x > 0)
        return idx.shape[0], x[x > 0].sum()
    return fn_program(f, (torch.tensor([1.0, -1.0, 2.0]),))


@case("graph_breaks", fullgraph=False)
def explicit_graph_break_call():
    def f(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_then_return_container_of_pre_and_post():
    def f(x):
        before = [x + 1, {"k": x * 2}]
        print("break")
        after = (x - 1, before[1]["k"] + 1)
        return before, after
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_with_closure_cells_modified():
    def f(x):
        count = 0

        def bump():
            nonlocal count
            count += 1

        bump()
        print("break")
        bump()
        return x * count
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def module_with_print_in_forward():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            h = self.lin(x)
            print("forward", self.calls)
            return h.relu()
    return Program(Net(), ((t(2),), (t(2),)))


@case("graph_breaks", fullgraph=False)
def data_dependent_while_loop():
    def f(x):
        steps = 0
        while x.sum() < 10:
            x = x * 2
            steps += 1
        return x, steps
    return fn_program(f, (torch.ones(2),))


@case("graph_breaks", fullgraph=False)
def unsupported_builtin_call_then_more_work():
    def f(x):
        y = x + 1
        limit = sys.getrecursionlimit()
        return y * (limit > 10)
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_in_loop_appending_to_list():
    def f(x):
        outs = []
        for k in range(3):
            outs.append(x * k)
            if k == 1:
                print("halfway", len(outs))
        return torch.stack(outs)
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_with_generator_alive():
    def f(x):
        gen = (x * k for k in range(3))
        first = next(gen)
        print("break")
        return first + next(gen)
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def item_in_fstring_after_work():
    def f(x):
        y = x * 3
        msg = f"total={y.sum().item():.3f}"
        return y, msg
    return fn_program(f, (torch.ones(2),))


@case("graph_breaks", fullgraph=False)
def numpy_call_on_tensor_then_back():
    def f(x):
        arr = x.numpy()
        scaled = np.clip(arr, -0.5, 0.5)
        return torch.from_numpy(scaled) + x
    return fn_program(f, (t(4),))


@case("graph_breaks", fullgraph=False)
def break_after_return_value_computed_of_object():
    class Acc:
        def __init__(self):
            self.items = []

    def f(x, acc):
        acc.items.append(x + 1)
        print("break", len(acc.items))
        acc.items.append(x + 2)
        return len(acc.items)
    acc = Acc()
    return Program(f, ((t(2), acc),), observe=lambda: list(acc.items))


@case("graph_breaks", fullgraph=False)
def break_in_both_branches_of_python_if():
    def f(x, flag):
        if flag:
            print("yes")
            y = x + 1
        else:
            print("no")
            y = x - 1
        return y * 2
    return fn_program(f, (t(2), True), (t(2), False))


@case("graph_breaks", fullgraph=False)
def item_to_int_then_range():
    def f(x, n):
        k = int(n.item())
        out = x
        for _ in range(k):
            out = out + 1
        return out
    return fn_program(f, (t(2), torch.tensor(3)))


@case("graph_breaks", fullgraph=False)
def tensor_bool_in_assert():
    def f(x):
        assert (x > -100).all(), "values out of range"
        return x * 2
    return fn_program(f, (t(3),))


@case("graph_breaks", fullgraph=False)
def side_effect_in_callee_before_break_in_caller():
    def record(log, v):
        log.append(v.shape)
        return v + 1

    def f(x, log):
        y = record(log, x)
        print("break")
        z = record(log, y)
        return z
    log = []
    return Program(f, ((t(2), log),), observe=lambda: list(log))


@case("graph_breaks", fullgraph=False)
def many_breaks_in_sequence():
    def f(x):
        for k in range(4):
            x = x + k
            print(k)
        return x
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def break_with_live_dict_view():
    def f(x):
        d = {"a": x}
        keys = d.keys()
        print("break")
        d["b"] = x + 1
        return len(keys), d["b"]
    return fn_program(f, (t(2),))


@case("graph_breaks", fullgraph=False)
def container_built_before_break_popped_after():
    def f(x, y):
        table = {"a": y, "b": x}
        print("break")
        first = table.pop("a")
        return first, table
    return fn_program(f, (t(2), t(2)))


@case("graph_breaks", fullgraph=False)
def list_built_before_break_popped_after():
    def f(x, y):
        items = [y, x, y * 2]
        if x.sum() > 0:
            x = x + 1
        last = items.pop()
        return last, items, x
    return fn_program(f, (torch.ones(2), t(2)))


@case("graph_breaks", fullgraph=False)
def list_grown_after_break_then_popped():
    def f(x, y):
        items = [y, x]
        print("break")
        items.insert(0, x * 10)
        last = items.pop()
        return last, len(items)
    return fn_program(f, (t(2), t(2)))


# bool(tensor) breaks; its result, stored by the resume function, is read only after the next
# break: the resume between them must not be specialized on it (a recompile per value where
# torch.compile reuses the graph: 6 graphs for its 5).

@case("graph_breaks", fullgraph=False, counts=True)
def bool_of_tensor_carried_to_the_next_break():
    def f(x, y):
        pos = bool((x > 0).all())
        neg = not bool((y > 0).any())
        return x * 2 if (pos and neg) else y * 3
    ones = torch.ones(3)
    return fn_program(f, (ones, -ones), (ones, ones), (-ones, -ones), (-ones, ones))


@case("graph_breaks", fullgraph=False, counts=True)
def flags_of_tensors_collected_across_breaks():
    def f(x):
        first = bool(x[0] > 0)
        y = x * 2
        second = bool(y[1] > 0)
        z = y + 1
        third = bool(z[2] > 0)
        return z * (int(first) + 2 * int(second) + 4 * int(third))
    return fn_program(f, (torch.tensor([1.0, 1.0, 1.0]),), (torch.tensor([-1.0, 1.0, 1.0]),),
                      (torch.tensor([1.0, -1.0, 1.0]),), (torch.tensor([-1.0, -1.0, -3.0]),))


@case("graph_breaks", fullgraph=False, counts=True)
def class_statement_in_the_frame_breaks_there():
    # LOAD_BUILD_CLASS: the class is built natively at a break; the tensor code after it (a caught
    # exception of the new class, a method closing over a frame local) is still compiled, where the
    # whole frame used to run eagerly
    def f(x):
        scale = x.shape[0]

        class Shape(LookupError):
            def scaled(self, v):
                return v * scale

        try:
            raise Shape("s")
        except LookupError as e:
            return e.scaled(x) + 1, type(e).__name__
    return fn_program(f, (t(3),), (t(3),))


@case("graph_breaks", fullgraph=False)
def class_statement_in_a_loop_after_tensor_code():
    # (torch.compile runs this frame eagerly: a break inside a loop; Kiln resumes after each class)
    def f(x):
        out = []
        y = x.sin()
        for i in range(2):
            class Step:
                k = i + 1
            out.append(y * Step.k)
        return out
    return fn_program(f, (t(3),))
