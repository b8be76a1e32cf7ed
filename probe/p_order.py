import torch
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

def brk():
    torch._dynamo.graph_break()

@case("order")
def od_print_interleaved_with_mutation():
    log = []
    def f(x):
        print("a", len(log))
        log.append(1)
        print("b", len(log))
        y = x + 1
        print("c", y.shape)
        log.append(2)
        return y
    return fn_program(f, (t(2),), (t(2),), observe=lambda: list(log))

@case("order")
def od_print_before_and_after_break():
    def f(x):
        print("start")
        y = x * 2
        brk()
        print("mid", y.shape[0])
        return y + 1
    return fn_program(f, (t(2),))

@case("order")
def od_object_made_in_frame_mutated_across_break():
    class Box:
        pass
    def f(x):
        b = Box()
        b.v = x + 1
        b.items = [1]
        brk()
        b.items.append(2)
        b.v.mul_(2)
        return b
    return fn_program(f, (t(2),))

@case("order")
def od_attribute_tensor_inplace_read_after_break():
    class S:
        pass
    s = S()
    s.t = torch.zeros(2)
    def f(x):
        s.t.add_(x)
        brk()
        return s.t * 2
    return fn_program(f, (t(2),), (t(2),), observe=lambda: s.t)

@case("order")
def od_generator_raising_inside():
    def gen(x):
        yield x
        raise ValueError("gen fail")
    def f(x):
        out = []
        try:
            for v in gen(x):
                out.append(v * 2)
        except ValueError as e:
            out.append(str(e))
        return out
    return fn_program(f, (t(2),))

@case("order")
def od_callee_mutates_caller_dict_then_break():
    def helper(d, x):
        d["a"] = x * 2
        brk()
        d["b"] = d["a"] + 1
    def f(x):
        d = {}
        helper(d, x)
        return d
    return fn_program(f, (t(2),))

@case("order")
def od_global_list_append_in_loop_with_break():
    def f(x):
        for i in range(3):
            OD_LOG.append(i)
            if i == 1:
                brk()
        return x + len(OD_LOG)
    OD_LOG.clear()
    return fn_program(f, (t(2),), (t(2),), observe=lambda: list(OD_LOG))
OD_LOG = []

@case("order")
def od_return_inside_with_after_break():
    log = []
    class C:
        def __enter__(self):
            log.append("in")
        def __exit__(self, *a):
            log.append("out")
    def f(x):
        with C():
            y = x + 1
            brk()
            return y * 2
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("order")
def od_nonlocal_set_by_callee_after_break():
    def f(x):
        state = 0
        def set_state(v):
            nonlocal state
            state = v
        set_state(1)
        brk()
        set_state(state + 10)
        return x * state
    return fn_program(f, (t(2),))

@case("order")
def od_deleted_local_after_break():
    def f(x):
        a = x + 1
        b = x + 2
        del a
        brk()
        try:
            return a
        except NameError:
            return b
    return fn_program(f, (t(2),))

@case("order")
def od_tensor_list_mutated_in_place_with_views_across_break():
    def f(x):
        parts = list(x.split(2))
        parts[0].zero_()
        brk()
        parts[1].fill_(7)
        return x
    return fn_program(f, (t(6),))

@case("order")
def od_module_buffer_mutation_across_break():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))
        def forward(self, x):
            self.n += 1
            brk()
            self.n += 1
            return x * self.n
    return Program(M(), ((t(2),), (t(2),)))

@case("order")
def od_break_inside_comprehension_helper():
    def h(v):
        brk()
        return v + 1
    def f(x):
        return [h(x * i) for i in range(3)]
    return fn_program(f, (t(2),))

@case("order")
def od_break_in_lambda_in_map():
    def f(x):
        return list(map(lambda v: (brk(), v * 2)[1], [x, x + 1]))
    return fn_program(f, (t(2),))

@case("order")
def od_exception_after_break_propagates_with_side_effects():
    log = []
    def f(x):
        log.append("before")
        brk()
        log.append("after")
        raise RuntimeError("late")
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("order")
def od_side_effect_then_exception_in_same_graph():
    log = []
    def f(x):
        log.append(x.shape[0])
        y = x + 1
        if y.shape[0] > 1:
            raise ValueError("x")
        return y
    return fn_program(f, (t(2),), (t(1),), observe=lambda: list(log))

@case("order")
def od_input_mutation_then_exception():
    def f(x):
        x.add_(5)
        raise KeyError("k")
    x = t(2)
    return fn_program(f, (x,), observe=lambda: x)
