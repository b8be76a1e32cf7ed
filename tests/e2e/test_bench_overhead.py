"""The tiny-call benchmark (benchmarks.overhead): every layer of Kiln's call path it times can be
called alone and computes x + 1, and the breakdown it prints adds up to the compiled call."""
from __future__ import annotations

import pytest
import torch

from benchmarks import overhead


@pytest.mark.cpp
def test_each_layer_runs_alone() -> None:
    import kiln

    kiln.reset()
    x = torch.randn(1000)
    layers = overhead._kiln_layers(x)
    assert set(layers) >= {"frame entry", "guards", "glue", "runtime", "wrapper", "generated wrapper",
                           "allocation", "kernel"}
    assert layers["guards"]() is True
    torch.testing.assert_close(layers["frame entry"](), x + 1)
    torch.testing.assert_close(layers["generated wrapper"]()[0], x + 1)
    kiln.reset()


def test_breakdown_adds_up(capsys) -> None:
    us = {"eager": 2.0, "frame entry": 9.0, "guards": 1.0, "glue": 7.0, "runtime": 6.5, "wrapper": 6.0,
          "generated wrapper": 5.8, "allocation": 1.5, "kernel": 0.3, "torch.compile": 20.0}
    overhead.print_result({"threads": 2, "us": us})
    out = capsys.readouterr().out
    costs = [float(line.split()[-2]) for line in out.splitlines() if line.startswith("    ")]
    assert sum(costs) == pytest.approx(us["frame entry"])
    assert "+7.00 us over eager" in out
