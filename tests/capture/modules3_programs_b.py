"""nn.Module programs of the kind PyTorch tests Dynamo with, part b: `__call__` overridden, forward
through `__getattr__` or a property, modules kept in plain dicts/lists/tuples, Sequential slicing,
train/eval and requires_grad_ switched between calls, parameters swapped, grad modes around the
call, RNN/LSTM/GRU, MultiheadAttention, TransformerEncoderLayer (its fast path), Embedding with
padding_idx and max_norm, EmbeddingBag, clip_grad_norm_, fused modules. Same conventions as part a.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modules3_programs_a import G, X, d, step


# ------------------------------------------------------------------ __call__, __getattr__, properties
def call_overridden(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            return s.l(x)

        def __call__(s, x):
            return super().__call__(x) * 2
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def call_overridden_skips_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def __call__(s, x):
            return s.l(x).tanh()
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def submodule_call_overridden(C):
    class Inner(nn.Linear):
        def __call__(s, x):
            return super().__call__(x + 1)

    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.i = Inner(3, 3)

        def forward(s, x):
            return s.i(x).relu()
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def forward_via_getattr(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def __getattr__(s, name):
            if name == "forward":
                return lambda x: s.l(x) * 3
            return super().__getattr__(name)
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def forward_assigned_on_instance(C):
    m = nn.Linear(3, 3)
    m.forward = lambda x: F.linear(x, m.weight, m.bias).sigmoid()
    cm = C(m)
    return step(cm, m, X(2, 3))


def submodule_via_property(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s._layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

        @property
        def last(s):
            return s._layers[-1]

        def forward(s, x):
            return s.last(s._layers[0](x))
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def weight_via_property(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.raw = nn.Parameter(torch.randn(3, 3))

        @property
        def weight(s):
            return s.raw.tril()

        def forward(s, x):
            return x @ s.weight
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3))


def getattr_fallback_to_child(C):
    class Wrap(nn.Module):
        def __init__(s):
            super().__init__(); s.inner = nn.Linear(3, 3)

        def __getattr__(s, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(s.inner, name)

        def forward(s, x):
            return x @ s.weight.T + s.bias
    m = Wrap(); cm = C(m)
    return step(cm, m, X(2, 3))


CALLS = [call_overridden, call_overridden_skips_forward, submodule_call_overridden, forward_via_getattr,
         forward_assigned_on_instance, submodule_via_property, weight_via_property, getattr_fallback_to_child]


# ------------------------------------------------------------------ modules in plain containers
def modules_in_plain_list(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3); s.b = nn.Linear(3, 3); s.order = [s.a, s.b, s.a]

        def forward(s, x):
            for l in s.order:
                x = l(x)
            return x
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def modules_in_plain_dict(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3); s.b = nn.Tanh(); s.table = {"lin": s.a, "act": s.b}

        def forward(s, x, key="act"):
            return s.table[key](s.table["lin"](x))
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + step(cm, m, X(2, 3), key="lin")


def modules_in_tuple_attr(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.pair = (nn.Linear(3, 3), nn.Linear(3, 3))  # not registered

        def forward(s, x):
            return s.pair[0](x) + s.pair[1](x)
    m = M(); cm = C(m)
    y = cm(X(2, 3)); y.sum().backward()
    return [d(y), d(m.pair[0].weight.grad), len(list(m.parameters()))]


def plain_list_changed_between(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3); s.b = nn.ReLU(); s.seq = [s.a]

        def forward(s, x):
            for l in s.seq:
                x = l(x)
            return x
    m = M(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.seq.append(m.b)
    return out + step(cm, m, x)


def plain_dict_module_replaced_between(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3); s.b = nn.Linear(3, 3); s.table = {"f": s.a}

        def forward(s, x):
            return s.table["f"](x)
    m = M(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.table["f"] = m.b
    return out + step(cm, m, x)


def modules_in_global_list(C):
    layers = [nn.Linear(3, 3), nn.GELU()]

    def f(x):
        for l in layers:
            x = l(x)
        return x
    cf = C(f); y = cf(X(2, 3)); y.sum().backward()
    return [d(y), d(layers[0].weight.grad)]


CONTAINERS = [modules_in_plain_list, modules_in_plain_dict, modules_in_tuple_attr, plain_list_changed_between,
              plain_dict_module_replaced_between, modules_in_global_list]


# ------------------------------------------------------------------ Sequential slicing and indexing
def _seq():
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))


def _sliced(index):
    def program(C):
        class M(nn.Module):
            def __init__(s):
                super().__init__(); s.s = _seq()

            def forward(s, x):
                part = s.s[index]
                return part(x), len(part) if isinstance(part, nn.Sequential) else -1
        m = M(); cm = C(m)
        return step(cm, m, X(2, 3))
    return program


seq_reversed = _sliced(slice(None, None, -1))
seq_reversed.__name__ = "seq_reversed"
seq_step_minus_two = _sliced(slice(None, None, -2))
seq_step_minus_two.__name__ = "seq_step_minus_two"
seq_tail = _sliced(slice(-2, None))
seq_tail.__name__ = "seq_tail"
seq_head = _sliced(slice(None, 3))
seq_head.__name__ = "seq_head"
seq_neg_index = _sliced(-1)
seq_neg_index.__name__ = "seq_neg_index"
seq_every_other = _sliced(slice(0, None, 2))
seq_every_other.__name__ = "seq_every_other"
seq_neg_range_reversed = _sliced(slice(-1, 0, -1))
seq_neg_range_reversed.__name__ = "seq_neg_range_reversed"


def seq_iter_reversed(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.s = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))

        def forward(s, x):
            for l in reversed(s.s):
                x = l(x)
            return x
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3))


def seq_slice_kept(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.s = _seq()

        def forward(s, x):
            s.head = s.s[:2]
            return s.head(x)
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + [m.head[0] is m.s[0], len(m.head)]


SLICES = [seq_reversed, seq_step_minus_two, seq_tail, seq_head, seq_neg_index, seq_every_other, seq_neg_range_reversed,
          seq_iter_reversed, seq_slice_kept]


# ------------------------------------------------------------------ train/eval, requires_grad_, swaps
def train_eval_dropout(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)); cm = C(m); x = X(4, 3)
    torch.manual_seed(5); a = cm(x)
    m.eval(); b = cm(x)
    m.train(); torch.manual_seed(5); c = cm(x)
    return [d(a), d(b), d(c)]


def train_eval_batchnorm(C):
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)); cm = C(m); out = []
    for mode in (True, False, True, False):
        m.train(mode)
        out += step(cm, m, X(5, 3)) + [d(m[1].running_mean), int(m[1].num_batches_tracked)]
    return out


def training_flag_read(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            return s.l(x) * (2 if s.training else 3)
    m = M(); cm = C(m); x = X(2, 3)
    out = step(cm, m, x); m.eval(); out += step(cm, m, x); m.train()
    return out + step(cm, m, x)


def eval_on_child_only(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.9)); cm = C(m); x = X(2, 3)
    m[1].eval(); a = cm(x)
    return [d(a), m.training, m[1].training]


def train_switched_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.bn = nn.BatchNorm1d(3)

        def forward(s, x):
            s.bn.eval()
            y = s.bn(x)
            s.bn.train()
            return y
    m = M(); cm = C(m)
    return [d(cm(X(4, 3))), d(m.bn.running_mean), m.bn.training]


def requires_grad_toggled(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.weight.requires_grad_(False)
    out += step(cm, m, x)
    m.weight.requires_grad_(True)
    return out + step(cm, m, x)


def requires_grad_all_off(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    a = cm(x); m.requires_grad_(False); b = cm(x)
    return [d(a), d(b), a.requires_grad, b.requires_grad]


def requires_grad_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(3, 3); s.b = nn.Linear(3, 3)

        def forward(s, x):
            s.a.weight.requires_grad_(False)
            return s.b(s.a(x))
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + [m.a.weight.requires_grad]


def parameter_swapped(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    m.weight = nn.Parameter(torch.ones(3, 3))
    return out + step(cm, m, x)


def parameter_swapped_shape(C):
    m = nn.Linear(3, 3); cm = C(m)
    out = step(cm, m, X(2, 3))
    m.weight = nn.Parameter(torch.ones(3, 5))
    return out + step(cm, m, X(2, 5))


def parameter_swapped_for_tensor_attr(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    out = step(cm, m, x)
    del m.bias
    m.bias = torch.zeros(3)  # a plain tensor attribute now
    return out + step(cm, m, x)


def parameter_swapped_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3); s.spare = nn.Parameter(torch.ones(3))

        def forward(s, x):
            s.l.bias = s.spare
            return s.l(x)
    m = M(); cm = C(m)
    return step(cm, m, X(2, 3)) + [m.l.bias is m.spare]


def grad_mode_no_grad_around(C):
    m = nn.Linear(3, 3); cm = C(m); x = X(2, 3)
    with torch.no_grad():
        a = cm(x)
    b = cm(x)
    return [d(a), d(b), a.requires_grad, b.requires_grad]


def grad_mode_inference_around(C):
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)); cm = C(m)
    with torch.inference_mode():
        a = cm(X(4, 3))
    b = cm(X(4, 3))
    return [d(a), d(b), a.is_inference(), b.is_inference(), d(m[1].running_mean), int(m[1].num_batches_tracked)]


def grad_mode_enable_inside_no_grad(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.l = nn.Linear(3, 3)

        def forward(s, x):
            with torch.enable_grad():
                return s.l(x)
    m = M(); cm = C(m)
    with torch.no_grad():
        y = cm(X(2, 3))
    return [d(y), y.requires_grad]


def grad_mode_inference_then_train(C):
    m = nn.Linear(3, 3); cm = C(m)
    with torch.inference_mode():
        cm(X(2, 3))
    return step(cm, m, X(2, 3))


GRADMODES = [train_eval_dropout, train_eval_batchnorm, training_flag_read, eval_on_child_only, train_switched_in_forward,
             requires_grad_toggled, requires_grad_all_off, requires_grad_in_forward, parameter_swapped,
             parameter_swapped_shape, parameter_swapped_for_tensor_attr, parameter_swapped_in_forward,
             grad_mode_no_grad_around, grad_mode_inference_around, grad_mode_enable_inside_no_grad,
             grad_mode_inference_then_train]


# ------------------------------------------------------------------ RNN / LSTM / GRU
def rnn_tanh(C):
    m = nn.RNN(3, 4); cm = C(m)
    return step(cm, m, X(5, 2, 3))


def lstm_batch_first_two_layers(C):
    m = nn.LSTM(3, 4, num_layers=2, batch_first=True); cm = C(m)
    return step(cm, m, X(2, 5, 3))


def lstm_bidirectional_with_state(C):
    m = nn.LSTM(3, 4, bidirectional=True); cm = C(m)
    h0, c0 = X(2, 2, 4), X(2, 2, 4)

    def f(x):
        out, (h, c) = m(x, (h0, c0))
        return out.sum(0) + torch.cat([h.sum(0), c.sum(0)], 1)
    cf = C(f); m.zero_grad(); y = cf(X(5, 2, 3)); y.sum().backward()
    return [d(y), G(m)]


def gru_proj_free(C):
    m = nn.GRU(3, 4, num_layers=2, dropout=0.0); cm = C(m)
    return step(cm, m, X(4, 2, 3))


def lstm_flatten_parameters_in_forward(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.rnn = nn.LSTM(3, 4, batch_first=True); s.head = nn.Linear(4, 2)

        def forward(s, x):
            s.rnn.flatten_parameters()
            out, _ = s.rnn(x)
            return s.head(out[:, -1])
    m = M(); cm = C(m)
    return step(cm, m, X(2, 5, 3)) + step(cm, m, X(2, 5, 3))


def lstm_proj_size(C):
    m = nn.LSTM(3, 5, proj_size=2); cm = C(m)
    return step(cm, m, X(4, 1, 3))


def rnn_eval_no_grad(C):
    m = nn.GRU(3, 4, batch_first=True); m.eval(); cm = C(m)
    with torch.no_grad():
        out, h = cm(X(2, 3, 3))
    return [d(out), d(h), out.requires_grad]


def lstm_packed_sequence(C):
    m = nn.LSTM(3, 4, batch_first=True)

    def f(x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = m(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return padded.sum() + h.sum()
    cf = C(f); y = cf(X(3, 5, 3), torch.tensor([5, 2, 4])); y.backward()
    return [d(y), G(m)]


def rnn_cell_loop(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.cell = nn.LSTMCell(3, 4)

        def forward(s, x):
            h = c = torch.zeros(x.shape[1], 4)
            for t in range(x.shape[0]):
                h, c = s.cell(x[t], (h, c))
            return h
    m = M(); cm = C(m)
    return step(cm, m, X(4, 2, 3))


def rnn_varying_lengths(C):
    m = nn.GRU(3, 4); cm = C(m)
    return step(cm, m, X(3, 2, 3)) + step(cm, m, X(6, 2, 3))


RNNS = [rnn_tanh, lstm_batch_first_two_layers, lstm_bidirectional_with_state, gru_proj_free,
        lstm_flatten_parameters_in_forward, lstm_proj_size, rnn_eval_no_grad, lstm_packed_sequence, rnn_cell_loop,
        rnn_varying_lengths]


# ------------------------------------------------------------------ MultiheadAttention
def _mha_step(C, m, *args, **kwargs):
    cm = C(m); m.zero_grad(set_to_none=True)
    out, w = cm(*args, **kwargs)
    out.pow(2).sum().backward()
    return [d(out), d(w), G(m)]


def mha_plain(C):
    m = nn.MultiheadAttention(8, 2); q = X(4, 2, 8)
    return _mha_step(C, m, q, q, q)


def mha_attn_mask_bool(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True); q = X(2, 4, 8)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    return _mha_step(C, m, q, q, q, attn_mask=mask)


def mha_attn_mask_float(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True); q = X(2, 4, 8)
    return _mha_step(C, m, q, q, q, attn_mask=X(4, 4))


def mha_key_padding_mask(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True); q = X(2, 4, 8)
    kpm = torch.tensor([[False, False, True, True], [False, False, False, True]])
    return _mha_step(C, m, q, q, q, key_padding_mask=kpm)


def mha_no_average(C):
    m = nn.MultiheadAttention(8, 2); q, k = X(3, 2, 8), X(5, 2, 8)
    return _mha_step(C, m, q, k, k, average_attn_weights=False)


def mha_need_weights_false(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True); q = X(2, 4, 8)
    cm = C(m); out, w = cm(q, q, q, need_weights=False); out.sum().backward()
    return [d(out), w, G(m)]


def mha_kdim_vdim(C):
    m = nn.MultiheadAttention(8, 2, kdim=5, vdim=6); q, k, v = X(3, 2, 8), X(4, 2, 5), X(4, 2, 6)
    return _mha_step(C, m, q, k, v)


def mha_causal(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True); q = X(2, 4, 8)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    return _mha_step(C, m, q, q, q, attn_mask=mask, is_causal=True)


def mha_eval_no_grad_fast_path(C):
    m = nn.MultiheadAttention(8, 2, batch_first=True).eval(); q = X(2, 4, 8); cm = C(m)
    with torch.no_grad():
        out, w = cm(q, q, q)
    return [d(out), d(w)]


def mha_bias_kv_zero_attn(C):
    m = nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True); q = X(3, 2, 8)
    return _mha_step(C, m, q, q, q)


MHAS = [mha_plain, mha_attn_mask_bool, mha_attn_mask_float, mha_key_padding_mask, mha_no_average, mha_need_weights_false,
        mha_kdim_vdim, mha_causal, mha_eval_no_grad_fast_path, mha_bias_kv_zero_attn]


# ------------------------------------------------------------------ TransformerEncoderLayer
def _layer(**kw):
    return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True, **kw)


def tel_train(C):
    m = _layer(); cm = C(m)
    return step(cm, m, X(2, 4, 8))


def tel_norm_first_gelu(C):
    m = _layer(norm_first=True, activation="gelu"); cm = C(m)
    return step(cm, m, X(2, 4, 8))


def tel_padding_mask(C):
    m = _layer(); cm = C(m); kpm = torch.tensor([[False, False, False, True], [False, True, True, True]])
    return step(cm, m, X(2, 4, 8), src_key_padding_mask=kpm)


def tel_eval_no_grad_fast_path(C):
    m = _layer().eval(); cm = C(m)
    with torch.no_grad():
        a = cm(X(2, 4, 8))
        b = cm(X(2, 4, 8), src_key_padding_mask=torch.tensor([[False] * 4, [False, False, True, True]]))
    return [d(a), d(b)]


def tel_eval_with_grad(C):
    m = _layer().eval(); cm = C(m)
    return step(cm, m, X(2, 4, 8))


def tel_eval_then_train(C):
    m = _layer(); cm = C(m); x = X(2, 4, 8)
    m.eval()
    with torch.no_grad():
        a = cm(x)
    m.train()
    return [d(a)] + step(cm, m, x)


def tel_causal_mask(C):
    m = _layer(); cm = C(m)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    return step(cm, m, X(2, 4, 8), src_mask=mask, is_causal=True)


def transformer_encoder_stack_eval(C):
    m = nn.TransformerEncoder(_layer(), num_layers=2, enable_nested_tensor=False).eval(); cm = C(m)
    with torch.no_grad():
        return [d(cm(X(2, 4, 8)))]


def transformer_encoder_stack_train(C):
    m = nn.TransformerEncoder(_layer(), num_layers=2, enable_nested_tensor=False); cm = C(m)
    return step(cm, m, X(2, 4, 8))


def transformer_decoder_layer(C):
    m = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True); cm = C(m)
    return step(cm, m, X(2, 3, 8), X(2, 4, 8))


TRANSFORMERS = [tel_train, tel_norm_first_gelu, tel_padding_mask, tel_eval_no_grad_fast_path, tel_eval_with_grad,
                tel_eval_then_train, tel_causal_mask, transformer_encoder_stack_eval, transformer_encoder_stack_train,
                transformer_decoder_layer]


# ------------------------------------------------------------------ Embedding, EmbeddingBag
def emb_padding_idx(C):
    m = nn.Embedding(6, 3, padding_idx=0); cm = C(m)
    return step(cm, m, torch.tensor([[0, 2, 0, 5], [1, 0, 3, 3]]))


def emb_max_norm_mutates(C):
    torch.manual_seed(3)
    m = nn.Embedding(6, 3, max_norm=1.0); m.weight.data *= 3; cm = C(m)
    out = step(cm, m, torch.tensor([1, 2, 2, 4]))
    return out + [d(m.weight), m.weight._version > 0]


def emb_max_norm_twice(C):
    torch.manual_seed(3)
    m = nn.Embedding(6, 3, max_norm=0.5, norm_type=1.0); cm = C(m)
    a = cm(torch.tensor([0, 1])); b = cm(torch.tensor([1, 5]))
    return [d(a), d(b), d(m.weight)]


def emb_max_norm_no_grad(C):
    torch.manual_seed(3)
    m = nn.Embedding(6, 3, max_norm=1.0); cm = C(m)
    with torch.no_grad():
        a = cm(torch.tensor([3, 3, 4]))
    return [d(a), d(m.weight)]


def emb_functional_max_norm(C):
    w = torch.randn(5, 3) * 4

    def f(idx):
        return F.embedding(idx, w, max_norm=2.0) * 2
    cf = C(f)
    return [d(cf(torch.tensor([0, 4]))), d(w.clone())]


def emb_scale_grad_by_freq(C):
    m = nn.Embedding(6, 3, scale_grad_by_freq=True); cm = C(m)
    return step(cm, m, torch.tensor([1, 1, 2, 5, 1]))


def emb_from_pretrained_frozen(C):
    m = nn.Embedding.from_pretrained(torch.randn(5, 3), freeze=True, padding_idx=1); cm = C(m)
    y = cm(torch.tensor([1, 2, 3]))
    return [d(y), y.requires_grad]


def embbag_mean_offsets(C):
    m = nn.EmbeddingBag(8, 3, mode="mean"); cm = C(m)
    return step(cm, m, torch.tensor([1, 2, 4, 5, 4, 3, 2, 7]), torch.tensor([0, 4]))


def embbag_sum_per_sample_weights(C):
    m = nn.EmbeddingBag(8, 3, mode="sum"); cm = C(m)
    return step(cm, m, torch.tensor([[1, 2, 4], [5, 4, 3]]), per_sample_weights=torch.rand(2, 3))


def embbag_max(C):
    m = nn.EmbeddingBag(8, 3, mode="max"); cm = C(m)
    return step(cm, m, torch.tensor([[1, 2, 4], [5, 4, 3]]))


def embbag_padding_idx_include_last(C):
    m = nn.EmbeddingBag(8, 3, mode="sum", padding_idx=2, include_last_offset=True); cm = C(m)
    return step(cm, m, torch.tensor([1, 2, 4, 5, 2, 3]), torch.tensor([0, 2, 6]))


def embbag_max_norm(C):
    torch.manual_seed(4)
    m = nn.EmbeddingBag(8, 3, mode="mean", max_norm=1.0); m.weight.data *= 3; cm = C(m)
    y = cm(torch.tensor([[1, 2], [3, 1]]))
    return [d(y), d(m.weight)]


EMBEDDINGS = [emb_padding_idx, emb_max_norm_mutates, emb_max_norm_twice, emb_max_norm_no_grad, emb_functional_max_norm,
              emb_scale_grad_by_freq, emb_from_pretrained_frozen, embbag_mean_offsets, embbag_sum_per_sample_weights,
              embbag_max, embbag_padding_idx_include_last, embbag_max_norm]


# ------------------------------------------------------------------ clip_grad_norm_, fused modules
def _with_grads() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    m(X(5, 3)).pow(2).sum().mul(10).backward()
    return m


def clip_grad_norm_compiled(C):
    m = _with_grads()
    total = C(lambda: nn.utils.clip_grad_norm_(m.parameters(), 0.5))()
    return [d(total), G(m)]


def clip_grad_norm_inf(C):
    m = _with_grads()
    total = C(lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, norm_type=float("inf")))(list(m.parameters()))
    return [d(total), G(m)]


def clip_grad_value_compiled(C):
    m = _with_grads()
    C(lambda: nn.utils.clip_grad_value_(m.parameters(), 0.05))()
    return [G(m)]


def train_step_with_clip(C):
    m = nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def train(x):
        opt.zero_grad()
        loss = m(x).pow(2).sum() * 10
        loss.backward()
        n = nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        return loss, n
    cf = C(train); out = []
    for _ in range(2):
        loss, n = cf(X(4, 3)); out += [d(loss), d(n), d(m.weight)]
    return out


def get_total_norm_compiled(C):
    m = _with_grads()
    f = C(lambda: nn.utils.get_total_norm([p.grad for p in m.parameters()], 2.0))
    return [d(f())]


def fused_linear_relu(C):
    from torch.ao.nn.intrinsic import LinearReLU
    m = LinearReLU(nn.Linear(3, 4), nn.ReLU()); cm = C(m)
    return step(cm, m, X(2, 3))


def fused_conv_bn_relu(C):
    from torch.ao.nn.intrinsic import ConvBnReLU2d
    m = ConvBnReLU2d(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()); cm = C(m)
    return step(cm, m, X(2, 2, 5, 5)) + [d(m[1].running_mean)]


def fuse_conv_bn_eval_between(C):
    conv, bn = nn.Conv2d(2, 3, 3).eval(), nn.BatchNorm2d(3).eval()
    bn.running_mean.uniform_(); bn.running_var.uniform_(0.5, 2)
    m = nn.Sequential(conv, bn).eval(); cm = C(m); x = X(1, 2, 5, 5)
    a = cm(x)
    fused = nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
    m2 = nn.Sequential(fused); cm2 = C(m2)
    return [d(a), d(cm2(x))]


MISC = [clip_grad_norm_compiled, clip_grad_norm_inf, clip_grad_value_compiled, train_step_with_clip,
        get_total_norm_compiled, fused_linear_relu, fused_conv_bn_relu, fuse_conv_bn_eval_between]

PROGRAMS_B = CALLS + CONTAINERS + SLICES + GRADMODES + RNNS + MHAS + TRANSFORMERS + EMBEDDINGS + MISC
