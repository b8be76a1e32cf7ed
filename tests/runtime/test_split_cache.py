"""Warm start of frames whose graph holds a graph-level cond or while_loop (kiln/runtime/pieces.py's
"split" artifact): the backend's output is a split GraphModule whose pieces and branches are
compiled apart; the frame cache stores the outer graph as data (checked against a small grammar
when read back) beside each piece's recipe. A second process serves every frame from disk with no
capture and eager's values and gradients; entries whose files were flipped, cut short or had a
branch's library swapped, forged recipes (a call outside the grammar, a parameter name that would
be code) and a branch whose code changed are never run, and the frame is compiled again (those in
test_split_cache_refused.py, a file of its own so that `make test`'s two workers share the cost).
map, scan and associative_scan are unrolled by capture (no graph-level op): their frames are
ordinary ones, checked here to be served from disk too.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiln.runtime import artifact
from kiln.runtime.pieces import NotSplitData, SplitNode, Use, _check
from tests.reliability import cache_harness as harness

MODELS = textwrap.dedent("""
    import torch
    from torch._higher_order_ops import associative_scan, map as hop_map, scan, while_loop

    W = torch.linspace(-1, 1, 20).reshape(4, 5).requires_grad_()


    def true_fn(t):
        return t.exp() * W


    def false_fn(t):
        return t - W


    def cond_named(x):
        return torch.cond(x.mean() > 0, true_fn, false_fn, (x,)) * 2


    def cond_lambdas(x):
        y = x * 2
        return torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos() * 3, (y,)) + 1


    def cond_tuple(x):
        a, b = torch.cond(x.sum() > 0, lambda t, u: (t + u, t * u), lambda t, u: (t - u, t / (u.abs() + 1)),
                          (x, x.cos()))
        return a * 2 + b


    def cond_nested(x):
        def outer_true(t):
            return torch.cond(t.max() > 1.0, lambda s: s * 3, lambda s: s.neg(), (t,)) + 1

        return torch.cond(x.sum() > 0, outer_true, lambda t: t.tanh(), (x,))


    def while_doubling(x):
        return while_loop(lambda v: v.abs().sum() < 50, lambda v: (v * 2,), (x * 1.0 + 0.01,))[0] - 1


    def while_counter(x):
        def body(i, v):
            return i + 1, v * 1.5 + W
        i, v = while_loop(lambda i, v: (v.abs().sum() < 100) & (i < 20), body, (torch.tensor(0), x))
        return v * i


    def while_in_cond(x):
        return torch.cond(x.sum() > 0, lambda t: while_loop(lambda v: v.sum() < 40, lambda v: (v + t.abs(),),
                                                            (t.abs() + 0.1,))[0],
                          lambda t: t * 2, (x,))


    def scan_sum(x):
        carry, ys = scan(lambda c, xi: (c * 0.5 + xi, (c * xi).sin()), torch.zeros(5), x)
        return carry + ys.sum(0)


    def assoc_sum(x):
        return associative_scan(lambda a, b: a + b, x, dim=1, combine_mode="generic").sin()


    def map_rows(x):
        return hop_map(lambda row: row.cos() * W[0], x)


    # inputs that take each branch (each inner branch of the nested cond; 1 to several iterations)
    INPUTS = [torch.full((4, 5), 0.7), -torch.full((4, 5), 0.7), torch.full((4, 5), 0.1),
              torch.linspace(-1, 2, 20).reshape(4, 5)]
""")

# Each named function compiled, each run on every input in each mode ("infer": no input requires
# grad; "train": x requires grad, and the gradients of x and W are compared too); one report line.
SCRIPT = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import torch, kiln
    import hopmodels as m
    names, modes = sys.argv[1].split(","), sys.argv[2].split(",")
    err, first = 0.0, None
    for name in names:
        fn = getattr(m, name)
        compiled = kiln.compile(fn, options={"opt_level": "-O1"})
        for mode in modes:
            for x0 in m.INPUTS:
                results = []
                for f in (compiled, fn):
                    x = x0.clone().requires_grad_(mode == "train")
                    out = f(x)
                    if first is None:
                        first = time.perf_counter() - start
                    grads = torch.autograd.grad(out.sum(), [x, m.W], allow_unused=True) if mode == "train" else ()
                    results.append([out.detach(), *grads])
                for a, b in zip(*results):
                    if (a is None) != (b is None):
                        err = float("inf")
                    elif a is not None:
                        err = max(err, (a - b).abs().max().item() if a.numel() else 0.0)
    stats = kiln.stats()
    print(json.dumps({"err": err, "disk_hits": stats["disk_hits"], "frames": stats["frames"],
                      "compiles": stats["compiles"], "fallbacks": stats["fallbacks"], "first_s": first}))
""")

SPLIT_CASES = ["cond_named", "cond_lambdas", "cond_tuple", "cond_nested", "while_doubling", "while_counter",
               "while_in_cond"]
UNROLLED_CASES = ["scan_sum", "assoc_sum", "map_rows"]


def _setup(tmp_path: Path, models: str = MODELS) -> tuple[Path, Path]:
    code = harness.snapshot(tmp_path)
    (code / "hopmodels.py").write_text(models)
    return code, tmp_path / "cache"


def _run(code: Path, cache: Path, names: list[str], modes: str = "infer,train") -> tuple[dict[str, Any], str]:
    report, err = harness.run(code, cache, SCRIPT.replace("sys.argv[1]", repr(",".join(names)))
                              .replace("sys.argv[2]", repr(modes)))
    assert report["err"] < 1e-4 and report["fallbacks"] == 0, (report, err[-3000:])
    return report, err


def _entries(cache: Path) -> list[Path]:
    return harness.files(cache, ".entry")


@pytest.mark.cpp
@pytest.mark.parametrize("names", [SPLIT_CASES[:4], SPLIT_CASES[4:], UNROLLED_CASES], ids=["cond", "while", "unrolled"])
def test_second_process_serves_conds_and_loops_from_disk(tmp_path: Path, names: list[str]) -> None:
    # a few frames per process: each process has harness.run's 300 s on a loaded machine
    code, cache = _setup(tmp_path)
    first, log = _run(code, cache, names)
    assert first["disk_hits"] == 0 and first["frames"] >= len(names), first
    assert "not stored" not in log, log[-3000:]
    second, log = _run(code, cache, names)  # values and gradients compared with eager inside
    assert second["frames"] == 0 and second["compiles"] == 0, (second, log[-3000:])
    assert second["disk_hits"] == first["compiles"], (first, second)


def _node(op: str, name: str, target: str = "", args: tuple = ()) -> SplitNode:
    return SplitNode(op, name, target, args)


PIECE = artifact.Recipe("wrapper", {})  # never rebuilt by the grammar check


def _fields(nodes: list[SplitNode], modules: tuple[str, ...] = ("submod_0", "cond_true_0", "cond_false_0")) -> dict:
    return {"nodes": tuple(nodes), "modules": {m: PIECE for m in modules}}


GOOD = [_node("placeholder", "x"), _node("call_module", "submod_0", "submod_0", (Use(0),)),
        _node("call_function", "pred", "getitem", (Use(1), 0)),
        _node("get_attr", "cond_true_0", "cond_true_0"), _node("get_attr", "cond_false_0", "cond_false_0"),
        _node("call_function", "cond", "cond", (Use(2), Use(3), Use(4), (Use(0),))),
        _node("call_function", "out", "getitem", (Use(5), 0)), _node("output", "output", "", ((Use(6),),))]


def test_the_split_grammar_admits_what_capture_makes_and_nothing_else() -> None:
    _check(_fields(GOOD))
    bad = {
        "a later node": {1: _node("call_module", "submod_0", "submod_0", (Use(3),))},
        "itself": {2: _node("call_function", "pred", "getitem", (Use(2), 0))},
        "a getter called as a piece": {1: _node("call_module", "submod_0", "submod_0", (Use(0),)),
                                       6: _node("call_function", "out", "getitem", (Use(3), 0))},
        "a getter as the predicate": {5: _node("call_function", "cond", "cond", (Use(3), Use(3), Use(4), ()))},
        "a value as a branch": {5: _node("call_function", "cond", "cond", (Use(2), Use(0), Use(4), ()))},
        "an unknown function": {2: _node("call_function", "pred", "eval", (Use(1), 0))},
        "a float index": {2: _node("call_function", "pred", "getitem", (Use(1), 0.5))},
        "a string argument": {2: _node("call_function", "pred", "getitem", (Use(1), "os"))},
        "a keyword name": {0: _node("placeholder", "lambda")},
        "a name that is code": {0: _node("placeholder", "x=print(1)")},
        "a dunder name": {0: _node("placeholder", "__import__")},
        "a target on a placeholder": {0: _node("placeholder", "x", "y")},
        "a placeholder after a call": {3: _node("placeholder", "y")},
        "a piece not stored": {1: _node("call_module", "submod_0", "submod_1", (Use(0),))},
        "an output in the middle": {6: _node("output", "out", "", (Use(5),))},
        "a foreign op": {1: _node("call_method", "submod_0", "submod_0", (Use(0),))},
        "a record that is no Use": {1: _node("call_module", "submod_0", "submod_0", ({"index": 0},))},
    }
    for why, edits in bad.items():
        nodes = [edits.get(i, n) for i, n in enumerate(GOOD)]
        with pytest.raises(NotSplitData):
            _check(_fields(nodes))
            pytest.fail(why)
    for modules in [("submod_0", "cond_true_0"), ("submod_0", "cond_true_0", "cond_false_0", "submod_9"),
                    ("submod_0", "cond_true_0", "cond_false_0", "forward")]:
        with pytest.raises(NotSplitData):
            _check(_fields(GOOD, modules))
    with pytest.raises(NotSplitData):
        _check({"nodes": tuple(GOOD), "modules": {"submod_0": PIECE, "cond_true_0": PIECE, "cond_false_0": "x"}})
