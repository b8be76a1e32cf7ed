import torch
import torch.nn.functional as F
from harness import case, fn_program, t, Program, kw
from pk import drv

def T(*s, **k):
    return t(*s, **k)

W = lambda *s: T(*s, requires_grad=True)

# grad modes x externs: inside the compiled function
def _gm(name, op, mk, mode):
    def build():
        args = mk()
        def f(*a):
            if mode == "no_grad":
                with torch.no_grad():
                    r = op(*a)
                return r, op(*a) * 2
            if mode == "inference":
                with torch.inference_mode():
                    r = op(*a)
                return r.clone() if False else r * 1
            if mode == "sge_false":
                with torch.set_grad_enabled(False):
                    r = op(*a)
                return r
            if mode == "enable_in_nograd":
                with torch.enable_grad():
                    return op(*a)
            return op(*a)
        if mode == "enable_in_nograd":
            def drive(sub):
                with torch.no_grad():
                    o = sub(*args)
                return o, o.requires_grad
            return Program(f, drive=drive)
        if mode == "outer_nograd":
            def drive(sub):
                with torch.no_grad():
                    o = sub(*args)
                o2 = sub(*args)
                return o, o.requires_grad, o2.requires_grad, o2
            return Program(f, drive=drive)
        return drv(f, *args, grad=True, strides=False)
    build.__name__ = f"tg_{name}_{mode}"
    case("tg")(build)

EXT = {
    "mm": (torch.mm, lambda: (W(2, 3), T(3, 4))),
    "bmm": (torch.bmm, lambda: (T(2, 2, 3), W(2, 3, 2))),
    "addmm": (torch.addmm, lambda: (W(4), T(2, 3), W(3, 4))),
    "linear": (F.linear, lambda: (T(2, 3), W(4, 3), W(4))),
    "conv1d": (lambda x, w: F.conv1d(x, w, padding=1), lambda: (T(1, 2, 5), W(3, 2, 3))),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2), lambda: (T(1, 2, 5, 5), W(3, 2, 3, 3), W(3))),
    "conv3d": (lambda x, w: F.conv3d(x, w), lambda: (W(1, 1, 3, 3, 3), T(2, 1, 2, 2, 2))),
    "convt": (lambda x, w: F.conv_transpose2d(x, w, stride=2), lambda: (T(1, 2, 3, 3), W(2, 3, 2, 2))),
    "embedding": (lambda i, w: F.embedding(i, w), lambda: (torch.tensor([[0, 2], [1, 1]]), W(4, 3))),
    "index_select": (lambda x, i: x.index_select(0, i) * 2, lambda: (W(4, 2), torch.tensor([3, 1, 3]))),
    "gather": (lambda x: x.gather(1, torch.tensor([[0, 0], [1, 0]])), lambda: (W(2, 2),)),
    "scatter": (lambda x, s: x.scatter(0, torch.tensor([[1, 0]]), s), lambda: (W(2, 2), W(1, 2))),
    "sort": (lambda x: x.sort(1)[0] * torch.arange(4.), lambda: (W(3, 4),)),
    "topk": (lambda x: x.topk(2)[0].exp(), lambda: (W(3, 5),)),
    "cumsum": (lambda x: x.cumsum(1).cos(), lambda: (W(2, 5),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), lambda: (W(3, 4), W(4), W(4))),
    "bn_train": (lambda x, w, b: F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b, training=True),
                 lambda: (W(4, 3), W(3), W(3))),
    "bn_eval": (lambda x, w, b: F.batch_norm(x, torch.zeros(3) + 0.5, torch.ones(3) * 2, w, b, training=False),
                lambda: (W(4, 3), W(3), W(3))),
}
for _n, (_op, _mk) in EXT.items():
    for _m in ("plain", "no_grad", "inference", "sge_false", "enable_in_nograd", "outer_nograd"):
        _gm(_n, _op, _mk, _m)

@case("tg")
def tg_bn_running_stats_update():
    rm, rv = torch.zeros(3), torch.ones(3)
    def f(x):
        return F.batch_norm(x, rm, rv, training=True, momentum=0.3)
    p = drv(f, W(5, 3), grad=True)
    d = p.drive
    p.drive = lambda sub: (d(sub), rm.clone(), rv.clone(), rm._version > 0)
    return p

@case("tg")
def tg_bn_module_nograd_train():
    m = torch.nn.BatchNorm1d(3)
    def drive(sub):
        x = T(4, 3)
        with torch.no_grad():
            o = sub(x)
        return o, m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()
    return Program(m, drive=drive)

@case("tg")
def tg_dropout_seed_fallback():
    def f(x):
        torch.manual_seed(3)
        return F.dropout(x, 0.5, training=True)
    return drv(f, T(50), strides=False)

@case("tg")
def tg_dropout_eval():
    return drv(lambda x: F.dropout(x, 0.5, training=False), W(5), grad=True)

@case("tg")
def tg_rand_like_seed():
    def f(x):
        torch.manual_seed(1)
        return torch.rand_like(x) + torch.randn_like(x)
    return drv(f, T(6))

@case("tg")
def tg_randn_seed_dtype():
    def f(x):
        torch.manual_seed(5)
        return torch.randn(3, dtype=torch.float64) + x
    return drv(f, T(3, dtype=torch.float64))

@case("tg")
def tg_lstm_nograd():
    m = torch.nn.LSTM(3, 4, batch_first=True)
    def drive(sub):
        x = T(2, 5, 3)
        with torch.no_grad():
            o, (h, c) = sub(x)
        o2, _ = sub(x)
        o2.sum().backward()
        return o, h, c, o.requires_grad, o2.requires_grad, m.weight_ih_l0.grad.clone()
    return Program(m, drive=drive)

@case("tg")
def tg_gru_grad():
    m = torch.nn.GRU(3, 2)
    def drive(sub):
        x = T(4, 1, 3, requires_grad=True)
        o, h = sub(x)
        (o.sum() + h.sum()).backward()
        return o, h, x.grad, m.weight_hh_l0.grad
    return Program(m, drive=drive)

@case("tg")
def tg_detach_inside():
    def f(x):
        y = x * 2
        z = y.detach()
        return y + z, z
    return drv(f, W(3), grad=True)

@case("tg")
def tg_detach_inplace_inside():
    def f(x):
        y = x * 2
        y.detach_()
        return y + x
    return drv(f, W(3), grad=True)

@case("tg")
def tg_requires_grad_inside():
    def f(x):
        y = x.clone()
        y.requires_grad_()
        return y * 2
    return drv(f, T(3))

@case("tg")
def tg_requires_grad_inside_leaf_input():
    def f(x):
        x.requires_grad_()
        return x * 2
    return drv(f, T(3))

@case("tg")
def tg_data_read_inside():
    def f(x):
        return x.data * 2 + x
    return drv(f, W(3), grad=True)

@case("tg")
def tg_retain_grad():
    def drive(sub):
        x = W(3)
        y = sub(x)
        y.retain_grad()
        (y * y).sum().backward()
        return y.grad, x.grad
    return Program(lambda x: x * 3, drive=drive)

@case("tg")
def tg_retain_grad_inside():
    def f(x):
        y = x * 3
        y.retain_grad()
        return y
    def drive(sub):
        x = W(3)
        y = sub(x)
        y.sum().backward()
        return x.grad
    return Program(f, drive=drive)

@case("tg")
def tg_register_hook_output():
    def drive(sub):
        x = W(3)
        y = sub(x)
        y.register_hook(lambda g: g * 10)
        y.sum().backward()
        return x.grad
    return Program(lambda x: x.sin(), drive=drive)

@case("tg")
def tg_register_hook_inside():
    def f(x):
        y = x * 2
        y.register_hook(lambda g: g + 1)
        return y.sum()
    def drive(sub):
        x = W(3)
        sub(x).backward()
        return x.grad
    return Program(f, drive=drive)

@case("tg")
def tg_leaf_hook_inside():
    def f(x):
        x.register_hook(lambda g: g * 3)
        return (x * x).sum()
    def drive(sub):
        x = W(3)
        sub(x).backward()
        return x.grad
    return Program(f, drive=drive)

@case("tg")
def tg_double_backward():
    def drive(sub):
        x = W(3)
        y = sub(x)
        g, = torch.autograd.grad(y, x, create_graph=True)
        g.sum().backward()
        return g, x.grad
    return Program(lambda x: (x ** 3).sum(), drive=drive)

@case("tg")
def tg_double_backward_tanh():
    def drive(sub):
        x = W(4)
        y = sub(x)
        g, = torch.autograd.grad(y.sum(), x, create_graph=True)
        g2, = torch.autograd.grad(g.sum(), x)
        return g, g2
    return Program(lambda x: torch.tanh(x) * x, drive=drive)

@case("tg")
def tg_autograd_grad_inside():
    def f(x):
        y = (x * x).sum()
        g, = torch.autograd.grad(y, x)
        return g
    return drv(f, W(3))

@case("tg")
def tg_autograd_grad_inside_create():
    def f(x):
        with torch.enable_grad():
            x2 = x.detach().requires_grad_()
            y = (x2.sin()).sum()
            g, = torch.autograd.grad(y, x2, create_graph=True)
        return g
    return drv(f, T(3))

@case("tg")
def tg_backward_inside():
    def f(x):
        y = (x * 2).sum()
        y.backward()
        return x.grad
    return drv(f, W(3))

@case("tg")
def tg_grad_attr_read():
    def f(x):
        return x.grad * 2 if x.grad is not None else x * 0
    def drive(sub):
        x = W(3)
        a = sub(x)
        (x * 5).sum().backward()
        b = sub(x)
        return a, b
    return Program(f, drive=drive)

@case("tg")
def tg_requires_grad_mix_outputs():
    def f(x, y):
        return x * 2, y * 2, x + y, (x * 0).detach()
    return drv(f, W(3), T(3), grad=True)

@case("tg")
def tg_int_output_with_grad_input():
    def f(x):
        return x.argmax(), (x > 0), x.long(), x * 1
    return drv(f, W(4), grad=True)

@case("tg")
def tg_param_no_grad_module():
    m = torch.nn.Linear(3, 2)
    def drive(sub):
        x = T(2, 3)
        with torch.no_grad():
            o = sub(x)
        o2 = sub(x)
        o2.sum().backward()
        return o, o.requires_grad, o2, m.weight.grad, m.bias.grad
    return Program(m, drive=drive)

@case("tg")
def tg_inference_tensor_input():
    with torch.inference_mode():
        x = T(3)
    return drv(lambda a: a * 2, x)

@case("tg")
def tg_inference_mode_outer():
    def drive(sub):
        x = W(3)
        with torch.inference_mode():
            o = sub(x)
        return o, o.requires_grad, o.is_inference()
    return Program(lambda x: x.exp() + 1, drive=drive)

@case("tg")
def tg_set_grad_enabled_fn():
    def f(x):
        torch.set_grad_enabled(False)
        y = x * 2
        torch.set_grad_enabled(True)
        return y, x * 3
    return drv(f, W(3), grad=True)

@case("tg")
def tg_no_grad_decorator_inner():
    @torch.no_grad()
    def g(x):
        return x * 2
    def f(x):
        return g(x) + x
    return drv(f, W(3), grad=True)

@case("tg")
def tg_is_grad_enabled_branch():
    def f(x):
        if torch.is_grad_enabled():
            return x * 2
        return x * 3
    def drive(sub):
        x = W(3)
        a = sub(x)
        with torch.no_grad():
            b = sub(x)
        return a, b
    return Program(f, drive=drive, )

@case("tg")
def tg_grad_of_inplace_input_view():
    def f(x, y):
        z = x.clone()
        z[:, 0] = y
        return z
    return drv(f, W(2, 3), W(2), grad=True)

@case("tg")
def tg_grad_scatter_inplace():
    def f(x, s):
        z = x * 1
        z.scatter_(1, torch.tensor([[0], [2]]), s)
        return z
    return drv(f, W(2, 3), W(2, 1), grad=True)

@case("tg")
def tg_grad_index_put_accumulate():
    def f(x, v):
        z = x.clone()
        z.index_put_((torch.tensor([0, 0]),), v, accumulate=True)
        return z
    return drv(f, W(3), W(2), grad=True)

@case("tg")
def tg_grad_masked_fill():
    return drv(lambda x: x.masked_fill(x > 0, 0.5) * x, W(5), grad=True)

@case("tg")
def tg_grad_where_scalar():
    return drv(lambda x: torch.where(x > 0, x, 0.0) + torch.where(x < 0, 1.0, x * 2), W(5), grad=True)

@case("tg")
def tg_grad_clamp_tensor_bounds():
    return drv(lambda x, lo, hi: x.clamp(lo, hi), W(5), W(5), W(5), grad=True)

@case("tg")
def tg_grad_max_ties():
    return drv(lambda x: x.max() + x.amax(), torch.tensor([1.0, 3.0, 3.0], requires_grad=True), grad=True)

@case("tg")
def tg_grad_norm_zero():
    return drv(lambda x: x.norm() + x.abs().sum(), torch.zeros(3, requires_grad=True), grad=True)

@case("tg")
def tg_grad_pow_zero():
    return drv(lambda x: x ** 0.5 + torch.pow(x, 2), torch.tensor([0.0, 1.0, 4.0], requires_grad=True), grad=True)
