"""A module's hook table changed earlier in the same trace is read as the trace left it.

A forward hook that removes itself through its handle (`handle.remove()` inside the hook) runs on
the first call of the module only: a second call in the same forward skipped nothing (the table was
read off the real module, where the removal is still pending). Compared with eager.
"""
from __future__ import annotations

import torch
from torch import nn

import kiln


class CallsTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x):
        return self.a(x) + self.a(x)


def _with_self_removing_hook(model):
    box = {}

    def once(mod, args, out):
        box["handle"].remove()
        return out * 10

    box["handle"] = model.a.register_forward_hook(once)
    return model


def test_hook_removed_by_itself_runs_once_within_a_forward():
    torch.manual_seed(0)
    eager = _with_self_removing_hook(CallsTwice())
    torch.manual_seed(0)
    model = _with_self_removing_hook(CallsTwice())
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(1, 2)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))
    assert not model.a._forward_hooks and not eager.a._forward_hooks
