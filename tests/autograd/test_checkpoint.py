"""Checkpointed regions in AOT autograd: the partitioner recomputes them, as the policy says.

The partitioner tests start mid-pipeline: a torch-level graph from fx.symbolic_trace whose region
nodes are tagged by hand as capture tags them (meta "recompute", "ac_graph_id", and the selective
policy). The same graph untagged is the control: its matmuls are pinned to the forward and saved.
The end-to-end test compiles a transformers model with gradient checkpointing on.
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

import kiln
from kiln.autograd import aot_saved_bytes, recent_reports
from kiln.autograd.checkpoint import recompute_plan

PREFER = CheckpointPolicy.PREFER_RECOMPUTE


class TwoMatmuls(torch.nn.Module):
    """x -> mm -> gelu -> mm -> tanh; the region is the middle (both matmuls and the gelu)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(16, 32))
        self.w2 = torch.nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        h = torch.nn.functional.gelu(torch.mm(x, self.w1))
        y = torch.mm(h, self.w2)
        return torch.tanh(y).sum()


def _traced(tag_ops: set[str], region: int = 1, policy=None, module: torch.nn.Module | None = None) -> fx.GraphModule:
    gm = fx.symbolic_trace(module or TwoMatmuls())
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target.__name__ in tag_ops:
            node.meta["recompute"] = PREFER
            node.meta["ac_graph_id"] = region
            if policy is not None:
                node.meta["checkpoint_policy"] = policy
    return gm


def _report(gm: fx.GraphModule):
    return aot_saved_bytes(gm, [torch.randn(8, 16, requires_grad=True)])


def _activations(report) -> set[str]:
    return {s.produced_by for s in report.saved if s.produced_by != "input"}


def test_untagged_graph_saves_its_matmuls() -> None:
    report = _report(_traced(set()))
    assert "aten.mm.default" in _activations(report)
    assert not any(r.region is not None for r in report.recomputed)


def test_region_is_recomputed_not_saved() -> None:
    report = _report(_traced({"mm", "gelu"}))
    # the region's intermediates (mm, gelu, the second mm) are recomputed: only inputs are saved
    assert _activations(report) == set()
    recomputed = {r.op for r in report.recomputed if r.region == 1}
    assert recomputed == {"aten.mm.default", "aten.gelu.default"}
    assert {r.policy for r in report.recomputed if r.region == 1} == {"PREFER_RECOMPUTE"}
    assert report.saved_bytes["min_cut"] < report.saved_bytes["save_all"]
    assert "checkpoint region 1:" in str(report)


def test_selective_policy_saves_what_it_names() -> None:
    calls = []

    def save_gelu(ctx, op, *args, **kwargs):
        calls.append(op)
        assert not ctx.is_recompute and isinstance(ctx.op_output, torch.Tensor)
        return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.gelu.default else CheckpointPolicy.PREFER_RECOMPUTE

    report = _report(_traced({"mm", "gelu"}, policy=save_gelu))
    assert torch.ops.aten.mm.default in calls and torch.ops.aten.gelu.default in calls
    # gelu's output is saved (w2's gradient reads it); the first matmul, gelu's input, is recomputed
    assert "aten.gelu.default" in _activations(report) and "aten.mm.default" not in _activations(report)
    assert {r.op for r in report.recomputed if r.region == 1} == {"aten.mm.default"}
    assert {r.policy for r in report.recomputed if r.region == 1} == {"PREFER_RECOMPUTE"}


def test_selective_policy_saving_matmuls() -> None:
    def save_mm(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.MUST_RECOMPUTE

    report = _report(_traced({"mm", "gelu"}, policy=save_mm))
    assert "aten.mm.default" in _activations(report)  # the first matmul: what gelu's backward reads
    assert {r.op for r in report.recomputed if r.region == 1} == {"aten.gelu.default"}
    assert {r.policy for r in report.recomputed if r.region == 1} == {"MUST_RECOMPUTE"}


@pytest.mark.parametrize("save", [CheckpointPolicy.PREFER_SAVE, CheckpointPolicy.MUST_CPU_OFFLOAD, True])
def test_other_save_answers_pin_or_keep_the_op(save) -> None:
    # PREFER_SAVE leaves the op to the min-cut (a matmul stays pinned and saved), an offload policy
    # saves in place, and the old boolean form True means MUST_SAVE
    report = _report(_traced({"mm", "gelu"}, policy=lambda ctx, op, *a, **k: save if op is torch.ops.aten.mm.default
                             else CheckpointPolicy.MUST_RECOMPUTE))
    assert "aten.mm.default" in _activations(report)
    assert {r.op for r in report.recomputed if r.region == 1} == {"aten.gelu.default"}


def test_random_op_in_a_region_is_saved() -> None:
    class Dropout(TwoMatmuls):
        def forward(self, x):
            h = torch.nn.functional.dropout(torch.mm(x, self.w1), 0.5, True)
            return torch.tanh(torch.mm(h, self.w2)).sum()

    gm = fx.symbolic_trace(Dropout())
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta.update(recompute=PREFER, ac_graph_id=1)
    report = _report(gm)
    assert "aten.bernoulli.p" in _activations(report)
    assert all(r.op != "aten.bernoulli.p" for r in report.recomputed)


def test_boundary_between_consecutive_regions_is_saved() -> None:
    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            a = torch.mm(x, self.w).sin()  # region 1
            b = torch.mm(a, self.w).cos()  # region 2
            return torch.mm(b, self.w).tanh().sum()  # region 3

    gm = fx.symbolic_trace(Chain())
    region = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.mm:
            region += 1
        if node.op == "call_function" and node.target is not getattr(torch, "sum"):
            node.meta.update(recompute=PREFER, ac_graph_id=region)
    report = _report(gm)
    # the outputs of regions 1 and 2 are the inputs of the next: kept, as eager keeps them
    assert sorted(s.produced_by for s in report.saved if s.produced_by != "input") == ["aten.cos.default",
                                                                                       "aten.sin.default"]


def test_plan_keeps_a_region_input_made_outside_it() -> None:
    gm = _traced({"mm_1", "tanh"})  # only the second matmul and tanh: gelu's output is the input
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.name in ("mm_1", "tanh"):
            node.meta.update(recompute=PREFER, ac_graph_id=1)
    report = _report(gm)
    assert "aten.gelu.default" in _activations(report)


def test_plan_of_a_joint_graph() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.sin.default, (x,))
    b = graph.call_function(torch.ops.aten.cos.default, (a,))
    c = graph.call_function(torch.ops.aten.exp.default, (b,))
    graph.output((c,))
    a.meta.update(recompute=PREFER, ac_graph_id=1)
    b.meta.update(recompute=CheckpointPolicy.MUST_SAVE, ac_graph_id=1)
    c.meta.update(recompute=PREFER, ac_graph_id=2)
    plan = recompute_plan(list(graph.nodes))
    assert plan == {a: PREFER, b: CheckpointPolicy.MUST_SAVE, c: PREFER}


def test_aot_graphs_log_shows_the_recomputed_region(caplog) -> None:
    from kiln import log
    from kiln.autograd import aot_eager

    log.configure("aot_graphs")
    try:
        aot_eager(_traced({"mm", "gelu"}, region=7), [torch.randn(8, 16, requires_grad=True)])
    finally:
        log.configure("")
    assert "recomputed in the backward" in caplog.text and "checkpoint region 7:" in caplog.text


# ------------------------------------------------------------------------------ a transformers model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))


@pytest.mark.parametrize("reentrant", [False, True])
def test_transformers_gradient_checkpointing_matches_eager(reentrant: bool) -> None:
    pytest.importorskip("transformers")
    import real_models as rm
    import torch._dynamo

    entry = rm.MODELS["llama"]

    def build():
        model = entry.build()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return model

    want = rm.run_call(build(), lambda m: m, entry, True)
    kiln.reset()
    model = build()
    got = rm.run_call(model, lambda m: kiln.compile(m, backend="aot_eager"), entry, True)
    rm.assert_close_trees(got[0], want[0], entry.tol, "outputs")
    rm.assert_close_trees(got[1], want[1], entry.tol, "grads")
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["graph_breaks"] == 0
    report = recent_reports()[-1]
    assert len({r.region for r in report.recomputed if r.region is not None}) == 2  # one per layer
    assert not any("aten.mm" in s.produced_by or "aten.bmm" in s.produced_by for s in report.saved)
    torch._dynamo.reset()
    model.train()
    assert torch._dynamo.explain(build().train())(**entry.inputs(True)).graph_count == 1


@pytest.mark.cpp
def test_html_report_lists_the_recomputed_region(tmp_path) -> None:
    from torch.utils.checkpoint import checkpoint

    from kiln.debug import report

    lin = torch.nn.Linear(8, 8)

    def fn(x):
        return checkpoint(lambda t: lin(t).relu() * 2, x, use_reentrant=False).sum()

    with kiln.config.patch(report_dir=str(tmp_path / "report"), persistent_cache=False,
                           cache_dir=str(tmp_path / "cache")):
        kiln.reset()
        report.uninstall()
        report.install()
        try:
            kiln.compile(fn)(torch.randn(4, 8, requires_grad=True)).backward()
            path = report.write()
        finally:
            report.uninstall()
            kiln.reset()
    page = open(path).read()
    assert "recomputed in the backward" in page and "checkpointed regions" in page
    assert "aten.addmm.default" in page.split("recomputed in the backward", 1)[1]
