"""The compiled module behaves as torch.compile's OptimizedModule.

A class's own `__call__` is what runs (top level, a submodule, and through `super().__call__` with
hooks); attribute writes, reads and deletes reach the original (`opt.step += 1` changes what the
compiled forward reads); dir(), `_orig_mod`, state_dict keys and repr are torch.compile's; pickle,
torch.save/load and copy.deepcopy give a working compiled module; train()/eval() mid-use act on
the original; forward, backward and backward pre-hooks on the top-level module fire as in eager,
also when registered after the first call. Values are compared with eager, the rest with the real
torch.compile(backend="eager").
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import kiln


class TimesFive(nn.Module):
    def forward(self, x):
        return x + 1

    def __call__(self, x):
        return 5 * self.forward(x)


class DoublesModuleCall(nn.Module):
    def forward(self, x):
        return x + 1

    def __call__(self, x):
        return 2 * super().__call__(x)


class HoldsTimesFive(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = TimesFive()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.inner(self.lin(x))


class Stepper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = nn.Dropout(0.5)
        self.step = 0
        self.scale = 1.0

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale + self.step


def _compiled(module, **kwargs):
    kiln.reset()
    return kiln.compile(module, backend="eager", **kwargs)


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("make", [TimesFive, DoublesModuleCall, HoldsTimesFive])
def test_a_class_call_override_runs(make, fullgraph: bool) -> None:
    torch.manual_seed(0)
    module = make()
    if isinstance(module, DoublesModuleCall):
        module.register_forward_hook(lambda m, args, out: out * 10)
    x = torch.randn(2, 3)
    compiled = _compiled(module, fullgraph=fullgraph)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), module(x))


def test_attribute_writes_reach_the_original() -> None:
    module = Stepper().eval()
    compiled = _compiled(module)
    x = torch.randn(2, 3)
    compiled(x)
    compiled.step += 1
    compiled.scale = 2.0
    assert module.step == 1 and module.scale == 2.0
    assert "step" not in compiled.__dict__ and "scale" not in compiled.__dict__
    torch.testing.assert_close(compiled(x), module(x))
    compiled.extra = 5  # a new attribute lands on the original too, as in torch.compile
    assert module.extra == 5 and compiled.extra == 5
    del compiled.extra
    assert not hasattr(module, "extra")
    compiled.lin = nn.Linear(3, 3)  # a new submodule: the original's, read by the compiled forward
    assert compiled.lin is module.lin
    torch.testing.assert_close(compiled(x), module(x))


def test_attribute_behaviour_matches_torch_compile() -> None:
    module = Stepper()
    ours, theirs = _compiled(module), torch.compile(module, backend="eager")
    assert ours._orig_mod is module and theirs._orig_mod is module
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    torch_only = {"dynamo_ctx", "get_compiler_config", "_torchdynamo_orig_callable", "_torchdynamo_inline",
                  "_torchdynamo_wrapper_id", "_initialize", "_call_lazy_check", "_aot_compile",
                  "_save_aot_compiled_module", "_load_aot_compiled_module", "_opt_mod_attributes",
                  "_super_module_initialized"}
    assert set(dir(theirs)) - torch_only <= set(dir(ours))
    assert {"step", "scale", "lin", "drop"} <= set(dir(ours))


def test_state_dict_loads_across_kiln_and_torch() -> None:
    a, b = Stepper(), Stepper()
    ours, theirs = _compiled(a), torch.compile(b, backend="eager")
    theirs.load_state_dict(ours.state_dict())
    assert torch.equal(b.lin.weight, a.lin.weight)


@pytest.mark.parametrize("how", ["pickle", "torch.save", "deepcopy"])
def test_serialized_compiled_module_works(how: str) -> None:
    module = Stepper().eval()
    compiled = _compiled(module)
    x = torch.randn(2, 3)
    compiled(x)
    if how == "pickle":
        again = pickle.loads(pickle.dumps(compiled))
    elif how == "torch.save":
        buffer = io.BytesIO()
        torch.save(compiled, buffer)
        buffer.seek(0)
        again = torch.load(buffer, weights_only=False)
    else:
        again = copy.deepcopy(compiled)
    assert isinstance(again, kiln.OptimizedModule) and again._orig_mod is not module
    torch.testing.assert_close(again(x), module(x))
    again.step = 3  # the copy is its own module
    assert module.step == 0
    torch.testing.assert_close(again(x), again._orig_mod(x))


def test_train_and_eval_toggles_mid_use() -> None:
    module = Stepper()
    compiled = _compiled(module)
    x = torch.randn(4, 3)
    for mode in ("train", "eval", "train", "eval"):
        getattr(compiled, mode)()
        assert compiled.training == module.training == (mode == "train") == module.drop.training
        torch.manual_seed(1)
        want = module(x)
        torch.manual_seed(1)
        torch.testing.assert_close(compiled(x), want)
    compiled.training = True  # the attribute itself is the original's
    assert module.training


def _hooked(kind: str, events: list):
    module = nn.Linear(3, 2)
    if kind == "full_backward":
        module.register_full_backward_hook(lambda m, gin, gout: events.append(("backward", gout[0].shape)))
    elif kind == "backward_pre":
        module.register_full_backward_pre_hook(lambda m, gout: events.append(("pre", gout[0].shape)))
    elif kind == "both_backward":
        module.register_full_backward_pre_hook(lambda m, gout: events.append("pre"))
        module.register_full_backward_hook(lambda m, gin, gout: events.append("full"))
    elif kind == "forward_always":
        module.register_forward_hook(lambda m, args, out: events.append("fwd") or out * 2, always_call=True)
    elif kind == "forward_kwargs":
        module.register_forward_pre_hook(lambda m, args, kwargs: events.append("pre") or
                                         (tuple(a * 2 for a in args), kwargs), with_kwargs=True)
        module.register_forward_hook(lambda m, args, kwargs, out: events.append("post") or out + 1, with_kwargs=True)
    return module


@pytest.mark.parametrize("kind", ["full_backward", "backward_pre", "both_backward", "forward_always",
                                  "forward_kwargs"])
def test_top_level_hooks_fire_as_in_eager(kind: str) -> None:
    eager_events: list = []
    kiln_events: list = []
    torch.manual_seed(0)
    eager = _hooked(kind, eager_events)
    torch.manual_seed(0)
    module = _hooked(kind, kiln_events)
    compiled = _compiled(module)
    for _ in range(2):
        x1 = torch.randn(4, 3, requires_grad=True)
        x2 = x1.detach().clone().requires_grad_()
        out1, out2 = eager(x1), compiled(x2)
        torch.testing.assert_close(out2, out1)
        out1.sum().backward()
        out2.sum().backward()
        torch.testing.assert_close(x2.grad, x1.grad)
    assert kiln_events == eager_events and eager_events


def test_backward_hook_registered_after_the_first_call() -> None:
    module = nn.Linear(3, 2)
    compiled = _compiled(module)
    x = torch.randn(4, 3, requires_grad=True)
    compiled(x).sum().backward()
    fired = []
    handle = module.register_full_backward_hook(lambda m, gin, gout: fired.append(1))
    compiled(x).sum().backward()
    assert fired == [1]
    handle.remove()
    compiled(x).sum().backward()
    assert fired == [1]


def test_global_backward_hook_fires_for_the_original() -> None:
    module = nn.Linear(3, 2)
    compiled = _compiled(module)
    seen = []
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda m, gin, gout: seen.append(type(m)))
    try:
        compiled(torch.randn(2, 3, requires_grad=True)).sum().backward()
    finally:
        handle.remove()
    assert nn.Linear in seen


def test_len_of_a_compiled_container() -> None:
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert len(_compiled(seq)) == 2 == len(torch.compile(seq, backend="eager"))
    with pytest.raises(TypeError):
        len(_compiled(nn.Linear(2, 2)))


class _CallMeta(type):
    pass


class ThreeTimesUnderAMetaclass(nn.Module, metaclass=_CallMeta):
    def forward(self, x):
        return x + 1

    def __call__(self, x):
        return 3 * self.forward(x)


def test_call_path_does_not_use_getattr_static(monkeypatch) -> None:
    # inspect.getattr_static costs microseconds: the per-call path of a compiled module finds the
    # class's __call__ by walking the MRO itself (an ordinary metaclass); still right when the
    # class's __call__ or forward is replaced after compile, and under a custom metaclass
    model = nn.Linear(4, 4)
    opt = kiln.compile(model, backend="eager")
    x = torch.randn(2, 4)
    opt(x)
    calls = []
    real = kiln.api.inspect.getattr_static
    monkeypatch.setattr(kiln.api.inspect, "getattr_static", lambda *a: calls.append(a) or real(*a))
    torch.testing.assert_close(opt(x), model(x))
    assert calls == []

    class Plus(nn.Module):
        def forward(self, x):
            return x + 1

    plus = Plus()
    opt_plus = kiln.compile(plus, backend="eager")
    assert torch.equal(opt_plus(x), x + 1)
    Plus.__call__ = lambda self, x: 7 * self.forward(x)  # a lambda is a FunctionType too
    assert torch.equal(opt_plus(x), 7 * (x + 1))
    Plus.forward = lambda self, x: x - 1
    assert torch.equal(opt_plus(x), 7 * (x - 1))
    del Plus.__call__
    assert torch.equal(opt_plus(x), x - 1)

    meta = kiln.compile(ThreeTimesUnderAMetaclass(), backend="eager")
    assert torch.equal(meta(x), 3 * (x + 1))
    assert calls  # the metaclass is not `type`: asked
