import torch
from torch.autograd.function import once_differentiable
from harness import case, fn_program, t, Program, kw
from pk import drv

def T(*s, **k):
    return t(*s, **k)
W = lambda *s: T(*s, requires_grad=True)

class Sq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2 * x * g

class SaveOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * y

class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x
    @staticmethod
    def backward(ctx, g):
        return g * 2

class NonDiff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argmax()
        v = x.max()
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x, idx)
        return v, idx
    @staticmethod
    def backward(ctx, gv, gi):
        x, idx = ctx.saved_tensors
        r = torch.zeros_like(x)
        r[idx] = gv
        return r

class NonDiffFloat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        a = x * 2
        b = x * 3
        ctx.mark_non_differentiable(b)
        return a, b
    @staticmethod
    def backward(ctx, ga, gb):
        return ga * 2

class Needs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * y if ctx.needs_input_grad[0] else None
        gy = g * x * 10 if ctx.needs_input_grad[1] else None
        return gx, gy

class Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos()

class NoMat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3
    @staticmethod
    def backward(ctx, ga, gb):
        r = torch.zeros(())
        if ga is not None:
            r = r + ga * 2
        if gb is not None:
            r = r + gb * 3
        return r

class Mat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3
    @staticmethod
    def backward(ctx, ga, gb):
        return ga * 2 + gb * 3 + (gb == 0).float()

class CtxAttr(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        ctx.shape = x.shape
        return x * k
    @staticmethod
    def backward(ctx, g):
        return g * ctx.k + len(ctx.shape), None

class ViewOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view(-1)
    @staticmethod
    def backward(ctx, g):
        return g.view(2, 2) * 5

class IntIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        ctx.n = x.shape[0]
        return x[idx]
    @staticmethod
    def backward(ctx, g):
        idx, = ctx.saved_tensors
        r = torch.zeros(ctx.n, dtype=g.dtype)
        r.index_add_(0, idx, g)
        return r, None

class ReturnsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x
    @staticmethod
    def backward(ctx, g):
        return g * 7

class DoubleB(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3 * x * x

class NoneGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + y
    @staticmethod
    def backward(ctx, g):
        return g, None

class DtypeBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.double() * 2
    @staticmethod
    def backward(ctx, g):
        return g * 2

@case("tf")
def tf_sq():
    return drv(lambda x: Sq.apply(x) + 1, W(3), grad=True)

@case("tf")
def tf_sq_nograd_input():
    return drv(lambda x: Sq.apply(x), T(3))

@case("tf")
def tf_sq_under_no_grad():
    def f(x):
        with torch.no_grad():
            return Sq.apply(x)
    return drv(f, W(3))

@case("tf")
def tf_save_out():
    return drv(lambda x: SaveOut.apply(x * 2), W(3), grad=True)

@case("tf")
def tf_dirty_clone():
    return drv(lambda x: Dirty.apply(x.clone()) + 1, W(3), grad=True)

@case("tf")
def tf_dirty_input_nograd():
    return drv(lambda x: Dirty.apply(x), T(3))

@case("tf")
def tf_nondiff_idx():
    def f(x):
        v, i = NonDiff.apply(x)
        return v * 2, i
    return drv(f, W(4), grad=True)

@case("tf")
def tf_nondiff_float():
    def f(x):
        a, b = NonDiffFloat.apply(x)
        return a, b, a + b
    return drv(f, W(3), grad=True)

@case("tf")
def tf_needs_input_grad_x():
    return drv(lambda x, y: Needs.apply(x, y), W(3), T(3), grad=True)

@case("tf")
def tf_needs_input_grad_y():
    return drv(lambda x, y: Needs.apply(x, y), T(3), W(3), grad=True)

@case("tf")
def tf_needs_input_grad_both():
    return drv(lambda x, y: Needs.apply(x, y), W(3), W(3), grad=True)

@case("tf")
def tf_once_diff():
    return drv(lambda x: Once.apply(x) * 2, W(3), grad=True)

@case("tf")
def tf_once_diff_double_raises():
    def drive(sub):
        x = W(3)
        y = sub(x)
        g, = torch.autograd.grad(y.sum(), x, create_graph=True)
        g.sum().backward()
        return g
    return Program(lambda x: Once.apply(x), drive=drive)

@case("tf")
def tf_no_materialize_one_used():
    def f(x):
        a, b = NoMat.apply(x)
        return a
    return drv(f, W(3), grad=True)

@case("tf")
def tf_materialize_one_used():
    def f(x):
        a, b = Mat.apply(x)
        return a
    return drv(f, W(3), grad=True)

@case("tf")
def tf_ctx_attr():
    return drv(lambda x: CtxAttr.apply(x, 3.0), W(2, 2), grad=True)

@case("tf")
def tf_view_out():
    return drv(lambda x: ViewOut.apply(x), W(2, 2), grad=True)

@case("tf")
def tf_int_in():
    return drv(lambda x: IntIn.apply(x, torch.tensor([0, 2, 0])), W(3), grad=True)

@case("tf")
def tf_returns_input():
    return drv(lambda x: ReturnsInput.apply(x) * 1, W(3), grad=True)

@case("tf")
def tf_returns_input_direct():
    return drv(lambda x: ReturnsInput.apply(x), W(3), grad=True)

@case("tf")
def tf_double_backward():
    def drive(sub):
        x = W(3)
        y = sub(x)
        g, = torch.autograd.grad(y.sum(), x, create_graph=True)
        g2, = torch.autograd.grad(g.sum(), x)
        return g, g2
    return Program(lambda x: DoubleB.apply(x), drive=drive)

@case("tf")
def tf_none_grad():
    return drv(lambda x, y: NoneGrad.apply(x, y), W(3), W(3), grad=True)

@case("tf")
def tf_dtype_back():
    return drv(lambda x: DtypeBack.apply(x), W(3), grad=True)

@case("tf")
def tf_inside_loop():
    def f(x):
        for _ in range(3):
            x = Sq.apply(x) * 0.5
        return x
    return drv(f, W(3), grad=True)

@case("tf")
def tf_save_intermediate():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = x.sin()
            ctx.save_for_backward(m)
            return m * 2
        @staticmethod
        def backward(ctx, g):
            m, = ctx.saved_tensors
            return g * m
    return drv(lambda x: S.apply(x), W(3), grad=True)

@case("tf")
def tf_mutated_saved_after():
    def drive(sub):
        x = W(3)
        y = x * 1
        o = sub(y)
        with torch.no_grad():
            pass
        o.sum().backward()
        return x.grad
    return Program(lambda y: Sq.apply(y), drive=drive)

@case("tf")
def tf_modify_saved_raises():
    def drive(sub):
        x = W(3)
        y = x * 1
        o = sub(y)
        y.add_(1)
        o.sum().backward()
        return x.grad
    return Program(lambda y: Sq.apply(y), drive=drive)

@case("tf")
def tf_hook_on_output():
    def drive(sub):
        x = W(3)
        o = sub(x)
        o.register_hook(lambda g: g * 100)
        o.sum().backward()
        return x.grad
    return Program(lambda x: Sq.apply(x), drive=drive)

@case("tf")
def tf_vjp_inside():
    def f(x):
        y = Sq.apply(x)
        g, = torch.autograd.grad(y.sum(), x, create_graph=False)
        return g
    return drv(f, W(3))

@case("tf")
def tf_jvp_class_setup_context():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(x, k):
            return x * k
        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]
        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None
    return drv(lambda x: S.apply(x, 4), W(3), grad=True)

@case("tf")
def tf_output_requires_grad_when_input_no():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * 2, w + 0
        @staticmethod
        def backward(ctx, a, b):
            return a, b
    return drv(lambda x, w: S.apply(x, w), T(3), W(3), grad=True)

@case("tf")
def tf_non_tensor_output():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, 5
        @staticmethod
        def backward(ctx, g, _):
            return g * 2
    def f(x):
        a, n = S.apply(x)
        return a * n
    return drv(f, W(3), grad=True)

@case("tf")
def tf_grad_is_none_for_int():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.long(), x * 2
        @staticmethod
        def backward(ctx, gi, g):
            return g * 2
    def f(x):
        i, y = S.apply(x)
        return i, y
    return drv(f, W(3), grad=True)

@case("tf")
def tf_inplace_input_dirty_view():
    class S(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1)
            ctx.mark_dirty(x)
            return x
        @staticmethod
        def backward(ctx, g):
            return g
    def f(x):
        y = x.clone()
        z = S.apply(y[1:])
        return y, z
    return drv(f, W(4), grad=True)
