"""Dynamic sizes over inputs that are not dense: padded rows (a slice of a wider tensor), broadcast
(stride 0) dims, slices with steps, transposes of those. Past the first gap in the dense strides, the
fake input keeps a stride as the captured integer unless a dynamic size is laid out inside it, which
gives it a symbol of its own (kiln.fake.convert.symbolic_strides); the guard checks the integers: a
later call whose padded row is wider used to pass the guards and run kernels compiled for the old
stride (a relayout into overlapping addresses: wrong values written back into the caller's tensor)."""
from __future__ import annotations

import pytest
import torch

import kiln


def add_inplace_then_scale(x):
    return x.add_(1).mul(2)


def reduce_rows(x):
    return x.sum(-1) + x[:, :1].squeeze(-1)


def padded(n, m, pad):
    base = torch.randn(n + 2, m + pad)
    return base, base[1:1 + n, pad:]


LAYOUTS = {
    "padded_rows": lambda n, m: padded(n, m, 1),
    "wide_padding": lambda n, m: padded(n, m, 3),
    "transposed_padded": lambda n, m: (lambda b: (b, b[1:1 + m, 1:].t()))(torch.randn(m + 2, n + 1)),
    "stepped_rows": lambda n, m: (lambda b: (b, b[::2]))(torch.randn(2 * n, m)),
    "broadcast_rows": lambda n, m: (lambda b: (b, b.expand(n, m)))(torch.randn(1, m)),
}
SHAPES = [(2, 3), (4, 3), (3, 5), (6, 4), (1, 3), (7, 5), (3, 3)]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dynamic", [None, True])
def test_mutated_strided_input_as_eager(layout, dynamic):
    if layout == "broadcast_rows":
        pytest.skip("eager refuses an in-place op on an expanded tensor")
    kiln.reset()
    compiled = kiln.compile(add_inplace_then_scale, dynamic=dynamic)
    for n, m in SHAPES:
        torch.manual_seed(n * 10 + m)
        base, x = LAYOUTS[layout](n, m)
        mine_base = base.clone()
        mine = mine_base.as_strided(x.shape, x.stride(), x.storage_offset())
        expected = add_inplace_then_scale(x)
        got = compiled(mine)
        torch.testing.assert_close(got, expected, msg=lambda s: f"{(n, m)}: {s}")
        assert torch.equal(mine_base, base), (n, m)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dynamic", [None, True])
def test_read_strided_input_as_eager(layout, dynamic):
    kiln.reset()
    compiled = kiln.compile(reduce_rows, dynamic=dynamic)
    for n, m in SHAPES:
        _, x = LAYOUTS[layout](n, m)
        torch.testing.assert_close(compiled(x), reduce_rows(x), msg=lambda s: f"{(n, m)}: {s}")


def test_a_wider_padded_row_runs_with_its_own_stride():
    # under dynamic=True the row stride of a padded input is laid out outside the dynamic row length:
    # it is a symbol of its own (read from the input each call), so a wider padding reuses the graph
    kiln.reset()
    compiled = kiln.compile(reduce_rows, dynamic=True)
    for n, m, pad in [(2, 3, 1), (4, 3, 1), (3, 5, 1), (4, 4, 3)]:
        x = padded(n, m, pad)[1]
        torch.testing.assert_close(compiled(x), reduce_rows(x), msg=lambda s: f"{(n, m, pad)}: {s}")
    assert kiln.stats()["recompiles"] == 0


def test_a_padded_row_stride_outside_static_sizes_is_guarded():
    # only the row count is dynamic: the row stride (m + pad) does not depend on it and stays the
    # captured integer, which the guard checks, so kernels compiled for stride 4 never run on 5
    kiln.reset()
    compiled = kiln.compile(reduce_rows)
    for n, m, pad in [(2, 3, 1), (4, 3, 1), (5, 3, 2)]:
        x = padded(n, m, pad)[1]
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), reduce_rows(x), msg=lambda s: f"{(n, m, pad)}: {s}")
    assert kiln.stats()["recompiles"] == 1


def flatten_rows(x):
    return x.flatten(1).sum(1), x.flatten().cumsum(0)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_mark_dynamic_on_a_padded_input_is_not_specialized(backend):
    # x = base[..., 2:-1]: past the padded last dim the strides were the captured integers, and
    # flatten's contiguity test compared the row stride 25 with 5 * m, specializing the marked m
    # (ConstraintViolation; tests/fuzz seed 362). They are symbols of their own now, as torch's.
    kiln.reset()
    compiled = kiln.compile(flatten_rows, backend=backend)
    for n, m in [(4, 5), (6, 2), (5, 3), (3, 6)]:
        x = torch.randn(n, 3, m, 5)[..., 2:-1]
        kiln.mark_dynamic(x, [0, 2])
        torch.testing.assert_close(compiled(x), flatten_rows(x), msg=lambda s: f"{(n, m)}: {s}")
    assert kiln.stats()["recompiles"] == 0
    assert kiln.stats()["fallbacks"] == 0


def test_mark_dynamic_on_a_padded_input_trains():
    def loss(x, w):
        return (x.reshape(x.shape[0], -1) @ w[: x.shape[1] * x.shape[2] * 2]).square().sum()

    kiln.reset()
    compiled = kiln.compile(loss)
    w = torch.randn(60, 3)
    for n, m in [(4, 5), (6, 2), (5, 3)]:
        base = torch.randn(n, 3, m, 5, requires_grad=True)
        x = base[..., 2:-1]
        kiln.mark_dynamic(x, [0, 2])
        compiled(x, w).backward()
        expected_base = base.detach().clone().requires_grad_()
        loss(expected_base[..., 2:-1], w).backward()
        torch.testing.assert_close(base.grad, expected_base.grad, msg=lambda s: f"{(n, m)}: {s}")
    assert kiln.stats()["recompiles"] == 0
    assert kiln.stats()["fallbacks"] == 0


def add_numel(x):
    return x * 2 + x.numel()


def expanded(n, m):
    return torch.randn(1, n, m).expand(3, n, m)


def test_mark_dynamic_on_a_broadcast_input_keeps_the_dims_symbolic():
    # the row stride m of an expanded (1, n, m) input was kept as the integer (the chain of dense
    # strides stopped at the broadcast 0), and comparing it with m specialized the marked m
    kiln.reset()
    compiled = kiln.compile(add_numel)
    x = expanded(5, 4)
    kiln.mark_dynamic(x, [1, 2])
    torch.testing.assert_close(compiled(x), add_numel(x))
    for n, m in [(6, 7), (2, 3), (5, 4)]:
        x = expanded(n, m)
        torch.testing.assert_close(compiled(x), add_numel(x), msg=lambda s: f"{(n, m)}: {s}")
    assert kiln.stats()["recompiles"] == 0


@pytest.mark.parametrize("dynamic", [None, True])
def test_broadcast_input_of_new_sizes_reuses_the_dynamic_graph(dynamic):
    kiln.reset()
    compiled = kiln.compile(add_numel, dynamic=dynamic)
    for n, m in [(5, 4), (6, 7), (2, 3), (4, 6)]:
        x = expanded(n, m)
        torch.testing.assert_close(compiled(x), add_numel(x), msg=lambda s: f"{(n, m)}: {s}")
    assert kiln.stats()["recompiles"] == (1 if dynamic is None else 0)  # automatic: one, to dynamic
    y = torch.randn(3, 4, 5)[:, :, :4]  # the same sizes, but a padded row, not a broadcast: recompiles
    torch.testing.assert_close(compiled(y), add_numel(y))
