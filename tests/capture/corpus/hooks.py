"""Corpus: hooks: module forward pre/post hooks (changing inputs and outputs, with kwargs), full
backward hooks on the compiled top-level module and on submodules, tensor hooks registered inside
the frame, hooks added and removed between calls, and global module hooks.

Hooks record into lists the oracle observes. Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import torch
from torch import nn

from .program import Program, case, fn_program, kw, t


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@case("hooks")
def forward_hook_changes_output_of_top_module():
    net = Two()
    net.register_forward_hook(lambda mod, args, out: out * 10)
    return Program(net, ((t(2),),))


@case("hooks")
def forward_pre_hook_changes_input_of_submodule():
    net = Two()
    net.a.register_forward_pre_hook(lambda mod, args: (args[0] + 100,))
    return Program(net, ((t(2),),))


@case("hooks")
def forward_hook_records_shapes():
    net = Two()
    seen = []
    net.a.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    net.b.register_forward_hook(lambda mod, args, out: seen.append(out.shape[-1]))
    return Program(net, ((t(3, 2),), (t(1, 2),)), observe=lambda: list(seen))


@case("hooks")
def forward_hook_with_kwargs():
    class Net(nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    net = Net()
    net.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"scale": kwargs.get("scale", 1.0) * 2}),
                                  with_kwargs=True)
    return Program(net, (kw(t(2), scale=3.0),))


@case("hooks")
def hook_added_between_calls():
    net = Two()

    def add_hook(compiled, i):
        net.b.register_forward_hook(lambda mod, args, out: out + 1000)
    return Program(net, ((t(2),), (t(2),)), between=add_hook)


@case("hooks")
def hook_removed_between_calls():
    net = Two()
    handle = net.register_forward_hook(lambda mod, args, out: out * 0)

    def remove(compiled, i):
        handle.remove()
    return Program(net, ((t(2),), (t(2),)), between=remove)


@case("hooks")
def full_backward_hook_on_top_module():
    net = Two()
    grads = []
    net.register_full_backward_hook(lambda mod, grad_in, grad_out: grads.append(grad_out[0].clone()))

    def drive(compiled):
        x = torch.ones(3, 2, requires_grad=True)
        compiled(x).sum().backward()
        return len(grads), grads, x.grad
    return Program(net, drive=drive)


@case("hooks", fullgraph=False)
def full_backward_hook_on_submodule():
    net = Two()
    grads = []
    net.a.register_full_backward_hook(lambda mod, grad_in, grad_out: grads.append(grad_out[0].sum()))

    def drive(compiled):
        x = torch.ones(3, 2, requires_grad=True)
        compiled(x).sum().backward()
        return grads, x.grad
    return Program(net, drive=drive)


@case("hooks", fullgraph=False)
def backward_hook_scales_gradient():
    net = Two()
    net.a.register_full_backward_hook(lambda mod, grad_in, grad_out: (grad_in[0] * 3,))

    def drive(compiled):
        x = torch.ones(2, 2, requires_grad=True)
        compiled(x).sum().backward()
        return x.grad
    return Program(net, drive=drive)


@case("hooks")
def tensor_hook_registered_in_frame():
    def f(x):
        y = x * 2
        y.register_hook(lambda g: g * 3)
        return y.sum()

    def drive(compiled):
        x = torch.ones(3, requires_grad=True)
        compiled(x).backward()
        return x.grad
    return Program(f, drive=drive)


@case("hooks")
def tensor_hook_on_input_records():
    grads = []

    def f(x):
        x.register_hook(lambda g: grads.append(g.clone()))
        return (x * x).sum()

    def drive(compiled):
        x = torch.ones(2, requires_grad=True)
        compiled(x).backward()
        return grads, x.grad
    return Program(f, drive=drive)


@case("hooks")
def parameter_post_accumulate_grad_hook():
    net = nn.Linear(2, 1)
    seen = []
    net.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.sum()))

    def drive(compiled):
        compiled(torch.ones(1, 2)).sum().backward()
        return seen
    return Program(net, drive=drive)


@case("hooks")
def global_module_forward_hook():
    seen = []

    def hook(mod, args, out):
        seen.append(type(mod).__name__)

    def drive(compiled):
        handle = nn.modules.module.register_module_forward_hook(hook)
        try:
            out = compiled(torch.ones(2))
        finally:
            handle.remove()
        return out, seen
    return Program(Two(), drive=drive)


@case("hooks")
def state_dict_hook_not_triggered_by_forward():
    net = Two()
    seen = []
    net._register_state_dict_hook(lambda *a: seen.append(1))
    return Program(net, ((t(2),),), observe=lambda: len(seen))


@case("hooks")
def forward_hook_with_always_call_and_prepend():
    net = Two()
    order = []
    net.register_forward_hook(lambda m, a, o: order.append("second"))
    net.register_forward_hook(lambda m, a, o: order.append("first"), prepend=True)
    return Program(net, ((t(2),),), observe=lambda: list(order))


@case("hooks")
def pre_hook_returning_none_keeps_input():
    net = Two()
    calls = []
    net.register_forward_pre_hook(lambda mod, args: calls.append(len(args)))
    return Program(net, ((t(2),), (t(2),)), observe=lambda: list(calls))


@case("hooks")
def hooks_on_module_called_by_function():
    lin = nn.Linear(2, 2)
    lin.register_forward_hook(lambda m, a, o: o.relu())

    def f(x):
        return lin(x) + lin(x * 2)
    return fn_program(f, (t(2),))


@case("hooks")
def global_forward_hook_runs_once_around_compiled_module():
    seen = []

    def drive(subject):
        h = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o + 1)
        try:
            return subject(torch.ones(2, 3))
        finally:
            h.remove()

    lin = nn.Linear(3, 3)
    return Program(lin, drive=drive)


@case("hooks", fullgraph=False)
def global_hook_registered_between_calls_reaches_inlined_module():
    lin = nn.Linear(3, 3)
    handles = []

    def f(x):
        return lin(x) * 2

    def between(s, i):
        if i == 1:
            handles.append(torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: o + 100))
        if i == 2:
            handles.pop().remove()
    return fn_program(f, (t(1, 3),), (t(1, 3),), (t(1, 3),), between=between)


@case("hooks", fullgraph=False)
def global_pre_hook_registered_between_calls_reaches_submodule():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x).relu()
    handles = []

    def between(s, i):
        if i == 1:
            handles.append(torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: (a[0] + 1,)))
        if i == 2:
            handles.pop().remove()
    return Program(M(), ((t(1, 3),), (t(1, 3),), (t(1, 3),)), between=between)


@case("hooks")
def hook_bound_method_counts_calls_of_a_submodule():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.calls = 0
            self.lin.register_forward_hook(self._count)

        def _count(self, mod, i, o):
            self.calls += 1
            return o * self.calls

        def forward(self, x):
            return self.lin(x) + self.lin(x)
    m = M()
    return Program(m, ((t(1, 3),), (t(1, 3),)), observe=lambda: m.calls)


@case("hooks")
def forward_pre_hook_with_kwargs_returns_new_args():
    m = nn.Linear(3, 3)

    def pre(mod, args, kwargs):
        return (args[0] + 1,), kwargs
    m.register_forward_pre_hook(pre, with_kwargs=True)
    return Program(m, ((t(2, 3),), (t(2, 3),)))


@case("hooks")
def pre_hook_with_kwargs_rewrites_keyword_argument():
    class M(nn.Module):
        def forward(self, x, *, bias):
            return x + bias

    m = M()

    def pre(mod, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["bias"] = kwargs["bias"] * 10
        return args, kwargs
    m.register_forward_pre_hook(pre, with_kwargs=True)

    def f(x):
        return m(x, bias=x + 1)
    return fn_program(f, (t(3),))


@case("hooks", fullgraph=False)
def hook_counter_state_across_graph_break():
    m = nn.Linear(2, 2)
    cnt = {"n": 0}

    def hook(mod, i, o):
        cnt["n"] += 1
        return o + cnt["n"]
    m.register_forward_hook(hook)

    def f(x):
        a = m(x)
        print("brk")
        return m(a)
    return fn_program(f, (t(1, 2),), (t(1, 2),), observe=lambda: dict(cnt))


@case("hooks")
def hooks_on_each_modulelist_child_in_loop():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

        def forward(self, x):
            for l in self.layers:
                x = l(x)
            return x
    m = M()
    names = []
    for i, l in enumerate(m.layers):
        l.register_forward_hook(lambda mod, a, o, i=i: (names.append(i), o * (i + 1))[1])
    return Program(m, ((t(1, 2),),), observe=lambda: list(names))


@case("hooks", fullgraph=False)
def pre_hook_with_kwargs_added_between_calls():
    class M(nn.Module):
        def forward(self, x, s=1.0):
            return x * s
    m = M()

    def mutate(i):
        if i == 1:
            m.register_forward_pre_hook(lambda mod, a, k: (a, {"s": 4.0}), with_kwargs=True)
    return fn_program(lambda x: m(x), (t(2),), (t(2),), (t(2),), between=lambda s, i: mutate(i))
