"""Kiln's own capture feeding AOT autograd: kiln.compile(..., backend="aot_eager") trains like eager."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import recent_reports
from tests.autograd.conftest import assert_same_state, make_sgd_step


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)
        self.ln = torch.nn.LayerNorm(3)

    def forward(self, x):
        return self.ln(self.fc(F.gelu(self.bn(self.conv(x))).flatten(1)))


def test_training_loop_with_kiln_compile_matches_eager():
    torch.manual_seed(0)
    eager = Net()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model, backend="aot_eager")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(2, 2, 6, 6)
        for net, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        assert_same_state(eager, model)
    assert int(model.bn.num_batches_tracked) == 3
    assert recent_reports()[-1].saved_bytes["min_cut"] <= recent_reports()[-1].saved_bytes["save_all"]


def test_whole_training_step_with_kiln_compile():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = copy.deepcopy(eager)

    eager_step, compiled_step = make_sgd_step(eager), kiln.compile(make_sgd_step(model), backend="aot_eager")
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 1)
        torch.testing.assert_close(compiled_step(x, y), eager_step(x, y))
        assert_same_state(eager, model)
