"""torch.distributions' argument and sample validation (and a program's own `if not ok.all(): raise`)
kept in one graph as deferred checks (kiln/capture/deferred_checks.py): one graph where each check
was a graph break before, eager's values and gradients on valid inputs, eager's exception (type and
text, the tensor reprs in it) on invalid ones, and the compiled code right again afterwards.
torch.compile turns validation off for the whole process, so its graph count (dynamo_graphs) is the
one to meet with validation on."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.distributions import (Bernoulli, Beta, Categorical, Distribution, Exponential, Gamma, Independent,
                                 Laplace, LogNormal, MultivariateNormal, Normal, Poisson,
                                 TransformedDistribution, kl_divergence)
from torch.distributions.transforms import AffineTransform, ExpTransform

import kiln
from eager_compare import dynamo_graphs, outcome, same_outcome


@contextlib.contextmanager
def validation(on: bool):
    before = Distribution._validate_args
    Distribution.set_default_validate_args(on)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)


def _pos(*shape):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(1)) + 0.5


def _normal(p, v):
    d = Normal(p[0], p[1])
    return d.log_prob(v) + d.entropy() + d.cdf(v)


def _categorical(p, v):
    d = Categorical(probs=p[0])
    return d.log_prob(v) + d.entropy()


def _categorical_logits(p, v):
    d = Categorical(logits=p[0])
    return d.log_prob(v) + d.entropy()


def _bernoulli(p, v):
    d = Bernoulli(probs=p[0])
    return d.log_prob(v) + d.entropy()


def _mvn(p, v):
    d = MultivariateNormal(p[0], scale_tril=p[1])
    return d.log_prob(v) + d.entropy()


def _independent(p, v):
    d = Independent(Normal(p[0], p[1]), 1)
    return d.log_prob(v) + d.entropy()


def _transformed(p, v):
    d = TransformedDistribution(Normal(p[0], p[1]), [ExpTransform(), AffineTransform(1.0, 2.0)])
    return d.log_prob(v)


def _exponential(p, v):
    d = Exponential(p[0])
    return d.log_prob(v) + d.entropy()


def _gamma(p, v):
    d = Gamma(p[0], p[1])
    return d.log_prob(v) + d.entropy()


def _beta(p, v):
    d = Beta(p[0], p[1])
    return d.log_prob(v)


def _laplace(p, v):
    d = Laplace(p[0], p[1])
    return d.log_prob(v) + d.entropy()


def _lognormal(p, v):
    d = LogNormal(p[0], p[1])
    return d.log_prob(v)


def _poisson(p, v):
    return Poisson(p[0]).log_prob(v)


def _tril():
    return torch.eye(3).expand(4, 3, 3) * 0.5 + torch.tril(torch.ones(3, 3), -1) * 0.1


_probs = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
# name: (function, valid params, valid value, params with an invalid entry, a value outside the support)
CASES = {
    "normal": (_normal, (torch.zeros(4), _pos(4)), torch.randn(4), (torch.zeros(4), -_pos(4)), None),
    "categorical": (_categorical, (_probs,), torch.tensor([2, 0]), (_probs * torch.tensor([1.0, -1.0, 1.0]),),
                    torch.tensor([3, 0])),
    "categorical_logits": (_categorical_logits, (torch.randn(2, 3),), torch.tensor([1, 2]),
                           (torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0]]),), torch.tensor([1, 5])),
    "bernoulli": (_bernoulli, (torch.rand(5) * 0.8 + 0.1,), torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0]),
                  (torch.tensor([0.2, 1.5, 0.3, 0.4, 0.5]),), torch.tensor([0.0, 0.5, 1.0, 0.0, 1.0])),
    "mvn": (_mvn, (torch.zeros(4, 3), _tril()), torch.randn(4, 3), (torch.zeros(4, 3), -_tril()), None),
    "independent": (_independent, (torch.zeros(2, 3), _pos(2, 3)), torch.randn(2, 3),
                    (torch.zeros(2, 3), _pos(2, 3) - 1.0), None),
    "transformed": (_transformed, (torch.zeros(3), _pos(3)), torch.tensor([1.5, 2.0, 4.0]),
                    (torch.zeros(3), -_pos(3)), torch.tensor([1.5, 0.5, 4.0])),
    "exponential": (_exponential, (_pos(3),), torch.tensor([0.1, 1.0, 2.0]), (-_pos(3),), torch.tensor([0.1, -1.0, 2.0])),
    "gamma": (_gamma, (_pos(3), _pos(3)), torch.tensor([0.1, 1.0, 2.0]), (_pos(3), -_pos(3)), torch.tensor([0.1, -1.0, 2.0])),
    "beta": (_beta, (_pos(3), _pos(3)), torch.tensor([0.1, 0.5, 0.9]), (-_pos(3), _pos(3)), torch.tensor([0.1, 1.5, 0.9])),
    "laplace": (_laplace, (torch.zeros(3), _pos(3)), torch.randn(3), (torch.zeros(3), torch.zeros(3)), None),
    "lognormal": (_lognormal, (torch.zeros(3), _pos(3)), torch.tensor([0.5, 1.0, 2.0]), (torch.zeros(3), -_pos(3)),
                  torch.tensor([0.5, -1.0, 2.0])),
    "poisson": (_poisson, (_pos(3),), torch.tensor([0.0, 2.0, 3.0]), (-_pos(3),), torch.tensor([0.0, 2.5, 3.0])),
}


def _compiled(fn, backend="eager"):
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    return kiln.compile(fn, backend=counter), counter


def _same(got, want):
    assert same_outcome(got, want, text=True), f"compiled gave {got!r}, eager {want!r}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_valid_one_graph_then_eagers_error_then_right_again(name):
    fn, params, value, bad_params, bad_value = CASES[name]

    def program(*args):
        return fn(args[:-1], args[-1])

    with validation(True):
        compiled, counter = _compiled(program)
        _same(outcome(compiled, *params, value), outcome(program, *params, value))
        assert counter.frame_count == 1 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
        bad_calls = [(*bad_params, value)] + ([(*params, bad_value)] if bad_value is not None else [])
        for args in bad_calls:
            want = outcome(program, *args)
            assert want[0] == "raised" and want[1] is ValueError, want
            _same(outcome(compiled, *args), want)
        _same(outcome(compiled, *params, value), outcome(program, *params, value))
        assert counter.frame_count == 1 and kiln.stats()["fallbacks"] == 0, kiln.stats()
        assert kiln.stats()["check_reruns"] == len(bad_calls)


@pytest.mark.parametrize("name", ["normal", "mvn", "independent", "gamma", "transformed"])
def test_gradients_match_eager(name):
    fn, params, value, _, _ = CASES[name]
    float_params = [p for p in params if p.is_floating_point()]

    def program(*args):
        return fn(args[:-1], args[-1]).sum()

    def grads(f):
        leaves = [p.clone().requires_grad_() for p in float_params]
        f(*leaves, value).backward()
        return [p.grad for p in leaves]

    with validation(True):
        compiled, counter = _compiled(program, "aot_eager")
        for got, want in zip(grads(compiled), grads(program)):
            torch.testing.assert_close(got, want)
        assert counter.frame_count == 1, counter.frame_count


def test_validate_args_per_instance_and_default_toggled_between_calls():
    def program(loc, scale, v, check):
        return Normal(loc, scale, validate_args=check).log_prob(v)

    loc, v = torch.zeros(3), torch.randn(3)
    good, bad = _pos(3), -_pos(3)
    compiled, counter = _compiled(program)
    with validation(True):
        for args in [(loc, good, v, None), (loc, bad, v, False), (loc, bad, v, None), (loc, bad, v, True)]:
            _same(outcome(compiled, *args), outcome(program, *args))
        assert counter.frame_count == 3, counter.frame_count  # validate_args=None, False and True
    with validation(False):
        for args in [(loc, bad, v, None), (loc, bad, v, True), (loc, good, v, None)]:
            _same(outcome(compiled, *args), outcome(program, *args))  # nan where eager gives nan
    with validation(True):
        _same(outcome(compiled, loc, bad, v, None), outcome(program, loc, bad, v, None))
        assert counter.frame_count == 4, counter.frame_count  # and None with the default off
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["check_reruns"] == 4, kiln.stats()


def test_ppo_style_loss_graph_count_meets_torch_compile():
    def loss(mu, log_std, logits, probs, act, cat_act, b_act, adv, old_lp):
        dist = Independent(Normal(mu, log_std.exp()), 1)
        ratio = (dist.log_prob(act) - old_lp).exp()
        policy = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        cat = Categorical(logits=logits)
        bern = Bernoulli(probs=probs)
        mvn = MultivariateNormal(mu, scale_tril=torch.diag_embed(log_std.exp()))
        noise = Normal(mu, log_std.exp()).rsample()
        kl = kl_divergence(Normal(mu, log_std.exp()), Normal(mu.detach(), torch.ones_like(mu))).sum(-1)
        extra = cat.log_prob(cat_act) + cat.entropy() + bern.log_prob(b_act).sum(-1) + mvn.log_prob(act)
        return policy + extra.mean() + kl.mean() + dist.entropy().mean() + noise.mean() * 0.0

    g = torch.Generator().manual_seed(3)
    args = (torch.randn(8, 2, generator=g), torch.zeros(8, 2), torch.randn(8, 4, generator=g),
            torch.rand(8, 2, generator=g) * 0.8 + 0.1, torch.randn(8, 2, generator=g),
            torch.randint(0, 4, (8,), generator=g), torch.randint(0, 2, (8, 2), generator=g).float(),
            torch.randn(8, generator=g), torch.randn(8, generator=g))
    torch_count = dynamo_graphs(loss, lambda f: f(*args))
    with validation(True):
        compiled, counter = _compiled(loss)
        torch.manual_seed(0)
        want = outcome(loss, *args)
        torch.manual_seed(0)
        _same(outcome(compiled, *args), want)
        assert counter.frame_count <= max(torch_count, 1), (counter.frame_count, torch_count)
        bad = list(args)
        bad[3] = torch.full((8, 2), 1.5)
        torch.manual_seed(0)
        want = outcome(loss, *bad)
        after_eager = torch.rand(2)
        torch.manual_seed(0)
        _same(outcome(compiled, *bad), want)
        assert torch.equal(torch.rand(2), after_eager)  # the RNG drew what eager drew, once


# built from source: pytest rewrites the asserts of a test module into other bytecode
_USERS_CHECK = """
def _users_check(x, log):
    log.append("before")
    y = x * 2
    if not (y > 0).all():
        raise ValueError(f"y must be positive, got {y}")
    assert y.sum() < 100, f"too large: {y.sum()}"
    log.append("after")
    return y + 1
"""
_namespace: dict = {}
exec(compile(_USERS_CHECK, "<users_check>", "exec"), _namespace)  # noqa: S102
_users_check = _namespace["_users_check"]


@pytest.mark.parametrize("x", [torch.tensor([-1.0, 2.0]), torch.tensor([30.0, 40.0]), torch.tensor([1.0, 2.0])])
def test_users_own_raise_and_assert_shapes(x):
    compiled, counter = _compiled(_users_check)
    _same(outcome(compiled, torch.ones(2), []), outcome(_users_check, torch.ones(2), []))
    assert counter.frame_count == 1 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    got_log, want_log = [], []
    _same(outcome(compiled, x, got_log), outcome(_users_check, x, want_log))
    assert got_log == want_log  # the append before the check happened once, the one after as eager's


def test_random_draw_before_a_failing_check_draws_once():
    def program(x):
        noise = torch.randn(3)
        if not (x > 0).all():
            raise ValueError(f"x must be positive: {x}")
        return x + noise

    compiled, counter = _compiled(program)
    for x in [torch.ones(3), -torch.ones(3), torch.ones(3)]:
        torch.manual_seed(5)
        want = outcome(program, x)
        want_next = torch.rand(3)
        torch.manual_seed(5)
        _same(outcome(compiled, x), want)
        assert torch.equal(torch.rand(3), want_next)
    assert counter.frame_count == 1


def test_input_written_by_the_graph_is_not_written_twice():
    def program(x):
        x.add_(1)
        if not (x > 0).all():
            raise ValueError(f"x must be positive: {x}")
        return x * 2

    def sane(x):  # the same check, no write: one graph
        if not (x > 0).all():
            raise ValueError(f"x must be positive: {x}")
        return x * 2

    compiled, _ = _compiled(program)
    for start in [torch.ones(3), -torch.full((3,), 5.0)]:
        x_eager, x_kiln = start.clone(), start.clone()
        _same(outcome(compiled, x_kiln), outcome(program, x_eager))
        assert torch.equal(x_kiln, x_eager)
    compiled, counter = _compiled(sane)
    for x in [torch.ones(3), -torch.ones(3), torch.ones(3)]:
        _same(outcome(compiled, x), outcome(sane, x))
    assert counter.frame_count == 1 and kiln.stats()["graph_breaks"] == 0, kiln.stats()


def test_checks_under_a_with_block_defer_under_a_try_block_break():
    def program(loc, scale, log):
        with torch.no_grad():
            old = Normal(loc, scale).log_prob(loc)
        log.append("built")
        return Normal(loc, scale).entropy() + old

    def caught(loc, scale):  # the program catches the error: control flow, kept as a break
        try:
            d = Normal(loc, scale)
        except ValueError as exc:
            return torch.zeros(1), str(exc)[:40]
        return d.entropy(), "ok"

    with validation(True):
        compiled, counter = _compiled(program)
        for scale in [_pos(2), -_pos(2), _pos(2)]:
            got_log, want_log = [], []
            _same(outcome(compiled, torch.zeros(2), scale, got_log), outcome(program, torch.zeros(2), scale, want_log))
            assert got_log == want_log
        assert counter.frame_count == 1 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
        compiled, counter = _compiled(caught)
        for scale in [_pos(2), -_pos(2), _pos(2)]:
            _same(outcome(compiled, torch.zeros(2), scale), outcome(caught, torch.zeros(2), scale))
        assert kiln.stats()["check_reruns"] == 0, kiln.stats()


def test_inductor_backend_checks_and_values():
    with validation(True):
        compiled = kiln.compile(lambda p, v: _normal(p, v), backend="inductor")
        program = lambda p, v: _normal(p, v)  # noqa: E731
        kiln.reset()
        params, value = (torch.zeros(4), _pos(4)), torch.randn(4)
        _same(outcome(compiled, params, value), outcome(program, params, value))
        bad = (torch.zeros(4), -_pos(4))
        _same(outcome(compiled, bad, value), outcome(program, bad, value))
        _same(outcome(compiled, params, value), outcome(program, params, value))
        assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["check_reruns"] == 1


_WARM_SCRIPT = """
import json, torch, kiln
from torch.distributions import Distribution, Normal
Distribution.set_default_validate_args(True)

def f(mu, scale, v):
    d = Normal(mu, scale)
    return d.log_prob(v) + d.entropy()

g = kiln.compile(f)
mu, scale, v = torch.zeros(3), torch.ones(3), torch.tensor([0.5, -1.0, 2.0])
err = (g(mu, scale, v) - f(mu, scale, v)).abs().max().item()
try:
    g(mu, -scale, v)
    raised = None
except ValueError as exc:
    raised = str(exc)
err = max(err, (g(mu, scale, v) - f(mu, scale, v)).abs().max().item())
stats = kiln.stats()
print(json.dumps({"err": err, "raised": raised, "frames": stats["frames"], "disk_hits": stats["disk_hits"],
                  "reruns": stats["check_reruns"]}))
"""


@pytest.mark.cpp
def test_a_graph_with_deferred_checks_is_stored_and_checks_after_a_warm_start(tmp_path):
    from tests.reliability import cache_harness as harness

    code = harness.snapshot(tmp_path)
    cache = tmp_path / "cache"
    first, _ = harness.run(code, cache, _WARM_SCRIPT)
    second, stderr = harness.run(code, cache, _WARM_SCRIPT)
    assert first["frames"] == 1 and first["reruns"] == 1 and first["err"] < 1e-6, first
    assert second["frames"] == 0 and second["disk_hits"] == 1, (second, stderr[-2000:])
    assert second["raised"] == first["raised"] and "Expected parameter scale" in second["raised"]
    assert second["reruns"] == 1 and second["err"] < 1e-6, second
