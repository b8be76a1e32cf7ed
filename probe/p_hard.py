import torch, functools, collections, dataclasses
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

def brk():
    torch._dynamo.graph_break()

@case("breaks")
def k_global_written_before_break_read_after():
    def f(x):
        global K_G
        K_G = K_G + 1
        brk()
        return x * K_G
    globals()["K_G"] = 0
    return fn_program(f, (t(2),), (t(2),), observe=lambda: K_G)
K_G = 0

@case("breaks")
def k_attr_mutation_before_break():
    class S: pass
    s = S(); s.v = 1
    def f(x):
        s.v = s.v * 3
        brk()
        s.v += 1
        return x * s.v
    return fn_program(f, (t(2),), (t(2),), observe=lambda: s.v)

@case("breaks")
def k_list_in_frame_across_two_breaks():
    def f(x):
        l = [x]
        l.append(x * 2)
        brk()
        l.append(l[0] + l[1])
        brk()
        l.pop(0)
        return l
    return fn_program(f, (t(2),))

@case("breaks")
def k_inplace_on_input_then_break():
    def f(x):
        x.add_(1)
        brk()
        x.mul_(2)
        return x.sum()
    return fn_program(f, (t(3),), (t(3),))

@case("breaks")
def k_break_in_loop_accumulates():
    def f(x):
        acc = x * 0
        for i in range(3):
            acc = acc + x * i
            brk()
        return acc
    return fn_program(f, (t(2),))

@case("breaks")
def k_break_in_nested_call_with_locals():
    def g(v, k):
        w = v * k
        brk()
        return w + k
    def f(x):
        a = x + 1
        b = g(a, 3)
        return a * b
    return fn_program(f, (t(2),))

@case("breaks")
def k_break_inside_try_finally():
    log = []
    def f(x):
        try:
            y = x + 1
            brk()
            return y * 2
        finally:
            log.append("f")
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("breaks")
def k_break_inside_for_over_dict():
    def f(d):
        out = {}
        for k, v in d.items():
            out[k] = v * 2
            brk()
        return out
    return fn_program(f, ({"a": t(2), "b": t(2)},))

@case("breaks")
def k_unsupported_builtin_then_continue():
    import copy
    def f(x):
        y = copy.deepcopy([x, 1])
        return y[0] + y[1]
    return fn_program(f, (t(2),))

@case("breaks")
def k_item_used_in_python_branch():
    def f(x):
        if x.sum().item() > 0:
            return x * 2
        return x * -2
    return fn_program(f, (torch.ones(2),), (-torch.ones(2),))

@case("breaks")
def k_tensor_from_item_arith():
    def f(x):
        v = x.max().item()
        return x / v, int(v) if v > 1 else 0
    return fn_program(f, (torch.tensor([1.0, 3.0]),), (torch.tensor([0.5, 0.25]),))

@case("breaks")
def k_nonzero_data_dependent():
    def f(x):
        idx = torch.nonzero(x > 0)
        return idx.shape[0] * x, x[x > 0]
    return fn_program(f, (torch.tensor([1.0, -1.0, 2.0]),), (torch.tensor([-1.0, -1.0, 2.0, 4.0]),))

@case("breaks")
def k_generator_with_break_inside():
    def gen(x):
        for i in range(2):
            brk()
            yield x + i
    def f(x):
        return list(gen(x))
    return fn_program(f, (t(2),))

@case("breaks")
def k_with_user_ctx_and_break_and_exception():
    log = []
    class C:
        def __enter__(self):
            log.append("e")
        def __exit__(self, *a):
            log.append("x")
    def f(x):
        with C():
            y = x + 1
            brk()
            y = y * 2
        return y
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("breaks")
def k_module_attr_written_then_break():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = 0
            self.lin = nn.Linear(2, 2)
        def forward(self, x):
            self.n += 1
            brk()
            return self.lin(x) * self.n
    return Program(M(), ((t(1, 2),), (t(1, 2),)))

@case("breaks")
def k_closure_cell_created_before_break_used_after():
    def f(x):
        y = x * 2
        def g():
            return y + 1
        brk()
        return g()
    return fn_program(f, (t(2),))

@case("breaks")
def k_dict_mutation_seen_after_break_by_helper():
    def helper(d):
        return d["a"] + d.get("b", 0)
    def f(x):
        d = {"a": x}
        brk()
        d["b"] = x * 5
        return helper(d)
    return fn_program(f, (t(2),))

@case("unspec")
def u_int_arg_changes_each_call():
    def f(x, n):
        return x * n + n
    return fn_program(f, (t(2), 1), (t(2), 2), (t(2), 3), (t(2), 4))

@case("unspec")
def u_int_arg_used_as_size():
    def f(x, n):
        return x.repeat(n), torch.ones(n) * x.sum()
    return fn_program(f, (t(2), 2), (t(2), 3), (t(2), 4))

@case("unspec")
def u_float_arg_used_in_python_math():
    import math
    def f(x, s):
        return x * math.sqrt(s) + s ** 0.5
    return fn_program(f, (t(2), 4.0), (t(2), 9.0), (t(2), 2.0))

@case("unspec")
def u_shape_changes_dynamic():
    def f(x):
        return x.sum(0) * x.shape[0], x.reshape(-1, 2).shape
    return fn_program(f, (t(4, 2),), (t(6, 2),), (t(8, 2),))

@case("unspec")
def u_zero_and_one_sizes():
    def f(x):
        return x.sum(), x.shape[0] == 1, x.mean() if x.numel() else x.sum()
    return fn_program(f, (t(3),), (t(1),), (t(0),), (t(5),))

@case("unspec")
def u_int_arg_in_range_loop():
    def f(x, n):
        for i in range(n):
            x = x + i
        return x
    return fn_program(f, (t(2), 2), (t(2), 3))

@case("unspec")
def u_int_from_shape_passed_to_view():
    def f(x):
        b = x.shape[0]
        return x.view(b, -1).transpose(0, 1).contiguous().view(-1)
    return fn_program(f, (t(2, 6),), (t(3, 6),), (t(4, 6),))

@case("unspec")
def u_scalar_tensor_arg():
    def f(x, s):
        return x * s, s.dim()
    return fn_program(f, (t(2), torch.tensor(2.0)), (t(2), torch.tensor(3.0)))

@case("unspec")
def u_list_len_as_shape():
    def f(xs):
        return torch.zeros(len(xs)) + torch.stack(xs).sum(1)
    return fn_program(f, ([t(3), t(3)],), ([t(3), t(3), t(3)],))

@case("unspec")
def u_negative_int_index():
    def f(x, i):
        return x[i], x[i:]
    return fn_program(f, (t(5), -1), (t(5), -2), (t(5), 1))

@case("unspec")
def u_float_inf_nan_arg():
    def f(x, v):
        return x.clamp(max=v), v
    return fn_program(f, (t(3), float("inf")), (t(3), 0.0), (t(3), float("nan")))

@case("subclasses")
def sc_parameter_subclass_detection():
    def f(x, p):
        return x * p, isinstance(p, nn.Parameter), type(p).__name__
    return fn_program(f, (t(2), nn.Parameter(torch.ones(2))))

@case("subclasses")
def sc_tensor_subclass_no_torch_function():
    class MyT(torch.Tensor):
        pass
    def f(x):
        return x * 2
    return fn_program(f, (torch.ones(2).as_subclass(MyT),))

@case("subclasses")
def sc_tensor_subclass_torch_function_logging():
    log = []
    class LogT(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            log.append(getattr(func, "__name__", "?"))
            return super().__torch_function__(func, types, args, kwargs or {})
    def f(x):
        return (x + 1).sum()
    return fn_program(f, (torch.ones(2).as_subclass(LogT),), observe=lambda: len(log) > 0)

@case("subclasses")
def sc_torch_function_mode():
    from torch.overrides import TorchFunctionMode
    class AddToMul(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.add:
                func = torch.mul
            return func(*args, **(kwargs or {}))
    def f(x):
        with AddToMul():
            return torch.add(x, 3)
    return fn_program(f, (t(2),))

@case("hop")
def hop_torch_cond():
    def f(p, x):
        return torch.cond(p, lambda v: v.sin(), lambda v: v.cos(), (x,))
    return fn_program(f, (torch.tensor(True), t(3)), (torch.tensor(False), t(3)))

@case("hop")
def hop_checkpoint():
    from torch.utils.checkpoint import checkpoint
    lin = nn.Linear(3, 3)
    def f(x):
        return checkpoint(lambda v: lin(v).relu(), x, use_reentrant=False).sum()
    def drive(cf):
        x = torch.randn(2, 3, requires_grad=True)
        l = cf(x)
        l.backward()
        return l, x.grad, lin.weight.grad
    return Program(f, drive=drive)

@case("hop")
def hop_vmap():
    def f(x, w):
        return torch.vmap(lambda r: r @ w)(x)
    return fn_program(f, (t(4, 3), t(3, 2)))

@case("hop")
def hop_func_grad():
    def f(x):
        return torch.func.grad(lambda v: (v ** 3).sum())(x)
    return fn_program(f, (t(3),))

@case("hop")
def hop_autograd_function():
    class Sq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            ctx.save_for_backward(v)
            return v * v
        @staticmethod
        def backward(ctx, g):
            (v,) = ctx.saved_tensors
            return 2 * v * g
    def f(x):
        return Sq.apply(x).sum()
    def drive(cf):
        x = torch.randn(3, requires_grad=True)
        l = cf(x)
        l.backward()
        return l, x.grad
    return Program(f, drive=drive)

@case("hop")
def hop_autograd_grad_in_frame():
    def f(x):
        y = (x ** 2).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        return g * 1
    return fn_program(f, (t(3, requires_grad=True),))

@case("sources")
def so_nested_attr_chain_input():
    class A: pass
    a = A(); a.b = A(); a.b.c = {"w": [torch.ones(2), 3]}
    def f(x, o):
        return x * o.b.c["w"][0] + o.b.c["w"][1]
    def between(s, i):
        a.b.c["w"][1] = 10
    return fn_program(f, (t(2), a), (t(2), a), between=between)

@case("sources")
def so_global_module_attr_changes():
    def f(x):
        return x * CFG.scale
    CFG.scale = 2
    def between(s, i):
        CFG.scale = 4
    return fn_program(f, (t(2),), (t(2),), between=between)
class _Cfg: pass
CFG = _Cfg()

@case("sources")
def so_tuple_element_of_list_input_changes():
    def f(x, cfg):
        return x * cfg[0][1]
    cfg = [(1, 2)]
    def between(s, i):
        cfg[0] = (1, 5)
    return fn_program(f, (t(2), cfg), (t(2), cfg), between=between)

@case("sources")
def so_default_arg_tensor_mutated():
    def f(x, acc=torch.zeros(2)):
        acc.add_(x)
        return acc * 1
    return fn_program(f, (t(2),), (t(2),), observe=lambda: f.__defaults__[0])

@case("sources")
def so_dict_key_added_between_calls():
    d = {"a": 1}
    def f(x):
        return x * len(d) + sum(d.values())
    def between(s, i):
        d["b"] = 5
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("sources")
def so_list_element_tensor_replaced():
    ws = [torch.ones(2)]
    def f(x):
        return x * ws[0]
    def between(s, i):
        ws[0] = torch.full((2,), 3.0)
    return fn_program(f, (t(2),), (t(2),), between=between)

@case("sources")
def so_tensor_dtype_changes_between_calls():
    def f(x):
        return x + 1
    return fn_program(f, (t(2),), (t(2, dtype=torch.float64),), (t(2, dtype=torch.int64),))

@case("sources")
def so_requires_grad_changes_between_calls():
    def f(x):
        return x * 2, (x * 2).requires_grad
    return fn_program(f, (t(2),), (t(2, requires_grad=True),))

@case("sources")
def so_noncontiguous_input_after_contiguous():
    def f(x):
        return x.view(-1) if x.is_contiguous() else x.reshape(-1) * 2
    return fn_program(f, (t(2, 3),), (t(3, 2).t(),))

@case("sources")
def so_grad_mode_changes_between_calls():
    def f(x):
        return x * 2
    def drive(cf):
        x = torch.ones(2, requires_grad=True)
        a = cf(x)
        with torch.no_grad():
            b = cf(x)
        c = cf(x)
        return a.requires_grad, b.requires_grad, c.requires_grad, a, b
    return Program(f, drive=drive)
