import torch
import torch.nn.functional as F
from harness import case, fn_program, t, Program, kw

def T(*s, **k):
    return t(*s, **k)

def multi(fn, calls, extra=None):
    """drive: call fn on each arg tuple (made fresh), record outputs, inputs after, strides, versions."""
    def drive(sub):
        res = []
        for mk in calls:
            args = mk()
            try:
                out = sub(*args)
            except Exception as e:
                res.append(("raised", type(e).__name__))
                continue
            outs = out if isinstance(out, (tuple, list)) else (out,)
            res.append(tuple((o.detach().clone(), o.stride(), o.requires_grad, o.dtype) if isinstance(o, torch.Tensor) else o for o in outs))
            res.append(tuple(a.detach().clone() for a in args if isinstance(a, torch.Tensor)))
            if extra:
                res.append(extra(args, out))
        return res
    return Program(fn, drive=drive)

def inplace_add(a, b):
    a.add_(b)
    return a * 1

@case("tr")
def tr_alias_changes_between_calls():
    def c1():
        return T(4), T(4)
    def c2():
        x = T(4)
        return x, x
    def c3():
        x = T(6)
        return x[:4], x[2:]
    return multi(inplace_add, [c1, c2, c3])

@case("tr")
def tr_alias_first_call_then_not():
    def c1():
        x = T(4)
        return x, x
    def c2():
        return T(4), T(4)
    return multi(inplace_add, [c1, c2, c1])

def swapper(a, b):
    a.copy_(b * 2)
    b.mul_(3)
    return a + b

@case("tr")
def tr_alias_copy_mul():
    def c1():
        return T(3), T(3)
    def c2():
        x = T(3)
        return x, x
    def c3():
        x = T(2, 3)
        return x[0], x[0]
    return multi(swapper, [c1, c2, c3])

@case("tr")
def tr_alias_overlap_view_second_call():
    def f(a, b):
        b.zero_()
        return a.sum(), b
    def c1():
        return T(3, 3), T(3)
    def c2():
        x = T(3, 3)
        return x, x[1]
    def c3():
        x = T(3, 3)
        return x, x[:, 2]
    return multi(f, [c1, c2, c3])

@case("tr")
def tr_offset_changes():
    def f(a):
        a.mul_(2)
        return a + 1
    def mk(o):
        def c():
            return (T(10)[o:o + 4],)
        return c
    return multi(f, [mk(0), mk(3), mk(5), mk(1)])

@case("tr")
def tr_stride_changes():
    def f(a):
        return a.sum(1) + a[:, 0]
    return multi(f, [lambda: (T(3, 4),), lambda: (T(4, 3).t(),), lambda: (T(3, 8)[:, ::2],), lambda: (T(3, 4),)])

@case("tr")
def tr_stride_changes_inplace():
    def f(a):
        a.add_(torch.arange(4.))
        return a
    return multi(f, [lambda: (T(3, 4),), lambda: (T(4, 3).t(),), lambda: (T(3, 8)[:, 1::2],), lambda: (T(1, 4).expand(3, 4).clone(),)])

@case("tr")
def tr_shape_changes_views():
    def f(a):
        return a[1:].t() * 2, a.diagonal()
    return multi(f, [lambda: (T(3, 3),), lambda: (T(4, 5),), lambda: (T(6, 2),), lambda: (T(5, 5),)])

@case("tr")
def tr_shape_changes_inplace_view():
    def f(a):
        a[1:, :2].fill_(0)
        return a.sum(0)
    return multi(f, [lambda: (T(3, 3),), lambda: (T(4, 5),), lambda: (T(6, 2),), lambda: (T(5, 5),)])

@case("tr")
def tr_shape_changes_unfold():
    def f(a):
        return a.unfold(0, 2, 2).sum(-1)
    return multi(f, [lambda: (T(6),), lambda: (T(8),), lambda: (T(9),), lambda: (T(11),)])

@case("tr")
def tr_shape_changes_int_div():
    def f(a):
        n = a.shape[0]
        return a[: n // 2] * (n % 3), a.view(n // 2, -1) if n % 2 == 0 else a
    return multi(f, [lambda: (T(6),), lambda: (T(8),), lambda: (T(9),), lambda: (T(10),)])

@case("tr")
def tr_shape_changes_narrow_offset():
    def f(a):
        n = a.shape[0]
        return a.narrow(0, n - 2, 2) + a.as_strided((2,), (2,), n - 4)
    return multi(f, [lambda: (T(6),), lambda: (T(8),), lambda: (T(9),), lambda: (T(12),)])

@case("tr")
def tr_dtype_changes():
    def f(a):
        return a // 2 + a % 3, (a * 1.5).dtype
    return multi(f, [lambda: (torch.tensor([7, -7, 5]),), lambda: (torch.tensor([7., -7., 5.]),), lambda: (torch.tensor([7, -7, 5], dtype=torch.int8),)])

@case("tr")
def tr_requires_grad_changes():
    def f(a, b):
        return a * b + a.sin()
    def ex(args, out):
        o = out
        if o.requires_grad:
            o.sum().backward()
            return tuple(None if x.grad is None else x.grad.clone() for x in args)
        return None
    return multi(f, [lambda: (T(3), T(3)), lambda: (T(3, requires_grad=True), T(3)), lambda: (T(3), T(3, requires_grad=True)), lambda: (T(3), T(3))], ex)

@case("tr")
def tr_grad_mode_changes():
    def f(a):
        return a.exp() * 2
    calls = []
    def drive(sub):
        x = T(3, requires_grad=True)
        a = sub(x)
        with torch.no_grad():
            b = sub(x)
        c = sub(x)
        with torch.inference_mode():
            d = sub(x)
        e = sub(x)
        e.sum().backward()
        return [(o, o.requires_grad) for o in (a, b, c, d, e)], x.grad
    return Program(f, drive=drive)

@case("tr")
def tr_contig_to_channels_last():
    def f(a):
        return a.relu() * 2, a.mean((2, 3))
    return multi(f, [lambda: (T(2, 3, 4, 4),), lambda: (T(2, 3, 4, 4).to(memory_format=torch.channels_last),), lambda: (T(2, 3, 4, 4),)])

@case("tr")
def tr_channels_last_inplace():
    def f(a):
        a.mul_(torch.arange(3.).view(1, 3, 1, 1))
        return a
    return multi(f, [lambda: (T(2, 3, 2, 2),), lambda: (T(2, 3, 2, 2).to(memory_format=torch.channels_last),)])

@case("tr")
def tr_zero_size_then_nonzero():
    def f(a):
        return a.sum(0), a * 2
    return multi(f, [lambda: (T(0, 3),), lambda: (T(2, 3),), lambda: (T(1, 3),), lambda: (T(0, 3),)])

@case("tr")
def tr_size1_dims():
    def f(a, b):
        return a + b, (a * b).sum(0)
    return multi(f, [lambda: (T(1, 3), T(3, 1)), lambda: (T(2, 3), T(2, 1)), lambda: (T(3, 3), T(3, 3)), lambda: (T(1, 1), T(4, 1))])

@case("tr")
def tr_expanded_input_changes():
    def f(a):
        return a * 2 + a.sum(0)
    return multi(f, [lambda: (T(3, 4),), lambda: (T(1, 4).expand(3, 4),), lambda: (T(3, 1).expand(3, 4),), lambda: (torch.tensor(2.0).expand(3, 4),)])

@case("tr")
def tr_scalar_tensor_vs_vector():
    def f(a, b):
        return a + b
    return multi(f, [lambda: (T(3), torch.tensor(2.0)), lambda: (T(3), torch.tensor(2.0, dtype=torch.float64)), lambda: (T(3), torch.tensor([2.0], dtype=torch.float64)), lambda: (T(3), torch.tensor(2))])

@case("tr")
def tr_mutate_input_grad_and_values():
    def f(a):
        with torch.no_grad():
            a.mul_(0.5)
        return a * 2
    def ex(args, out):
        out.sum().backward()
        return args[0].grad.clone(), args[0]._version
    return multi(f, [lambda: (T(3, requires_grad=True),), lambda: (T(3, requires_grad=True),)], ex)

@case("tr")
def tr_param_update_between_calls():
    m = torch.nn.Linear(3, 2)
    def drive(sub):
        x = T(4, 3)
        r = [sub(x)]
        with torch.no_grad():
            m.weight.mul_(2)
            m.bias.add_(1)
        r.append(sub(x))
        m.weight.data = torch.ones(2, 3)
        r.append(sub(x))
        m.bias = torch.nn.Parameter(torch.zeros(2))
        r.append(sub(x))
        return r
    return Program(m, drive=drive)

@case("tr")
def tr_param_requires_grad_toggle():
    m = torch.nn.Linear(3, 2)
    def drive(sub):
        x = T(4, 3)
        o = sub(x)
        o.sum().backward()
        g1 = m.weight.grad.clone()
        m.weight.requires_grad_(False)
        m.weight.grad = None
        o2 = sub(x)
        o2.sum().backward()
        return g1, m.weight.grad, m.bias.grad, o2.requires_grad
    return Program(m, drive=drive)

@case("tr")
def tr_buffer_inplace_and_alias():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(4))
        def forward(self, x):
            self.b[1:].add_(x)
            return self.b[:2]
    m = M()
    def drive(sub):
        r = []
        for _ in range(3):
            o = sub(torch.ones(3))
            r.append((o.clone(), o.untyped_storage().data_ptr() == m.b.untyped_storage().data_ptr()))
        return r, m.b
    return Program(m, drive=drive)

@case("tr")
def tr_output_alias_mutated_later():
    def drive(sub):
        x = T(4)
        y = sub(x)
        x.add_(100)
        return y
    return Program(lambda x: x[1:], drive=drive)

@case("tr")
def tr_output_alias_mutated_later_reshape():
    def drive(sub):
        x = T(2, 3)
        y, z = sub(x)
        x.mul_(0)
        return y, z
    return Program(lambda x: (x.reshape(3, 2), x.t().reshape(6)), drive=drive)

@case("tr")
def tr_output_alias_write_through():
    def drive(sub):
        x = T(4)
        y = sub(x)
        y.fill_(5)
        return x
    return Program(lambda x: x.view(2, 2)[0], drive=drive)

@case("tr")
def tr_output_alias_write_through_after_mut():
    def drive(sub):
        x = T(4)
        y = sub(x)
        y.fill_(5)
        return x
    def f(x):
        x.add_(1)
        return x.view(2, 2)[1]
    return Program(f, drive=drive)

@case("tr")
def tr_output_grad_view_inplace_outside():
    def drive(sub):
        x = T(4, requires_grad=True)
        y = sub(x)
        y.mul_(2)
        y.sum().backward()
        return x.grad, y
    return Program(lambda x: (x * 1)[1:], drive=drive)

@case("tr")
def tr_output_view_of_leaf_inplace_outside_raises():
    def drive(sub):
        x = T(4, requires_grad=True)
        y = sub(x)
        y.mul_(2)
        return y
    return Program(lambda x: x[1:], drive=drive)

@case("tr")
def tr_output_multiple_views_grad_base():
    def drive(sub):
        x = T(6, requires_grad=True)
        a, b = sub(x)
        a.mul_(3)
        (b.sum() + a.sum()).backward()
        return x.grad
    return Program(lambda x: (lambda y: (y[:3], y))(x * 2), drive=drive)

@case("tr")
def tr_version_counter_after_inplace():
    def drive(sub):
        x = T(4)
        v0 = x._version
        sub(x)
        v1 = x._version
        sub(x)
        return v1 > v0, x._version > v1, x
    def f(x):
        x.add_(1)
        x.mul_(2)
    return Program(f, drive=drive)

@case("tr")
def tr_saved_input_mutated_after_raises():
    def drive(sub):
        x = T(3, requires_grad=True)
        y = x * 1
        o = sub(y)
        y.add_(1)
        o.sum().backward()
        return x.grad
    return Program(lambda y: y.sin(), drive=drive)

@case("tr")
def tr_saved_input_mutated_after_mul_raises():
    def drive(sub):
        x = T(3, requires_grad=True)
        w = T(3, requires_grad=True)
        o = sub(x, w)
        with torch.no_grad():
            w.mul_(2)
        o.sum().backward()
        return x.grad
    return Program(lambda x, w: x * w, drive=drive)

@case("tr")
def tr_bn_eval_train_toggle():
    m = torch.nn.BatchNorm1d(3)
    def drive(sub):
        x = T(5, 3)
        a = sub(x)
        m.eval()
        b = sub(x)
        m.train()
        c = sub(x)
        return a, b, c, m.running_mean, m.num_batches_tracked
    return Program(m, drive=drive)

@case("tr")
def tr_dropout_train_eval_toggle():
    m = torch.nn.Dropout(0.5)
    def drive(sub):
        x = torch.ones(20)
        m.eval()
        a = sub(x)
        m.train()
        torch.manual_seed(0)
        b = sub(x)
        return a, (b == 0).sum() > 0, (b == 2).sum() > 0
    return Program(m, drive=drive)
