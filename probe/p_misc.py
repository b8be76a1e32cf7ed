import torch, contextlib, operator, functools, math
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

@case("misc")
def mi_unbound_tensor_methods():
    def f(x):
        return torch.Tensor.add(x, 1), x.__add__(2), type(x).sum(x), torch.Tensor.__mul__(x, 3), getattr(torch.Tensor, "neg")(x)
    return fn_program(f, (t(3),))

@case("misc")
def mi_dunder_rsub_rtruediv_via_method():
    def f(x):
        return x.__rsub__(1), x.__rtruediv__(2), x.__radd__(3), x.__rpow__(2), x.__matmul__(x)
    return fn_program(f, (t(3),))

@case("misc")
def mi_operator_on_tensors():
    def f(x, y):
        return operator.add(x, y), operator.matmul(x.view(1, 3), y.view(3, 1)), operator.lt(x, y), operator.itemgetter(0)(x), operator.iadd(x.clone(), y)
    return fn_program(f, (t(3), t(3)))

@case("misc")
def mi_context_decorator_class():
    log = []
    class Tag(contextlib.ContextDecorator):
        def __enter__(self):
            log.append("in")
            return self
        def __exit__(self, *exc):
            log.append("out")
            return False
    @Tag()
    def helper(v):
        return v * 2
    def f(x):
        return helper(x) + 1
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("misc")
def mi_record_function_profiler():
    def f(x):
        with torch.profiler.record_function("blk"):
            y = x * 2
        return y + 1
    return fn_program(f, (t(2),))

@case("misc")
def mi_nested_user_ctx_with_exception_and_break():
    log = []
    class C:
        def __init__(self, n):
            self.n = n
        def __enter__(self):
            log.append(("in", self.n))
        def __exit__(self, et, ev, tb):
            log.append(("out", self.n, et is not None))
            return self.n == 1 and et is KeyError
    def f(x):
        with C(1):
            with C(2):
                y = x + 1
                raise KeyError("k")
        return x * 3
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("misc")
def mi_exit_stack_callbacks_order():
    log = []
    def f(x):
        with contextlib.ExitStack() as st:
            st.callback(log.append, "a")
            st.callback(log.append, "b")
            y = x * 2
        return y
    return fn_program(f, (t(2),), observe=lambda: list(log))

@case("misc")
def mi_cond_with_closure_over_tensor():
    w = torch.randn(3)
    def f(p, x):
        return torch.cond(p.sum() > 0, lambda v: v * w, lambda v: v - w, (x,))
    return fn_program(f, (torch.ones(1), t(3)), (-torch.ones(1), t(3)))

@case("misc")
def mi_subclass_torch_function_returns_subclass():
    class Tagged(torch.Tensor):
        pass
    def f(x):
        y = x + 1
        return type(y).__name__, y.as_subclass(torch.Tensor) * 2
    return fn_program(f, (torch.ones(2).as_subclass(Tagged),))

@case("misc")
def mi_module_global_in_other_module():
    import torch.nn.functional as F
    def f(x):
        return F.relu(x) + math.pi + torch.pi
    return fn_program(f, (t(3),))

@case("misc")
def mi_shape_dunder_and_methods():
    def f(x):
        s = x.shape
        return s.__len__(), s.numel(), s.count(2), s.index(3), list(reversed(s)), x * len(s)
    return fn_program(f, (t(2, 3, 2),))

@case("misc")
def mi_tensor_method_via_getattr_string():
    def f(x, name):
        return getattr(x, name)()
    return fn_program(f, (t(3), "exp"), (t(3), "sin"))

@case("misc")
def mi_torch_function_via_getattr_module():
    def f(x, name):
        return getattr(torch, name)(x)
    return fn_program(f, (t(3), "cos"), (t(3), "abs"))

@case("misc")
def mi_module_apply_and_zero_grad():
    m = nn.Linear(2, 2)
    def f(x):
        m.zero_grad()
        out = m(x)
        return out, m.weight.grad
    return fn_program(f, (t(1, 2),))

@case("misc")
def mi_parameter_created_in_frame():
    def f(x):
        p = nn.Parameter(x * 2)
        return p + 1, p.requires_grad, isinstance(p, nn.Parameter)
    return fn_program(f, (t(2),))

@case("misc")
def mi_module_created_in_frame():
    def f(x):
        torch.manual_seed(0)
        lin = nn.Linear(2, 3)
        return lin(x).shape, lin.weight.shape
    return fn_program(f, (t(1, 2),))

@case("misc")
def mi_tensor_new_zero_dim_and_item_float():
    def f(x):
        s = torch.tensor(2.5)
        return x * s, s.item() * 2, float(s) + 1, int(s)
    return fn_program(f, (t(2),))

@case("misc")
def mi_python_float_from_tensor_in_branch_loop():
    def f(x):
        total = 0.0
        for v in x:
            total += float(v)
        return total, x * 2
    return fn_program(f, (t(3),))

@case("misc")
def mi_lru_cache_on_method_with_shapes():
    @functools.lru_cache(None)
    def table(n):
        return tuple(range(n))
    def f(x):
        return x * len(table(x.shape[0])), table(3)
    return fn_program(f, (t(3),), (t(4),))

@case("misc")
def mi_sum_of_python_floats_and_fsum():
    def f(x):
        return x + sum([0.1] * 10), math.fsum([0.1] * 10), sum([0.1] * 10)
    return fn_program(f, (t(2),))

@case("misc")
def mi_int_of_float_tensor_shape_ops():
    def f(x):
        n = x.shape[0]
        return x.view(n // 2, -1), x[: n // 2], x[n - 1], x.narrow(0, n // 2, n - n // 2)
    return fn_program(f, (t(6),), (t(8),), (t(10),))

@case("misc")
def mi_slicing_with_step_and_negative_bounds():
    def f(x):
        return x[-3:], x[:-1:2], x[::-1] if False else x.flip(0), x[1:-1], x[-100:100]
    return fn_program(f, (t(7),))

@case("misc")
def mi_tensor_setitem_with_ellipsis_none_step():
    def f(x):
        y = x.clone()
        y[..., ::2] = 0
        y[None, 0] = 1
        y[:, -1] += 5
        return y
    return fn_program(f, (t(3, 4),))

@case("misc")
def mi_tensor_bool_index_assign_scalar_tensor():
    def f(x, m):
        y = x.clone()
        y[m] = torch.tensor(9.0)
        y[~m] *= 2
        return y
    return fn_program(f, (t(4), torch.tensor([True, False, True, False])))

@case("misc")
def mi_global_counter_in_nested_helper_across_calls():
    def helper():
        global MI_CNT
        MI_CNT += 1
        return MI_CNT
    def f(x):
        return x * helper() + helper()
    globals()["MI_CNT"] = 0
    return fn_program(f, (t(2),), (t(2),), (t(2),), observe=lambda: MI_CNT)
MI_CNT = 0

@case("misc")
def mi_list_of_modules_iterated_with_zip():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
            self.scales = [0.5, 2.0]
        def forward(self, x):
            for l, s in zip(self.a, self.scales):
                x = l(x) * s
            return x
    return Program(M(), ((t(1, 2),),))

@case("misc")
def mi_reversed_modulelist_and_enumerate():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
        def forward(self, x):
            for i, l in enumerate(reversed(self.a)):
                x = l(x) + i
            return x, self.a[-1](x), len(self.a[1:])
    return Program(M(), ((t(1, 2),),))

@case("misc")
def mi_module_to_dtype_between_calls():
    m = nn.Linear(2, 2)
    def between(s, i):
        m.double()
    return Program(m, ((t(1, 2),), (t(1, 2, dtype=torch.float64),)), between=between)

@case("misc")
def mi_kwargs_to_module_forward():
    class M(nn.Module):
        def forward(self, x, *, scale=1.0, bias=None):
            y = x * scale
            return y + bias if bias is not None else y
    return Program(M(), (kw(t(2), scale=2.0), kw(t(2), bias=t(2)), (t(2),)))

@case("misc")
def mi_register_module_and_add_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module("first", nn.Linear(2, 2))
            self.register_module("second", nn.ReLU())
        def forward(self, x):
            return self.second(self.first(x)), [n for n, _ in self.named_children()]
    return Program(M(), ((t(1, 2),),))

@case("misc")
def mi_get_submodule_and_parameter():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blk = nn.Sequential(nn.Linear(2, 2))
        def forward(self, x):
            return self.get_submodule("blk.0")(x) + self.get_parameter("blk.0.bias")
    return Program(M(), ((t(1, 2),),))
