"""Programs that draw from torch's random generators, for tests/capture/test_rng_stream.py.

Each entry is `name -> (fn, make_args)`: `make_args()` gives fresh arguments (tensors, modules,
generators). The test runs fn eagerly and compiled after the same `torch.manual_seed`, and compares
the results, the arguments as the call left them, the gradients, and the generator's state after
the call (the next `torch.rand(5)`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[], tuple]]] = {}


def program(*make: Callable[[], tuple]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register fn under its name, called with `make[0]()` (a (3, 4) tensor when none is given)."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        PROGRAMS[fn.__name__] = (fn, make[0] if make else _x)
        return fn
    return register


def _x() -> tuple:
    return (torch.linspace(-1, 1, 12).reshape(3, 4),)


def _x_grad() -> tuple:
    return (torch.linspace(-1, 1, 12).reshape(3, 4).requires_grad_(),)


def _probs() -> tuple:
    return (torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]),)


def _gen() -> tuple:
    return (torch.linspace(-1, 1, 12).reshape(3, 4), torch.Generator().manual_seed(7))


# ---------------------------------------------------------------------------- unused draws
@program()
def unused_rand(x):
    torch.rand(3)
    return x + 1


@program()
def unused_randn_then_used(x):
    torch.randn(2, 2)
    return x + torch.randn(3, 4)


@program()
def unused_rand_like_randint(x):
    torch.rand_like(x)
    torch.randint(0, 10, (5,))
    torch.randint_like(x, 3)
    torch.randn_like(x)
    return x * 2


@program()
def unused_randperm(x):
    torch.randperm(7)
    return x - 1


@program(_probs)
def unused_multinomial(p):
    torch.multinomial(p, 2)
    torch.multinomial(p, 6, replacement=True)
    return p + torch.rand(4)


@program(_probs)
def used_multinomial(p):
    return torch.multinomial(p, 3), torch.multinomial(p, 5, replacement=True), torch.multinomial(p[0], 2)


@program(_probs)
def unused_bernoulli_poisson(p):
    torch.bernoulli(p)
    torch.poisson(p * 4)
    p.bernoulli(0.3)
    return p * 3


@program()
def unused_normal_variants(x):
    torch.normal(x, 1.0)
    torch.normal(0.0, x.abs() + 0.1)
    torch.normal(x, x.abs() + 0.1)
    torch.normal(2.0, 3.0, size=(4,))
    return x + torch.rand(1)


@program()
def unused_dead_inplace(x):
    y = x * 2
    y.bernoulli_(0.5)
    z = torch.empty(5)
    z.uniform_(-1, 1)
    w = x.new_empty(3)
    w.normal_()
    x.new_empty(2).exponential_()
    return x + torch.rand(4)


@program()
def unused_rand_in_loop(x):
    for i in range(3):
        torch.rand(i + 1)
    return x + torch.rand(4)


@program()
def unused_rand_no_grad_block(x):
    with torch.no_grad():
        torch.rand(3)
        F.dropout(x, 0.5, True)
    return x + 1


# ---------------------------------------------------------------------------- dropout family
@program()
def dropout_unused_train(x):
    F.dropout(x, 0.5, True)
    return x + torch.rand(3, 4)


@program()
def dropout_used_train(x):
    return F.dropout(x, 0.3, True) + F.dropout(x, 0.6, training=True)


@program()
def dropout_eval_draws_nothing(x):
    F.dropout(x, 0.5, False)
    return F.dropout(x, 0.5, False) + torch.rand(4)


@program()
def dropout_edge_probabilities(x):
    a = F.dropout(x, 0.0, True)
    b = F.dropout(x, 1.0, True)
    F.dropout(x, 1.0, True)
    F.dropout(x, 0.0, True)
    return a, b, torch.rand(2)


@program()
def dropout_edge_probabilities_unused(x):
    F.dropout(x, 1.0, True)
    F.dropout(x, 0.0, True)
    F.alpha_dropout(x, 1.0, True)
    return x + torch.rand(4)


@program(lambda: (torch.empty(0, 4),))
def dropout_empty_input(x):
    F.dropout(x, 0.5, True)
    return F.dropout(x, 0.5, True), torch.rand(2)


@program()
def alpha_and_feature_dropout(x):
    a = F.alpha_dropout(x, 0.4, True)
    F.alpha_dropout(x, 0.4, True)
    b = F.feature_alpha_dropout(x.reshape(1, 3, 4, 1), 0.4, True)
    F.feature_alpha_dropout(x.reshape(1, 3, 4, 1), 0.4, True)
    c = F.dropout1d(x.reshape(1, 3, 4), 0.5, True)
    d = F.dropout2d(x.reshape(1, 3, 2, 2), 0.5, True)
    F.dropout2d(x.reshape(1, 3, 2, 2), 0.5, True)
    e = F.dropout3d(x.reshape(1, 3, 1, 2, 2), 0.5, True)
    return a, b, c, d, e


@program()
def dropout_inplace_on_input(x):
    F.dropout(x, 0.5, True, inplace=True)
    return x * 2


@program()
def dropout_on_view_with_offset(x):
    v = x[1:, 1:]
    F.dropout(v, 0.5, True, inplace=True)
    return F.dropout(x[1:], 0.5, True) + 1


def _modules(train: bool) -> Callable[[], tuple]:
    def make() -> tuple:
        m = nn.ModuleDict({"drop": nn.Dropout(0.4), "alpha": nn.AlphaDropout(0.3), "fa": nn.FeatureAlphaDropout(0.3),
                           "d2": nn.Dropout2d(0.5), "rrelu": nn.RReLU(0.1, 0.3)})
        m.train(train)
        return (m, torch.linspace(-1, 1, 12).reshape(1, 3, 2, 2))
    return make


def dropout_modules(m, x):
    m["drop"](x)
    a = m["alpha"](x)
    m["fa"](x)
    b = m["d2"](x)
    m["rrelu"](x)
    c = m["rrelu"](x)
    return a + b + c + m["drop"](x)


PROGRAMS["dropout_modules_train"] = (dropout_modules, _modules(True))
PROGRAMS["dropout_modules_eval"] = (dropout_modules, _modules(False))


@program()
def rrelu_train_unused_and_used(x):
    F.rrelu(x, 0.1, 0.3, training=True)
    y = F.rrelu(x, training=True)
    z = x.clone()
    F.rrelu_(z, 0.2, 0.4, training=True)
    return y, z, F.rrelu(x, training=False)


@program()
def gumbel_softmax_draws(x):
    F.gumbel_softmax(x, tau=0.5)
    return F.gumbel_softmax(x, hard=True)


# ---------------------------------------------------------------------------- in place, views, offsets
@program()
def inplace_random_on_input(x):
    x.uniform_(-2, 2)
    return x * 1


@program()
def inplace_distributions_on_views(x):
    x[0].exponential_(2.0)
    x[1, 1:].geometric_(0.3)
    x[2, :2].cauchy_()
    x[2, 2:].log_normal_()
    return x.sum()


@program()
def random_on_view_with_offset(x):
    x[1:].normal_(0, 2)
    x[:, 2:].bernoulli_(0.5)
    v = x.t()[1:]
    v.uniform_()
    return x.clone()


@program(lambda: (torch.zeros(4, 5, dtype=torch.int64),))
def random_integer_draws(x):
    x[0].random_()
    x[1].random_(10)
    x[2].random_(-5, 5)
    x[3, 1:].random_(3, 100)
    torch.empty(3, dtype=torch.int64).random_(2)
    return x + 0


@program()
def bernoulli_tensor_probabilities(x):
    p = torch.sigmoid(x)
    x.bernoulli_(p)
    return torch.bernoulli(p), torch.bernoulli(p, 0.3), x + 0


# ---------------------------------------------------------------------------- generators
@program(_gen)
def generator_passed_in(x, g):
    a = torch.rand(3, generator=g)
    torch.randn(2, generator=g)
    b = torch.randint(0, 5, (4,), generator=g)
    x.uniform_(generator=g)
    return a, b, x + torch.rand(4)


@program(_gen)
def generator_passed_in_unused(x, g):
    torch.randn(3, generator=g)
    torch.randperm(5, generator=g)
    torch.multinomial(x.abs() + 0.1, 2, generator=g)
    return x + 1


@program()
def generator_made_in_frame(x):
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, generator=g)
    torch.randn(2, generator=g)
    return a, torch.randperm(4, generator=g), x + torch.rand(1)


@program()
def generator_made_in_frame_state(x):
    g = torch.Generator()
    g.manual_seed(3)
    s = g.get_state()
    a = torch.rand(2, generator=g)
    g.set_state(s)
    b = torch.rand(2, generator=g)
    return a, b, x + 1


@program()
def generator_made_in_frame_returned(x):
    g = torch.Generator().manual_seed(5)
    torch.rand(3, generator=g)
    return x + 1, g


# ---------------------------------------------------------------------------- the global state in the frame
@program()
def manual_seed_in_frame(x):
    a = torch.rand(2)
    torch.manual_seed(11)
    b = torch.rand(2)
    return x + a.sum() + b.sum()


@program()
def manual_seed_unused_draw_after(x):
    torch.manual_seed(3)
    torch.rand(4)
    return x + 1


@program()
def get_set_rng_state_in_frame(x):
    s = torch.get_rng_state()
    a = torch.rand(3)
    torch.set_rng_state(s)
    b = torch.rand(3)
    return x + a.sum() - b.sum()


@program()
def fork_rng_in_frame(x):
    with torch.random.fork_rng(devices=[]):
        torch.rand(3)
        a = torch.randn(2)
    return x + a.sum() + torch.rand(1)


@program()
def random_manual_seed_and_seed(x):
    torch.random.manual_seed(4)
    a = torch.rand(2)
    torch.random.manual_seed(4)
    return x + a.sum() + torch.rand(2).sum()


@program()
def initial_seed_read(x):
    torch.rand(3)
    return x + (torch.initial_seed() % 7)


# ---------------------------------------------------------------------------- control flow, breaks, calls
def _draw(n):
    torch.rand(n)
    return torch.randn(n)


@program()
def draws_in_nested_function(x):
    def inner(y):
        torch.rand(2)
        return y * torch.rand(1)
    return inner(x) + _draw(4)


@program()
def draws_in_branches(x):
    if x.shape[0] > 2:
        torch.rand(5)
        y = x + torch.rand(4)
    else:
        y = x
    if x.dim() > 5:
        torch.rand(9)
    return y


@program()
def draws_across_print_break(x):
    torch.rand(2)
    a = torch.rand(3)
    print("rng-stream-probe", end="")
    torch.randn(2)
    return x + a.sum() + torch.rand(1)


@program()
def draws_across_item_break(x):
    torch.rand(2)
    n = x.sum().item()
    torch.rand(3)
    return x * n + torch.rand(4)


@program()
def draws_decide_a_branch(x):
    r = torch.rand(1)
    torch.rand(2)
    if r.item() > 0.5:
        return x + torch.rand(4)
    return x - torch.rand(4)


@program()
def draws_in_loop_with_break(x):
    out = x
    for i in range(3):
        torch.rand(1)
        if i == 1:
            print("", end="")
        out = out + torch.rand(4)
    return out


@program()
def draws_under_grad_modes(x):
    with torch.no_grad():
        a = F.dropout(x, 0.5, True)
    with torch.enable_grad():
        b = F.dropout(x, 0.5, True)
    with torch.inference_mode():
        torch.rand(3)
    return a + b


# ---------------------------------------------------------------------------- shapes and dtypes
@program()
def draws_of_dtypes(x):
    torch.rand(3, dtype=torch.float64)
    torch.randn(2, dtype=torch.float16)
    torch.randint(0, 3, (3,), dtype=torch.int32)
    a = torch.rand(2, 2, dtype=torch.bfloat16)
    torch.rand(0)
    return a, x + torch.rand(4, dtype=torch.float64)


@program()
def draws_shaped_like_input(x):
    torch.rand(x.shape)
    torch.rand(x.shape[0], x.shape[1] * 2)
    return x + torch.rand_like(x.t()).t()


# ---------------------------------------------------------------------------- gradients
@program(_x_grad)
def dropout_grad(x):
    y = F.dropout(x * 2, 0.5, True)
    F.dropout(x, 0.5, True)
    return (y * y).sum()


@program(_x_grad)
def rrelu_grad(x):
    F.rrelu(x, training=True)
    return F.rrelu(x * 3, 0.1, 0.4, training=True).sum()


@program(_x_grad)
def alpha_dropout_grad(x):
    return (F.alpha_dropout(x, 0.3, True) * torch.rand(3, 4)).sum()


def _mlp() -> tuple:
    torch.manual_seed(1234)
    m = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 2), nn.Dropout(0.2))
    return (m, torch.linspace(-1, 1, 12).reshape(3, 4))


@program(_mlp)
def training_step_with_dropout(m, x):
    return m(x).pow(2).sum()


# ---------------------------------------------------------------------------- higher-order regions
@program(_x_grad)
def checkpoint_with_dropout(x):
    def body(y):
        F.dropout(y, 0.5, True)
        torch.rand(2)
        return F.dropout(y.sin(), 0.5, True) * 2
    return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False).sum()


class _Noisy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        torch.rand(3)
        noise = torch.rand_like(x)
        ctx.save_for_backward(noise)
        return x * noise

    @staticmethod
    def backward(ctx, g):
        (noise,) = ctx.saved_tensors
        return g * noise


@program(_x_grad)
def autograd_function_draws(x):
    return _Noisy.apply(x).sum() + torch.rand(1)


@program()
def sdpa_with_dropout(x):
    q = x.reshape(1, 1, 3, 4)
    F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    return F.scaled_dot_product_attention(q, q * 2, q, dropout_p=0.3) + torch.rand(4)


def _lstm() -> tuple:
    torch.manual_seed(99)
    m = nn.LSTM(4, 5, num_layers=3, dropout=0.4)
    m.train()
    return (m, torch.linspace(-1, 1, 24).reshape(2, 3, 4))


@program(_lstm)
def lstm_dropout_between_layers(m, x):
    out, (h, c) = m(x)
    return out.sum() + h.sum()


def _gru() -> tuple:
    torch.manual_seed(98)
    m = nn.GRU(4, 5, num_layers=2, dropout=0.5)
    return (m, torch.linspace(-1, 1, 24).reshape(2, 3, 4))


@program(_gru)
def gru_dropout_between_layers(m, x):
    m(x)
    return m(x)[0]


@program()
def distributions_sample(x):
    d = torch.distributions.Normal(x, x.abs() + 0.5)
    d.sample()
    return d.rsample() + torch.distributions.Uniform(0.0, 1.0).sample((4,))


@program()
def init_functions_in_frame(x):
    w = torch.empty(3, 4)
    nn.init.normal_(w)
    nn.init.kaiming_uniform_(torch.empty(2, 4))
    nn.init.xavier_normal_(torch.empty(4, 4))
    nn.init.trunc_normal_(torch.empty(5))
    return x + w


@program()
def module_built_in_frame(x):
    lin = nn.Linear(4, 2)
    return lin(x)


@program()
def vmap_randomness_different(x):
    return torch.vmap(lambda r: r + torch.rand(4), randomness="different")(x)


@program()
def vmap_randomness_same(x):
    return torch.vmap(lambda r: F.dropout(r, 0.5, True), randomness="same")(x)


@program()
def tensor_method_draws(x):
    y = x.clone()
    y.normal_(1.0, 0.5)
    z = x.new_empty(3, 4).random_(0, 4)
    return y, z, x.bernoulli(0.2), torch.rand(2).multinomial(1)


@program()
def draws_after_returning_alias(x):
    torch.rand(1)
    return x


def _rnn(kind: type, **options: Any) -> Callable[[], tuple]:
    def make() -> tuple:
        torch.manual_seed(97)
        m = kind(4, 5, num_layers=3, dropout=0.5, **options)
        batch_first = options.get("batch_first", False)
        x = torch.linspace(-1, 1, 24).reshape((3, 2, 4) if batch_first else (2, 3, 4))
        return (m, x)
    return make


def rnn_stack(m, x):
    m(x)
    out = m(x)
    return out[0], out[1]


for _name, _make in {"rnn_tanh_layers": _rnn(nn.RNN), "rnn_relu_bidirectional": _rnn(nn.RNN, nonlinearity="relu",
                                                                                         bidirectional=True),
                     "gru_batch_first": _rnn(nn.GRU, batch_first=True), "lstm_proj": _rnn(nn.LSTM, proj_size=3),
                     "lstm_bidirectional_batch_first": _rnn(nn.LSTM, bidirectional=True, batch_first=True)}.items():
    PROGRAMS[_name] = (rnn_stack, _make)


def _packed() -> tuple:
    torch.manual_seed(96)
    m = nn.GRU(4, 5, num_layers=2, dropout=0.5)
    return (m, torch.linspace(-1, 1, 36).reshape(3, 3, 4), torch.tensor([3, 2, 1]))


@program(_packed)
def gru_packed_sequence(m, x, lengths):
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths)
    out, h = m(packed)
    return nn.utils.rnn.pad_packed_sequence(out)[0], h


# ---------------------------------------------------------------------------- transforms whose body draws
@program()
def unused_vmap_and_func_transforms(x):
    torch.vmap(lambda r: r + torch.rand(4), randomness="different")(x)
    torch.vmap(lambda r: F.dropout(r, 0.5, True), randomness="same")(x)
    torch.func.grad(lambda y: (F.dropout(y, 0.5, True) * y).sum())(x)
    torch.func.jacrev(lambda y: F.dropout(y, 0.5, True))(x[0])
    return x * 2
