"""index_select out of range raises what eager's CPU kernel raises: RuntimeError along dim 1 of a
tensor of two or more dims, or when the tensor is empty; IndexError otherwise. An empty tensor gives
an empty result, whose kernel would load (and check) nothing: eager still checks the indices."""
from __future__ import annotations

import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import compile_graph

pytestmark = pytest.mark.cpp


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((2, 5), 0), ((2, 5), 1), ((3, 4, 5), 1), ((3, 4, 5), 2),
                                       ((2, 3, 4, 5), 3), ((0,), 0), ((3, 0), 0), ((2, 0, 3), 2)])
def test_index_select_out_of_range_raises_eagers_exception_class(shape: tuple[int, ...], dim: int) -> None:
    x = torch.randn(shape)
    bad = torch.tensor([0, x.shape[dim] + 2])

    def fn(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x.index_select(dim, index) * 2

    with pytest.raises((IndexError, RuntimeError)) as eager:
        fn(x, bad)
    # traced on fake tensors: a real trace would run (and fail on) the bad index
    compiled = compile_graph(make_fx(fn, tracing_mode="fake")(x, bad), [x, bad])
    with pytest.raises(type(eager.value)):
        compiled(x, bad)
    if x.shape[dim]:  # (a compiled graph takes the shapes it was traced with: an index of 2)
        good = torch.tensor([0, x.shape[dim] - 1])
        torch.testing.assert_close(compiled(x, good)[0], fn(x, good))


# CI: each shape, each bad index and each (alpha, index dtype) once, the others at base (-m slow: all)
@pytest.mark.ci_slice({"shape,dim": ((3, 4, 2), 1), "index": -1, "alpha,index_dtype": (1, torch.int64)})
@pytest.mark.parametrize("shape,dim", [((5,), 0), ((3, 4), 0), ((3, 4), 1), ((3, 4, 2), 0), ((3, 4, 2), 1),
                                       ((3, 4, 2), 2), ((2, 3, 4, 5), 2)])
@pytest.mark.parametrize("index", [-1, "size"])
@pytest.mark.parametrize("alpha,index_dtype", [(1, torch.int64), (2.0, torch.int64), (1, torch.int32)])
def test_index_add_out_of_range_raises_eagers_exception_class(shape: tuple[int, ...], dim: int, index,
                                                              alpha, index_dtype) -> None:
    """Eager's CPU index_add runs as a scatter_add along the first or last dim of a tensor of 2+
    dims when alpha is 1 and the index is int64 (RuntimeError), and as its own loop otherwise
    (IndexError); negative indices are refused."""
    x = torch.randn(shape)
    bad = torch.tensor([-1 if index == -1 else shape[dim]], dtype=index_dtype)

    def fn(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_add(x, dim, index, x.narrow(dim, 0, 1) * 2, alpha=alpha)

    with pytest.raises((IndexError, RuntimeError)) as eager:
        fn(x, bad)
    compiled = compile_graph(make_fx(fn, tracing_mode="fake")(x, bad), [x, bad])
    with pytest.raises(type(eager.value)):
        compiled(x, bad)
    good = torch.tensor([shape[dim] - 1], dtype=index_dtype)
    torch.testing.assert_close(compiled(x, good)[0], fn(x, good))
