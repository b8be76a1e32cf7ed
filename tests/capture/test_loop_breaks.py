"""A graph break inside a loop: the resume function's guard on the rest of the iterator asks only
for what the trace read, so a loop that breaks on every iteration compiles a few times, not once
per iteration (and never reaches config.cache_size_limit)."""
from __future__ import annotations

import torch

import kiln


def run_counted(fn, *args):
    """(kiln's output, eager's output, kiln.stats()) with printing silenced."""
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        got = kiln.compile(fn, backend="eager")(*args)
    stats = kiln.stats()
    return got, fn(*args), stats


def range_loop(x):
    for i in range(20):
        x = x * 2
        print(i)
        x = x + 1
    return x


def tensor_list_loop(xs):
    acc = xs[0] * 0
    for t in xs:
        acc = acc + t.sin()
        print("item")
    return acc


def enumerate_loop(xs):
    acc = xs[0] * 0
    for i, t in enumerate(xs):
        acc = acc + t * i
        print("item", i)
    return acc


def zip_loop(xs, ys):
    acc = xs[0] * 0
    for a, b in zip(xs, ys):
        acc = acc + a * b
        print("pair")
    return acc


def test_range_loop_breaking_every_iteration_compiles_a_few_times(capsys):
    x = torch.ones(3)
    got, expected, stats = run_counted(range_loop, x)
    out = capsys.readouterr().out
    torch.testing.assert_close(got, expected)
    assert out.split("\n")[:20] == [str(i) for i in range(20)]
    assert stats["fallbacks"] == 0
    assert stats["compiles"] <= 4, stats


def test_tensor_list_loop_compiles_a_few_times(capsys):
    xs = [torch.randn(4) for _ in range(12)]
    got, expected, stats = run_counted(tensor_list_loop, xs)
    torch.testing.assert_close(got, expected)
    assert stats["fallbacks"] == 0
    assert stats["compiles"] <= 4, stats


def test_enumerate_and_zip_loops_compile_a_few_times(capsys):
    xs = [torch.randn(4) for _ in range(12)]
    ys = [torch.randn(4) for _ in range(12)]
    got, expected, stats = run_counted(enumerate_loop, xs)
    torch.testing.assert_close(got, expected)
    assert stats["fallbacks"] == 0 and stats["compiles"] <= 5, stats
    got, expected, stats = run_counted(zip_loop, xs, ys)
    torch.testing.assert_close(got, expected)
    assert stats["fallbacks"] == 0 and stats["compiles"] <= 4, stats


def test_resume_reused_across_lists_of_other_lengths(capsys):
    # The guard asks for "at least one more item" or "exactly this many": a shorter or longer
    # list later must still give eager's answer with the graphs already compiled.
    kiln.reset()
    compiled = kiln.compile(tensor_list_loop, backend="eager")
    with kiln.config.patch(suppress_errors=False):
        for n in (6, 3, 9, 1, 6):
            xs = [torch.randn(4) for _ in range(n)]
            torch.testing.assert_close(compiled(xs), tensor_list_loop(xs))
    assert kiln.stats()["fallbacks"] == 0
    # The outer frame guards len(xs) exactly (4 lengths, as torch.compile); the loop's resume
    # function compiles twice (mid-loop, then at the end) for every length together.
    assert kiln.stats()["compiles"] <= 4 + 2, kiln.stats()


def test_partly_read_iterator_guard_fails_when_too_short():
    from kiln.capture.guards import Guard, compile_guards

    check = compile_guards([Guard("L['s']", "check_min_len", 2)])
    assert check({"s": (1, 2, 3)}, {}, None)
    assert not check({"s": (1,)}, {}, None)
    assert "fewer than the 2" in check.explain_failure({"s": (1,)}, {}, None)
