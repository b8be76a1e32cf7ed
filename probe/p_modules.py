import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import case, fn_program, t, Program, kw

class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls

@case("modules")
def m_module_counter_attr_mutated():
    return Program(Counted(), ((t(2, 3),), (t(2, 3),)))

@case("modules")
def m_training_flag_branch():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.0)
        def forward(self, x):
            if self.training:
                return self.drop(x) + 1
            return x - 1
    def between(s, i):
        s.eval()
    return Program(M(), ((t(3),), (t(3),)), between=between)

@case("modules")
def m_buffer_updated_running_stat():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("run", torch.zeros(3))
        def forward(self, x):
            self.run.mul_(0.9).add_(x.mean(0) * 0.1)
            return x - self.run
    return Program(M(), ((t(4, 3),), (t(4, 3),)))

@case("modules")
def m_batchnorm_train_eval():
    m = nn.BatchNorm1d(3)
    def between(s, i):
        if i == 2:
            s.eval()
    return Program(m, ((t(4, 3),), (t(4, 3),), (t(4, 3),)), between=between)

@case("modules")
def m_attribute_rebound_to_new_tensor():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = None
        def forward(self, x):
            if self.cache is None:
                self.cache = x * 2
            else:
                self.cache = self.cache + x
            return self.cache.sum()
    return Program(M(), ((t(3),), (t(3),), (t(3),)))

@case("modules")
def m_submodule_swapped_between_calls():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()
        def forward(self, x):
            return self.act(x)
    def between(s, i):
        s.act = nn.Tanh()
    return Program(M(), ((t(4),), (t(4),)), between=between)

@case("modules")
def m_parameter_modified_inplace_between_calls():
    lin = nn.Linear(2, 2)
    def between(s, i):
        with torch.no_grad():
            lin.weight.fill_(0.5)
    return Program(lin, ((t(1, 2),), (t(1, 2),)), between=between)

@case("modules")
def m_module_dict_iteration():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 1), "b": nn.Linear(2, 3)})
        def forward(self, x):
            return {k: h(x) for k, h in self.heads.items()}
    return Program(M(), ((t(2, 2),),))

@case("modules")
def m_parameter_list_sum():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(torch.ones(2) * i) for i in range(3)])
        def forward(self, x):
            for p in self.ps:
                x = x * p
            return x, len(self.ps)
    return Program(M(), ((t(2),),))

@case("modules")
def m_sequential_indexing_and_len():
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    def f(x):
        h = seq[0](x)
        return seq[1:](h), len(seq), seq[-1].out_features
    return fn_program(f, (t(2, 3),))

@case("modules")
def m_named_parameters_iteration():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2, bias=False)
        def forward(self, x):
            reg = sum(p.pow(2).sum() for n, p in self.named_parameters() if "weight" in n)
            return self.b(self.a(x)), reg, [n for n, _ in self.named_parameters()]
    return Program(M(), ((t(1, 2),),))

@case("modules")
def m_children_and_modules_count():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
        def forward(self, x):
            return self.s(x) * len(list(self.modules())) + len(list(self.children()))
    return Program(M(), ((t(1, 2),),))

@case("modules")
def m_forward_calls_other_method_with_kwargs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
        def helper(self, x, *, scale=1.0, shift=0.0):
            return self.lin(x) * scale + shift
        def forward(self, x):
            return self.helper(x, scale=2.0) + self.helper(x, shift=1.0)
    return Program(M(), ((t(2, 3),),))

@case("modules")
def m_module_property():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
        @property
        def dim(self):
            return self.lin.in_features
        def forward(self, x):
            return x * self.dim
    return Program(M(), ((t(3),),))

@case("modules")
def m_register_parameter_in_forward_none():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_parameter("bias", None)
            self.w = nn.Parameter(torch.ones(3))
        def forward(self, x):
            y = x * self.w
            if self.bias is not None:
                y = y + self.bias
            return y
    return Program(M(), ((t(3),),))

@case("modules")
def m_functional_calls_with_weights():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3))
        def forward(self, x):
            return F.gelu(F.linear(x, self.w)), F.softmax(x, dim=-1), F.layer_norm(x, (3,))
    return Program(M(), ((t(2, 3),),))

@case("modules")
def m_conv_pool_pipeline():
    m = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 2))
    return Program(m, ((t(1, 2, 4, 4),),))

@case("modules")
def m_embedding_and_lstm():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 4)
            self.rnn = nn.GRU(4, 5, batch_first=True)
        def forward(self, idx):
            out, h = self.rnn(self.e(idx))
            return out.sum(1), h.shape
    return Program(M(), ((torch.randint(0, 10, (2, 3)),),))

@case("modules")
def m_multihead_attention():
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    def f(x):
        o, w = m(x, x, x)
        return o, w
    return fn_program(f, (t(2, 3, 8),))

@case("modules")
def m_module_train_backward_grads():
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    def drive(cm):
        x = torch.randn(5, 3)
        l = cm(x).pow(2).mean()
        l.backward()
        return l, [p.grad for p in m.parameters()]
    return Program(m, drive=drive)

@case("modules")
def m_optimizer_step_outside():
    def drive(cm):
        torch.manual_seed(0)
        m = nn.Linear(3, 1)
        c = cm.__class__ if False else None
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        import kiln
        outs = []
        step = cm
        for _ in range(3):
            opt.zero_grad()
            l = step(m, torch.ones(2, 3))
            l.backward()
            opt.step()
            outs.append(l.detach())
        return outs, m.weight
    def f(m, x):
        return m(x).sum()
    return Program(f, drive=drive)

@case("hooks")
def h_forward_hook_modifies_output():
    m = nn.Linear(2, 2)
    m.register_forward_hook(lambda mod, inp, out: out * 2)
    return Program(m, ((t(1, 2),),))

@case("hooks")
def h_forward_pre_hook_modifies_input():
    m = nn.Linear(2, 2)
    m.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))
    return Program(m, ((t(1, 2),),))

@case("hooks")
def h_hook_on_submodule_records():
    log = []
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    m[0].register_forward_hook(lambda mod, i, o: log.append(o.shape))
    return Program(m, ((t(1, 2),), (t(3, 2),)), observe=lambda: list(log))

@case("hooks")
def h_tensor_register_hook_scales_grad():
    def f(x):
        y = x * 2
        y.register_hook(lambda g: g * 10)
        return y.sum()
    def drive(cf):
        x = torch.ones(3, requires_grad=True)
        l = cf(x)
        l.backward()
        return l, x.grad
    return Program(f, drive=drive)

@case("hooks")
def h_hook_removed_between_calls():
    m = nn.Linear(2, 2)
    h = m.register_forward_hook(lambda mod, i, o: o + 100)
    def between(s, i):
        h.remove()
    return Program(m, ((t(1, 2),), (t(1, 2),)), between=between)

@case("hooks")
def h_backward_hook_on_module():
    log = []
    m = nn.Linear(2, 2)
    m.register_full_backward_hook(lambda mod, gi, go: log.append(go[0].shape))
    def drive(cm):
        out = cm(torch.ones(1, 2, requires_grad=True))
        out.sum().backward()
        return out, list(log), m.weight.grad
    return Program(m, drive=drive)

@case("hooks")
def h_leaf_grad_accumulate_hook():
    def f(w, x):
        return (w * x).sum()
    def drive(cf):
        w = torch.ones(3, requires_grad=True)
        seen = []
        w.register_hook(lambda g: seen.append(g.clone()))
        l = cf(w, torch.arange(3.0))
        l.backward()
        return seen, w.grad
    return Program(f, drive=drive)

@case("hooks")
def h_state_dict_hook_unaffected():
    m = nn.Linear(2, 2)
    def f(x):
        return m(x), sorted(m.state_dict().keys())
    return fn_program(f, (t(1, 2),))
