"""nn.Module programs of the kind PyTorch tests Dynamo with, part c: the corners of parts a and b
(one-shot hooks that remove themselves, learnable parametrizations, tied weights, load_state_dict
with assign=True, nested-tensor fast paths of the Transformer encoder, instance norm with running
stats, dtype moves between calls, dropout between RNN layers). Same conventions as part a.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from modules3_programs_a import G, X, d, step


def hook_one_shot_removes_itself(C):
    m = nn.Linear(3, 3); box = {}

    def once(mod, args, out):
        box["h"].remove()
        return out * 100
    box["h"] = m.register_forward_hook(once); cm = C(m); x = X(2, 3)
    return step(cm, m, x) + step(cm, m, x)


def hook_pre_sets_module_attr(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3); s.calls = 0

        def forward(s, x):
            return s.l(x) * s.calls

    def pre(mod, args):
        mod.calls += 1
    m = M(); m.register_forward_pre_hook(pre); cm = C(m)
    out = [d(cm(X(2, 3))) for _ in range(3)]
    return out + [m.calls]


def hook_on_module_called_twice(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            return s.l(s.l(x))
    m = M(); seen = []
    m.l.register_forward_hook(lambda mod, a, o: seen.append(o.shape) or o + 1); cm = C(m)
    return step(cm, m, X(2, 3)) + [seen]


def hook_pre_with_kwargs_returns_none(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x, *, k=1.0):
            return s.l(x) * k
    m = M(); seen = []
    m.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    cm = C(m)
    return step(cm, m, X(2, 3), k=2.0) + step(cm, m, X(2, 3)) + [seen]


def hook_global_full_backward(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh()); cm = C(m); seen = []
    h = nn.modules.module.register_module_full_backward_hook(lambda mod, gi, go: seen.append(type(mod).__name__))
    try:
        out = step(cm, m, X(2, 3))
    finally:
        h.remove()
    return out + [sorted(seen)]


def hook_forward_on_container_child_changes_output_dtype(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    m[0].register_forward_hook(lambda mod, a, o: o.double())
    cm = C(nn.Sequential(m, nn.Identity()))
    y = cm(X(2, 3))
    return [d(y), y.dtype]


def param_learnable_parametrization(C):
    class LearnedScale(nn.Module):
        def __init__(s):
            super().__init__(); s.s = nn.Parameter(torch.tensor(1.5))

        def forward(s, W):
            return W * s.s
    m = nn.Linear(3, 3); parametrize.register_parametrization(m, "weight", LearnedScale()); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3))


def param_unsafe_shape_change(C):
    class FirstRows(nn.Module):
        def forward(s, W):
            return W[:2]
    m = nn.Linear(3, 4); parametrize.register_parametrization(m, "weight", FirstRows(), unsafe=True)
    m.bias = nn.Parameter(torch.zeros(2)); cm = C(m)
    return step(cm, m, X(2, 3))


def param_cached_in_forward_backward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)
            parametrize.register_parametrization(s.l, "weight", nn.Identity())
            parametrize.register_parametrization(s.l, "weight", nn.Tanh())

        def forward(s, x):
            with parametrize.cached():
                return s.l(x) + s.l(2 * x) + s.l.weight.sum()
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def tied_weights(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.emb = nn.Embedding(5, 3); s.out = nn.Linear(3, 5, bias=False)
            s.out.weight = s.emb.weight

        def forward(s, idx):
            return s.out(s.emb(idx))
    m = M(); cm = C(m)
    return step(cm, m, torch.tensor([1, 2, 3])) + [len(list(m.parameters()))]


def tied_weights_untied_between(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3, bias=False); s.b = nn.Linear(3, 3, bias=False)
            s.b.weight = s.a.weight

        def forward(s, x):
            return s.b(s.a(x))
    m = M(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.b.weight = nn.Parameter(torch.eye(3))
    return out + step(cm, m, x)


def load_state_dict_assign(C):
    m = nn.Linear(3, 2); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    old = m.weight
    m.load_state_dict({"weight": torch.ones(2, 3), "bias": torch.zeros(2)}, assign=True)
    return out + step(cm, m, x) + [m.weight is old, type(m.weight).__name__]


def module_deepcopied_compiled(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)); cm = C(m)
    out = step(cm, m, X(4, 3))
    m2 = copy.deepcopy(m); cm2 = C(m2)
    return out + step(cm2, m2, X(4, 3)) + [d(m[1].running_mean), d(m2[1].running_mean)]


def module_to_double_between(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)); cm = C(m)
    out = step(cm, m, X(2, 3))
    m.double()
    return out + step(cm, m, X(2, 3).double())


def module_half_then_float(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    a = cm(x)
    m.bfloat16(); b = cm(x.bfloat16())
    m.float(); c = cm(x)
    return [d(a), d(b), d(c), b.dtype]


def register_parameter_in_forward(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "w"):
                s.register_parameter("w", nn.Parameter(torch.ones(3)))
            return x * s.w
    m = M(); cm = C(m)
    out = [d(cm(X(2, 3))) for _ in range(2)]
    y = cm(X(2, 3)); y.sum().backward()
    return out + [d(m.w.grad), sorted(dict(m.named_parameters()))]


def params_to_vector_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 2); s.b = nn.Linear(2, 2)

        def forward(s, x):
            v = nn.utils.parameters_to_vector(s.parameters())
            return s.b(s.a(x)).sum() + v.norm()
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def zero_grad_in_compiled_step(C):
    m = nn.Linear(3, 2)

    def train(x):
        m.zero_grad()
        loss = m(x).pow(2).sum()
        loss.backward()
        return loss
    cf = C(train); out = []
    for _ in range(2):
        out += [d(cf(X(4, 3))), G(m)]
    return out


def instance_norm_running_stats(C):
    m = nn.InstanceNorm1d(3, affine=True, track_running_stats=True); cm = C(m); out = []
    for _ in range(2):
        out += step(cm, m, X(2, 3, 5)) + [d(m.running_mean), d(m.running_var)]
    m.eval()
    return out + [d(cm(X(2, 3, 5)))]


def batchnorm_no_running_stats_eval(C):
    m = nn.BatchNorm1d(3, track_running_stats=False); cm = C(m)
    out = step(cm, m, X(4, 3))
    m.eval()
    return out + step(cm, m, X(4, 3))


def group_norm_and_layer_norm_no_affine(C):
    m = nn.Sequential(nn.Conv1d(4, 4, 1), nn.GroupNorm(2, 4), nn.LayerNorm(5, elementwise_affine=False)); cm = C(m)
    return step(cm, m, X(2, 4, 5))


def lstm_dropout_between_layers(C):
    m = nn.LSTM(3, 4, num_layers=2, dropout=0.5); cm = C(m)
    torch.manual_seed(7)
    return step(cm, m, X(4, 2, 3))


def transformer_encoder_nested_fast_path(C):
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    m = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval(); cm = C(m)
    mask = torch.tensor([[False, False, False, True], [False, False, True, True]])
    # the padded positions are compared as zeros: eager's nested-tensor path leaves zeros there, and
    # under compilation the encoder itself takes the padded path (`torch.compiler.is_compiling()`
    # skips its mask check), whose padded rows hold values, as torch.compile's do
    with torch.no_grad():
        y = cm(X(2, 4, 8), src_key_padding_mask=mask)
        return [d(y.masked_fill(mask[..., None], 0.0)), d(cm(X(2, 4, 8)))]


def transformer_encoder_nested_with_grad(C):
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    m = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=True).eval(); cm = C(m)
    mask = torch.tensor([[False, False, False, True], [False, False, True, True]])
    return step(cm, m, X(2, 4, 8), src_key_padding_mask=mask)


def mha_fast_path_key_padding(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True).eval(); cm = C(m)
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])
    q = X(2, 4, 8)
    with torch.no_grad():
        out, w = cm(q, q, q, key_padding_mask=kpm)
        out2, w2 = cm(q, q, q, key_padding_mask=kpm, need_weights=False)
    return [d(out), d(w), d(out2), w2]


def embedding_max_norm_in_model_backward(C):
    torch.manual_seed(9)

    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.e = nn.Embedding(6, 3, max_norm=1.0); s.l = nn.Linear(3, 1)
            with torch.no_grad():
                s.e.weight.mul_(4)

        def forward(s, idx):
            return s.l(s.e(idx)).sum() + s.e.weight.sum()
    m = M(); cm = C(m); out = []
    for idx in (torch.tensor([0, 1]), torch.tensor([1, 4, 4])):
        out += step(cm, m, idx) + [d(m.e.weight)]
    return out


def clip_grad_norm_foreach_and_error(C):
    m = nn.Linear(3, 3)
    m(X(2, 3)).sum().backward()
    m.weight.grad[0, 0] = float("nan")
    f = C(lambda: nn.utils.clip_grad_norm_(m.parameters(), 1.0, error_if_nonfinite=True))
    return [f()]


def spectral_norm_conv_transpose(C):
    torch.manual_seed(1)
    m = nn.utils.parametrizations.spectral_norm(nn.ConvTranspose1d(2, 3, 3)); cm = C(m)
    return step(cm, m, X(1, 2, 5))


def skip_init_module(C):
    m = nn.utils.skip_init(nn.Linear, 3, 3)
    with torch.no_grad():
        m.weight.copy_(torch.eye(3)); m.bias.zero_()
    cm = C(m)
    return step(cm, m, X(2, 3))


PROGRAMS_C = [hook_one_shot_removes_itself, hook_pre_sets_module_attr, hook_on_module_called_twice,
              hook_pre_with_kwargs_returns_none, hook_global_full_backward,
              hook_forward_on_container_child_changes_output_dtype, param_learnable_parametrization,
              param_unsafe_shape_change, param_cached_in_forward_backward, tied_weights, tied_weights_untied_between,
              load_state_dict_assign, module_deepcopied_compiled, module_to_double_between, module_half_then_float,
              register_parameter_in_forward, params_to_vector_in_forward, zero_grad_in_compiled_step,
              instance_norm_running_stats, batchnorm_no_running_stats_eval, group_norm_and_layer_norm_no_affine,
              lstm_dropout_between_layers, transformer_encoder_nested_fast_path, transformer_encoder_nested_with_grad,
              mha_fast_path_key_padding, embedding_max_norm_in_model_backward, clip_grad_norm_foreach_and_error,
              spectral_norm_conv_transpose, skip_init_module]


# hooks with keywords around a forward that breaks, a class __call__ with hooks, layouts and
# parameters changed between calls, hooks that write the module
def hook_kwargs_break_in_forward(C):
    class M(nn.Module):
        def __init__(s): super().__init__(); s.l = nn.Linear(3, 3)
        def forward(s, x, k=1.0):
            y = s.l(x) * k
            print("", end="")
            return y.relu()
    m = M()
    m.register_forward_hook(lambda mod, a, kw, o: o + kw["k"], with_kwargs=True, always_call=True)
    m.register_forward_pre_hook(lambda mod, a, kw: (a, {"k": kw.get("k", 0.0) * 2}), with_kwargs=True)
    cm = C(m)
    return step(cm, m, X(2, 3), k=1.5) + step(cm, m, X(2, 3), k=3.0)
def call_override_with_hooks(C):
    class M(nn.Linear):
        def __call__(s, x): return super().__call__(x) + 1
    m = M(3, 3); m.register_forward_hook(lambda mod, a, o: o * 2); cm = C(m)
    return step(cm, m, X(2, 3))
def channels_last_between(C):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)); cm = C(m); x = X(2, 3, 6, 6)
    out = step(cm, m, x)
    m.to(memory_format=torch.channels_last)
    y = cm(x.to(memory_format=torch.channels_last))
    return out + [d(y), y.is_contiguous(memory_format=torch.channels_last)]
def buffer_view_of_param(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.w = nn.Parameter(torch.randn(4)); s.register_buffer("first", s.w.detach()[:2])
        def forward(s, x):
            return x * s.w[:2] + s.first
    m = M(); cm = C(m)
    out = step(cm, m, X(2, 2))
    with torch.no_grad(): m.w.add_(1.0)
    return out + step(cm, m, X(2, 2))
def param_set_none_between(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.bias = None
    return out + step(cm, m, x)
def reparametrize_module(C):
    m = nn.Linear(3, 2)
    def f(w, x):
        with torch.nn.utils.stateless._reparametrize_module(m, {"weight": w}):
            return m(x)
    cf = C(f); w = torch.randn(2, 3, requires_grad=True)
    y = cf(w, X(4, 3)); y.sum().backward()
    return [d(y), d(w.grad), d(m.bias.grad)]
def spectral_old_train_eval_train(C):
    torch.manual_seed(3)
    m = nn.utils.spectral_norm(nn.Linear(3, 3)); cm = C(m); out = []
    for mode in (True, False, True):
        m.train(mode); out += step(cm, m, X(2, 3)) + [d(m.weight_u)]
    return out
def module_hook_modifies_param_in_place(C):
    m = nn.Linear(3, 3)
    def pre(mod, args):
        with torch.no_grad(): mod.weight.mul_(0.5)
    m.register_forward_pre_hook(pre); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3)) + [d(m.weight)]
def forward_hook_sets_attr_on_module(C):
    m = nn.Linear(3, 3)
    def hook(mod, a, o):
        mod.last = o.detach()
    m.register_forward_hook(hook); cm = C(m)
    out = step(cm, m, X(2, 3))
    return out + [d(m.last)]


PROGRAMS_C += [hook_kwargs_break_in_forward, call_override_with_hooks, channels_last_between, buffer_view_of_param,
               param_set_none_between, reparametrize_module, spectral_old_train_eval_train,
               module_hook_modifies_param_in_place, forward_hook_sets_attr_on_module]
