import torch, math
import torch.nn as nn
from harness import case, fn_program, t, Program, kw

G_BUF = torch.zeros(3)

@case("alias")
def a_same_tensor_twice_inplace_one():
    def f(a, b):
        a.add_(1)
        return b * 2
    x = t(3)
    return fn_program(f, (x, x), observe=lambda: x)

@case("alias")
def a_input_and_its_view_inplace():
    def f(a, v):
        v.mul_(10)
        return a.sum(), v
    x = t(4)
    return fn_program(f, (x, x[1:3]), observe=lambda: x)

@case("alias")
def a_output_is_input():
    def f(x):
        return x, x.view(-1), x.t()
    def drive(cf):
        x = torch.randn(2, 3)
        a, b, c = cf(x)
        return a is x, b._base is x, c.data_ptr() == x.data_ptr(), a, b, c
    return Program(f, drive=drive)

@case("alias")
def a_two_outputs_same_tensor():
    def f(x):
        y = x + 1
        return y, y
    def drive(cf):
        a, b = cf(torch.ones(2))
        a.add_(5)
        return a is b, b
    return Program(f, drive=drive)

@case("alias")
def a_output_view_then_mutated_by_caller():
    def f(x):
        y = x * 2
        return y, y[0]
    def drive(cf):
        y, y0 = cf(torch.ones(2, 2))
        y0.fill_(9)
        return y
    return Program(f, drive=drive)

@case("alias")
def a_global_tensor_inplace():
    def f(x):
        G_BUF.add_(x)
        return G_BUF.sum()
    G_BUF.zero_()
    return fn_program(f, (t(3),), (t(3),), observe=lambda: G_BUF.clone())

@case("alias")
def a_list_element_tensor_inplace():
    def f(xs):
        for v in xs:
            v.mul_(2)
        return len(xs)
    xs = [t(2), t(2)]
    return fn_program(f, (xs,), observe=lambda: xs)

@case("alias")
def a_inplace_leaf_requiring_grad_raises():
    def f(w):
        w.add_(1)
        return w
    return fn_program(f, (t(2, requires_grad=True),))

@case("alias")
def a_inplace_dtype_error():
    def f(x):
        x.add_(1.5)
        return x
    return fn_program(f, (t(3, dtype=torch.int64),))

@case("alias")
def a_out_variant_resize():
    def f(x):
        out = torch.empty(0)
        torch.add(x, 1, out=out)
        return out, out.shape
    return fn_program(f, (t(3),))

@case("alias")
def a_out_variant_into_input_slice():
    def f(x, y):
        torch.mul(y, 2, out=x[1:3])
        return x
    return fn_program(f, (t(5), t(2)))

@case("alias")
def a_tensor_unpack_rows():
    def f(x):
        a, b = x
        return a - b
    return fn_program(f, (t(2, 3),))

@case("alias")
def a_tensor_as_dict_key():
    def f(x, y):
        d = {x: "x", y: "y"}
        return d[y], x + y
    return fn_program(f, (t(2), t(2)))

@case("alias")
def a_set_of_tensors_identity():
    def f(x, y):
        s = {x, y, x}
        return len(s), x * 2
    return fn_program(f, (t(2), t(2)))

@case("alias")
def a_size_arith_and_compare():
    def f(x):
        s = x.shape
        new = s[:1] + (1,) + s[1:]
        return x.view(new), s == (2, 3), x.size() == torch.Size([2, 3]), list(s) == [2, 3], s.numel()
    return fn_program(f, (t(2, 3),))

@case("alias")
def a_tensor_from_shape():
    def f(x):
        return torch.tensor(x.shape), torch.tensor([x.shape[0], 3]) * 2, torch.as_tensor(x.shape[1])
    return fn_program(f, (t(2, 5),), (t(4, 5),))

@case("alias")
def a_arange_float_steps_and_linspace():
    def f(x):
        return x + torch.arange(0, 1, 0.25), torch.linspace(0, 1, steps=4), torch.arange(x.shape[0] * 2)
    return fn_program(f, (t(4),))

@case("alias")
def a_int_overflow_and_wrap():
    def f(x):
        return (x.to(torch.int8) * 100), x.to(torch.uint8) - 1
    return fn_program(f, (torch.tensor([1.0, 2.0, 3.0]),))

@case("alias")
def a_int_division_by_zero_tensor_raises():
    def f(x):
        return x // torch.zeros_like(x)
    return fn_program(f, (t(2, dtype=torch.int64),))

@case("alias")
def a_complex_ops():
    def f(x):
        c = torch.complex(x, x * 2)
        return c.abs(), c.conj().imag, torch.view_as_real(c), c.angle()
    return fn_program(f, (t(3),))

@case("alias")
def a_where_scalar_and_bool_index():
    def f(x):
        return torch.where(x > 0, x, 0.0), torch.where(x > 0, 1, -1).dtype, x[x.abs() > 0.5].numel() >= 0
    return fn_program(f, (t(5),))

@case("alias")
def a_promote_int_tensor_with_float_scalar_and_bool():
    def f(x, b):
        return x * 0.5, x + True, b + b, b.sum(), (x > 0) & b
    return fn_program(f, (t(3, dtype=torch.int32), torch.tensor([True, False, True])))

@case("alias")
def a_module_param_changed_in_forward_under_no_grad():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))
        def forward(self, x):
            with torch.no_grad():
                self.w.div_(self.w.norm())
            return x * self.w
    return Program(M(), ((t(3),), (t(3),)))

@case("alias")
def a_register_buffer_in_forward():
    class M(nn.Module):
        def forward(self, x):
            if not hasattr(self, "seen"):
                self.register_buffer("seen", torch.zeros_like(x))
            self.seen += x
            return self.seen * 1
    return Program(M(), ((t(2),), (t(2),)))

@case("alias")
def a_module_attr_delete():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.tmp = 3
        def forward(self, x):
            if hasattr(self, "tmp"):
                v = self.tmp
                del self.tmp
                return x * v
            return x
    return Program(M(), ((t(2),), (t(2),)))

@case("alias")
def a_param_data_swap():
    lin = nn.Linear(2, 2)
    def f(x):
        lin.weight.data = torch.eye(2)
        return lin(x)
    return fn_program(f, (t(1, 2),), observe=lambda: lin.weight.clone())

@case("alias")
def a_requires_grad_false_on_param_between_calls():
    lin = nn.Linear(2, 1)
    def f(x):
        return lin(x), lin.weight.requires_grad
    def between(s, i):
        lin.weight.requires_grad_(False)
    return fn_program(f, (t(1, 2),), (t(1, 2),), between=between)

@case("alias")
def a_nested_compile_call():
    import kiln
    def inner(v):
        return v * 3
    def f(x):
        return inner(x) + 1
    return fn_program(f, (t(2),))

@case("alias")
def a_cache_limit_many_int_values():
    def f(x, n):
        return x * n if n % 2 else x - n
    return fn_program(f, *[(t(2), i) for i in range(12)])

@case("alias")
def a_scalar_tensor_python_ops():
    def f(x):
        s = x.sum()
        return s + 1, float(s) > -100, s * math.pi, torch.tensor(3) + s
    return fn_program(f, (t(3),))

@case("alias")
def a_clone_preserves_strides_and_contiguous():
    def f(x):
        y = x.t().clone()
        z = x.t().contiguous()
        return y.stride(), z.stride(), y + z
    return fn_program(f, (t(3, 2),))

@case("alias")
def a_empty_like_strides_channels_last():
    def f(x):
        y = torch.empty_like(x).fill_(1)
        return y.stride(), (x + 1).stride(), y.is_contiguous(memory_format=torch.channels_last)
    return fn_program(f, (t(1, 3, 2, 2).to(memory_format=torch.channels_last),))

@case("alias")
def a_detach_inplace_on_output_grad_flow():
    def f(x):
        y = x * 2
        z = y.detach()
        z.add_(1)
        return y, z.requires_grad
    return fn_program(f, (t(2, requires_grad=True),))

@case("alias")
def a_setitem_on_input_with_grad_clone():
    def f(x):
        y = x.clone()
        y[0] = 0
        return y
    def drive(cf):
        x = torch.ones(3, requires_grad=True)
        y = cf(x)
        y.sum().backward()
        return y, x.grad
    return Program(f, drive=drive)

@case("alias")
def a_resize_inplace():
    def f(x):
        y = x.clone()
        y.resize_(2, 2)
        return y.shape
    return fn_program(f, (t(4),))

@case("alias")
def a_tolist_of_int_tensor_to_python():
    def f(x):
        vals = x.tolist()
        return sum(vals), x.float() / len(vals)
    return fn_program(f, (torch.tensor([1, 2, 3]),), (torch.tensor([4, 5, 6]),))

@case("alias")
def a_reduction_dtypes():
    def f(x):
        return x.sum().dtype, x.mean(dtype=torch.float64), x.prod(), x.cumsum(0).dtype, x.argmax()
    return fn_program(f, (t(4, dtype=torch.int32),))

@case("alias")
def a_sort_topk_ties_and_stable():
    def f(x):
        v, i = torch.sort(x, stable=True)
        tv, ti = torch.topk(x, 2)
        return v, i, tv, x.unique(sorted=True)
    return fn_program(f, (torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0]),))

@case("alias")
def a_float64_precision_kept():
    def f(x):
        return x * (1 + 1e-12), (x + 1e-12 - x)
    return fn_program(f, (torch.ones(2, dtype=torch.float64),))

@case("alias")
def a_nan_inf_handling():
    def f(x):
        y = x / 0
        return torch.nan_to_num(y), y.isnan().sum(), torch.isinf(y).any(), y.max(), torch.nanmean(torch.tensor([1.0, float("nan")]))
    return fn_program(f, (torch.tensor([1.0, -1.0, 0.0]),))

@case("alias")
def a_max_with_nan_and_clamp_min_gt_max():
    def f(x):
        return torch.maximum(x, torch.tensor(float("nan"))), x.clamp(min=2, max=1), torch.minimum(x, x.flip(0))
    return fn_program(f, (t(3),))
