"""Indices out of range in compiled code: the error eager raises, never a read or write outside a tensor.

Each indexing op (x[i], gather, index_select, embedding, index_put_ with and without accumulate,
scatter, scatter_add, index_add, index_copy, index_fill, take, take_along_dim) runs eagerly and through kiln.compile(backend="inductor") on in-range indices,
indices past the end, negative indices (which only x[i] and index_put wrap) and indices far outside
any allocation (2**40, in a subprocess, so that a wild access would kill that process, not pytest).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kiln
from kiln.autograd import trace_aten
from kiln.lower import compile_graph


def _index(x, i):
    return x[i] * 2


def _index_2d(x, i):
    return x[i, i] + 1


def _gather(x, i):
    return torch.gather(x, 0, i) + 1


def _index_select(x, i):
    return torch.index_select(x, 0, i) - 1


def _embedding(x, i):
    return torch.nn.functional.embedding(i, x.reshape(-1, 1)) * 3


def _index_put(x, i):
    return x.clone().index_put_((i,), torch.tensor(9.0))


def _index_put_accumulate(x, i):
    return x.clone().index_put_((i,), torch.tensor(9.0), accumulate=True)


def _index_put_input(x, i):
    x.index_put_((i,), torch.tensor(7.0))  # in place on the caller's tensor
    return x + 0


def _scatter(x, i):
    return x.clone().scatter_(0, i, 9.0)


def _scatter_add(x, i):
    return x.clone().scatter_add_(0, i, torch.ones(i.shape))


def _index_add(x, i):
    return x.clone().index_add_(0, i, torch.ones(i.shape), alpha=2)


def _index_copy(x, i):
    return x.clone().index_copy_(0, i, torch.arange(float(len(i))))


def _index_fill(x, i):
    return x.clone().index_fill_(0, i, -1.0)


def _take(x, i):
    return x.take(i) + 1


def _take_along_dim(x, i):
    return torch.take_along_dim(x, i) * 2


OPS = [_index, _index_2d, _gather, _index_select, _embedding, _index_put, _index_put_accumulate,
       _index_put_input, _scatter, _scatter_add, _index_add, _index_copy, _index_fill, _take, _take_along_dim]
WRAPS_NEGATIVE = (_index, _index_2d, _index_put, _index_put_accumulate, _index_put_input, _index_fill, _take)
INDICES = {
    "in_range": [1, 4, 0],
    "past_the_end": [1, 5, 0],
    "negative_in_range": [-1, 2, -5],  # eager wraps these for x[i] and index_put, rejects them elsewhere
    "negative_past_the_start": [0, -6, 1],
    "large": [3, 2 ** 33],
}


def _input(fn):
    return torch.arange(25.0).reshape(5, 5) if fn is _index_2d else torch.arange(5.0)


def _outcome(fn, x, i):
    try:
        return fn(x, i), None
    except Exception as exc:  # the test compares what eager and compiled code raise
        return None, exc


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


@pytest.mark.parametrize("case", list(INDICES))
@pytest.mark.parametrize("fn", OPS, ids=[f.__name__.strip("_") for f in OPS])
def test_compiled_indexing_raises_what_eager_raises(fn, case) -> None:
    i = torch.tensor(INDICES[case])
    x_eager, x_compiled = _input(fn), _input(fn)
    expected, eager_error = _outcome(fn, x_eager, i)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn: the kernels must answer
        got, error = _outcome(kiln.compile(fn, backend="inductor"), x_compiled, i)
    assert kiln.stats()["fallbacks"] == 0
    if eager_error is None:
        assert error is None, f"compiled code raised {error!r} where eager returned"
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x_compiled, x_eager)
    else:
        assert type(error) is type(eager_error), f"eager raised {eager_error!r}, compiled code {error!r}"
        assert str(error).splitlines()[0] == str(eager_error).splitlines()[0], (eager_error, error)


def test_index_into_an_empty_dim_reads_nothing() -> None:
    x = torch.empty(0, 3)
    fn = kiln.compile(lambda x, i: x[i] + 1, backend="inductor")
    with pytest.raises(IndexError, match="size 0"):
        fn(x, torch.tensor([0]))
    assert fn(x, torch.tensor([], dtype=torch.int64)).shape == (0, 3)


def test_second_index_tensor_names_its_dim() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    fn = kiln.compile(lambda x, i, j: x[i, j] * 2, backend="inductor")
    torch.testing.assert_close(fn(x, torch.tensor([2, 0]), torch.tensor([3, -4])), x[[2, 0], [3, -4]] * 2)
    with pytest.raises(IndexError, match="dimension 1 with size 4"):
        fn(x, torch.tensor([2, 0]), torch.tensor([3, 4]))


def test_checks_run_inside_the_kernels() -> None:
    """The lowering itself checks (no ATen call does it for the kernel): one fused kernel, no externs."""
    gm = torch.fx.symbolic_trace(lambda x, i: torch.gather(x, 0, i) * 2 + x[i])
    args = (torch.arange(5.0), torch.tensor([1, 3]))
    compiled = compile_graph(trace_aten(gm, args), args)
    assert compiled.extern_count == 0 and compiled.kernel_count == 1
    assert "kiln_index_ok" in compiled.cpp_source
    torch.testing.assert_close(compiled(*args)[0], torch.gather(args[0], 0, args[1]) * 2 + args[0][args[1]])
    with pytest.raises(RuntimeError, match="^index 9 is out of bounds for dimension 0 with size 5$"):
        compiled(args[0], torch.tensor([1, 9]))


def test_indices_far_outside_memory_do_not_crash_the_process() -> None:
    """2**40 elements past a 5-element tensor: an unchecked load or store there is a segfault."""
    script = textwrap.dedent("""
        import torch, kiln
        kiln.config.persistent_cache = False
        x = torch.arange(5.0)
        ops = {
            "index": lambda x, i: x[i] + 1,
            "gather": lambda x, i: torch.gather(x, 0, i) + 1,
            "index_select": lambda x, i: torch.index_select(x, 0, i) + 1,
            "embedding": lambda x, i: torch.nn.functional.embedding(i, x.reshape(-1, 1)) + 1,
            "index_put": lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0)),
            "index_put_accumulate": lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0), accumulate=True),
            "scatter": lambda x, i: x.clone().scatter_(0, i, 1.0),
            "scatter_add": lambda x, i: x.clone().scatter_add_(0, i, torch.ones(i.shape)),
        }
        for name, fn in ops.items():
            for bad in (2 ** 40, -2 ** 40, 2 ** 62):
                i = torch.tensor([1, bad])
                kinds = []
                for f in (fn, kiln.compile(fn, backend="inductor")):
                    try:
                        f(x, i)
                        kinds.append("none")
                    except Exception as exc:
                        kinds.append(type(exc).__name__)
                print(name, bad, *kinds, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")[:-1]
    assert len(lines) == 24, done.stdout
    for line in lines:
        name, bad, eager, compiled = line.split()
        assert eager != "none" and compiled == eager, line


def test_wide_embedding_rows_are_checked() -> None:
    """A row index invariant over the inner loop: its check is hoisted there, never dropped."""
    w = torch.randn(10, 64)
    fn = kiln.compile(lambda w, i: torch.nn.functional.embedding(i, w) * 2, backend="inductor")
    good = torch.tensor([[0, 9], [3, 3]])
    torch.testing.assert_close(fn(w, good), torch.nn.functional.embedding(good, w) * 2)
    for bad in (10, -1, 2 ** 40):
        with pytest.raises(IndexError, match="^index out of range in self$"):
            fn(w, torch.tensor([[0, 9], [bad, 3]]))


def test_checks_survive_the_persistent_cache(tmp_path) -> None:
    """A wrapper rebuilt from the disk cache in a new process still raises what eager raises."""
    script = textwrap.dedent("""
        import torch, kiln
        kiln.config.persistent_cache = True
        g = kiln.compile(lambda x, i: torch.gather(x, 0, i) + 1)
        x = torch.arange(5.0)
        assert g(x, torch.tensor([1, 2])).tolist() == [2.0, 3.0]
        try:
            g(x, torch.tensor([1, 9]))
            print("no error")
        except RuntimeError as exc:
            print("RuntimeError", "index 9" in str(exc))
        print("disk_hits", kiln.stats()["disk_hits"])
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
            for _ in range(2)]
    for run, hits in zip(runs, ("0", "1")):
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split("\n")[:2] == ["RuntimeError True", f"disk_hits {hits}"], run.stdout


def test_symbolic_sizes_are_checked_against_the_real_size() -> None:
    """Under dynamic shapes the bound is a size symbol read off the input at each call."""
    g = kiln.compile(lambda x, i: torch.gather(x, 0, i) + x[i], backend="inductor", dynamic=True)
    for n in (5, 7):
        x = torch.arange(float(n))
        torch.testing.assert_close(g(x, torch.tensor([1, n - 1])), x[[1, n - 1]] * 2)
        for bad in (n, -1):
            with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds for dimension 0 with size {n}"):
                g(x, torch.tensor([0, bad]))
    assert kiln.stats()["compiles"] == 1 and kiln.stats()["fallbacks"] == 0


def _put_values(x, i, v):
    return x.index_put((i,), v * 2)


def _put_values_accumulate(x, i, j, v):
    return x.index_put((i, j), v, accumulate=True) + 1


def _setitem_values(x, i, v):
    y = x.clone()
    y[:, i] = v  # x[..] = v drops v's leading 1s first; index_put itself does not
    return y


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [False, True])
def test_index_put_values_must_broadcast_to_the_indexing_result(dynamic) -> None:
    """Values that do not broadcast to x[indices] raise eager's shape mismatch, also when only a later
    call (a cached kernel, or symbolic sizes) brings the bad shape: never a read past the values."""
    i = torch.tensor([0, 1])
    calls = [
        (_put_values, [(torch.randn(4, 3), i, torch.randn(3)), (torch.randn(4, 3), i, torch.randn(2)),
                       (torch.randn(4, 3), i, torch.randn(2, 1)), (torch.randn(4, 3), i, torch.randn(3, 3)),
                       (torch.randn(4, 3), i, torch.randn(1, 2, 3)), (torch.randn(5, 4), i, torch.randn(2, 4))]),
        (_put_values_accumulate, [(torch.randn(4, 3), i, i + 1, torch.randn(2)),
                                  (torch.randn(4, 3), i, i + 1, torch.randn(3)),
                                  (torch.randn(4, 3), i, torch.tensor([1]), torch.randn(1))]),
        (_setitem_values, [(torch.randn(4, 3), i, torch.randn(4, 2)), (torch.randn(4, 3), i, torch.randn(3, 2)),
                           (torch.randn(4, 3), i, torch.randn(1, 1, 2)), (torch.randn(4, 3), i, torch.randn(2, 4))]),
    ]
    for fn, arg_lists in calls:
        compiled = kiln.compile(fn, backend="inductor", dynamic=dynamic)
        for args in arg_lists:
            expected, eager_error = _call(fn, args)
            got, error = _call(compiled, args)
            if eager_error is None:
                assert error is None, f"{fn.__name__}{[tuple(a.shape) for a in args]}: compiled raised {error!r}"
                torch.testing.assert_close(got, expected)
            else:
                assert type(error) is type(eager_error) and "shape mismatch" in str(error), (eager_error, error)
    assert kiln.stats()["fallbacks"] == 0


def _call(fn, args):
    try:
        return fn(*args), None
    except Exception as exc:  # compared with what eager raises
        return None, exc


EXPANDED = {  # indexing along a dim of stride 0: the offset does not depend on the index
    "index": lambda x, i: x.expand(4, 3)[i] * 2,
    "gather": lambda x, i: x.t().expand(3, 4).gather(1, i.expand(3, 1)),
    "index_select": lambda x, i: x.expand(4, 3).index_select(0, i) + 1,
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x.expand(4, 3)),
    "broadcast_sum": lambda x, i: (x + torch.zeros(4, 1))[i],
    "take": lambda x, i: torch.take(x.expand(4, 3)[:, :1], i),
}


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", list(EXPANDED))
def test_indices_into_an_expanded_dim_are_checked(name, dynamic) -> None:
    """x.expand(4, 3)[4] raises in eager although every row is the same memory; the bound check
    must survive the index's offset folding to 0."""
    fn = EXPANDED[name]
    compiled = kiln.compile(fn, backend="inductor", dynamic=dynamic)
    x = torch.randn(1, 3)
    for i in ([3], [4], [-5], [1]):
        expected, eager_error = _call(fn, (x, torch.tensor(i)))
        got, error = _call(compiled, (x, torch.tensor(i)))
        assert type(error) is type(eager_error), (i, eager_error, error)
        if eager_error is None:
            torch.testing.assert_close(got, expected)
    assert kiln.stats()["fallbacks"] == 0


_W = torch.randn(3, 4)
_EAGER_TEXT_CASES = {
    "index": lambda w, i: w[i] * 2,
    "index_put": lambda w, i: w.clone().index_put_((i,), torch.tensor(1.0)) * 2,
    "gather": lambda w, i: torch.gather(w, 0, i.view(1, 1).expand(1, 4)) * 2,
    "scatter": lambda w, i: w.clone().scatter_(0, i.view(1, 1).expand(1, 4), 1.0) * 2,
    "index_select": lambda w, i: torch.index_select(w, 0, i) * 2,
    "index_select_1d": lambda w, i: torch.index_select(w[0], 0, i + 1) * 2,
    "embedding": lambda w, i: torch.nn.functional.embedding(i, w) * 2,
    "index_add_1d": lambda w, i: torch.zeros(3).index_add_(0, i, torch.ones(1)) * 2,
    "index_add_nd": lambda w, i: w.clone().index_add_(0, i, torch.ones(1, 4)) * 2,
    "index_copy": lambda w, i: w.clone().index_copy_(0, i, torch.ones(1, 4)) * 2,
    "index_fill": lambda w, i: w.clone().index_fill_(0, i, 1.0) * 2,
}


@pytest.mark.parametrize("name", sorted(_EAGER_TEXT_CASES))
def test_an_out_of_range_index_raises_eagers_class_and_text(name: str) -> None:
    fn = _EAGER_TEXT_CASES[name]
    i = torch.tensor([3])
    with pytest.raises(Exception) as eager:
        fn(_W, i)
    compiled = kiln.compile(fn)
    torch.testing.assert_close(compiled(_W, torch.tensor([1])), fn(_W, torch.tensor([1])))
    with pytest.raises(Exception) as ours:
        compiled(_W, i)
    assert (type(ours.value), str(ours.value).splitlines()[0]) == (type(eager.value), str(eager.value).splitlines()[0])


_TAKE_INPUTS = {  # take counts elements of the flattened tensor in row-major order, whatever the strides
    "contiguous": lambda: torch.arange(12.0).reshape(3, 4),
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "offset_view": lambda: torch.arange(30.0).reshape(5, 6)[1:4, 2:6],
    "stepped": lambda: torch.arange(24.0)[1::2].reshape(3, 4),
    "channels_last": lambda: torch.arange(24.0).reshape(1, 2, 3, 4).contiguous(memory_format=torch.channels_last),
    "zero_dim": lambda: torch.tensor(7.0),
    "int": lambda: torch.arange(12).reshape(3, 4).t(),
    "half": lambda: torch.arange(12.0).half().reshape(2, 6)[:, ::2],
    "empty": lambda: torch.empty(0, 3),
}


@pytest.mark.parametrize("name", list(_TAKE_INPUTS))
def test_take_reads_flat_row_major_elements_and_raises_eagers_text(name) -> None:
    def fn(x, i):
        return torch.take(x, i) * 2

    compiled = kiln.compile(fn, backend="inductor")
    x = _TAKE_INPUTS[name]()
    n = x.numel()
    cases = [[0, -1], [[n - 1, 0], [-n, n // 2]], [n], [-n - 1], [0]] if n else [[0], []]
    for i in cases:
        index = torch.tensor(i, dtype=torch.int64)
        expected, eager_error = _call(fn, (x, index))
        got, error = _call(compiled, (x, index))
        assert type(error) is type(eager_error), (i, eager_error, error)
        if eager_error is None:
            torch.testing.assert_close(got, expected)
        else:
            assert str(error) == str(eager_error), (i, eager_error, error)
    assert kiln.stats()["fallbacks"] == 0


def test_take_gradient_lands_on_the_flat_positions() -> None:
    def fn(x, i):
        return (torch.take(x.t(), i) ** 2).sum()

    x1 = torch.randn(3, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    i = torch.tensor([[0, 5], [5, -1]])
    fn(x1, i).backward()
    kiln.compile(fn, backend="inductor")(x2, i).backward()
    torch.testing.assert_close(x2.grad, x1.grad)


_INDEXINGS = {
    "last_dim_only": lambda x, i, j: x[:, :, i] * 2,
    "middle_pair": lambda x, i, j: x[:, i, j] * 2,
    "split_pair": lambda x, i, j: x[:, i, :, j] * 2,
    "first_dim": lambda x, i, j: x[i] * 2,
    "first_and_last": lambda x, i, j: x[i, ..., j] * 2,
}


def _put_last(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, :, :, i] = 1.0
    return y


def _put_pair(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, i, j] = 1.0
    return y


def _message(fn, *args) -> tuple[type, str]:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return type(e), str(e)
    raise AssertionError("no error")


@pytest.mark.parametrize("name", sorted(_INDEXINGS) + ["put_last", "put_pair"])
@pytest.mark.parametrize("bad", ["first", "second"])
def test_advanced_index_error_names_the_index_tensor_as_eager(name: str, bad: str) -> None:
    """aten.index / index_put count the dim in their error among the index tensors, not the
    tensor's dims: x[:, :, i] out of range says 'dimension 0' in eager."""
    fn = {"put_last": _put_last, "put_pair": _put_pair}.get(name) or _INDEXINGS[name]
    x = torch.arange(2 * 8 * 5 * 3, dtype=torch.float32).reshape(2, 8, 5, 3)
    good = torch.tensor([1, 0])
    wrong = torch.tensor([1, 9])
    i, j = (wrong, good) if bad == "first" else (good, wrong)
    compiled = kiln.compile(fn, backend="inductor")
    torch.testing.assert_close(compiled(x, good, good), fn(x, good, good))
    try:
        fn(x, i, j)
    except Exception:
        pass
    else:  # this program does not read the wrong index (it uses only the first tensor)
        torch.testing.assert_close(compiled(x, i, j), fn(x, i, j))
        return
    assert _message(compiled, x, i, j) == _message(fn, x, i, j)
