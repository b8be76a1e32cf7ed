"""numpy on arrays from tensors, traced whole as torch.compile traces it: np.finfo / np.iinfo /
np.dtype and numpy scalars, the `*_like` family, np.fft, np.meshgrid and ndarray.strides.

Results are compared with eager (values and dtypes, numpy 2's rules) and the counts with
torch._dynamo.explain (tests/capture/trace_oracle.py). np.random breaks, as torch.compile gives
other numbers than numpy's generator there.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from tests.capture.trace_oracle import check_breaks, check_traced, fresh

X = torch.randn(6)
M = torch.randn(3, 4)


def dtype_info(x):
    return x * np.finfo(np.float32).eps, np.finfo(np.float64).max, np.iinfo(np.int32).max, np.iinfo(np.int8).min


def dtype_info_of_an_array(x):
    a = x.numpy()
    return torch.from_numpy(a * np.finfo(a.dtype).tiny), np.finfo(a.dtype).bits


def dtype_objects(x):
    a = x.numpy()
    return np.dtype("float32") == a.dtype, np.dtype(np.int64).itemsize, torch.from_numpy(a.astype(np.dtype("float64")))


def numpy_scalars(x):
    a = x.numpy()
    return torch.from_numpy(a * np.float32(2.5)), torch.from_numpy(a * np.float64(2.5)), torch.from_numpy(a + np.int64(3))


def like_family(x):
    a = x.numpy()
    return torch.from_numpy(np.ones_like(a) + np.zeros_like(a) + np.full_like(a, 2.0) + np.empty_like(a) * 0)


def like_with_dtype(x):
    a = x.numpy()
    return torch.from_numpy(np.ones_like(a, dtype=np.int32)), torch.from_numpy(np.zeros_like(a, dtype=np.float64)), \
        np.empty_like(a, dtype=np.int16).dtype


def fft_1d(x):
    a = x.numpy()
    return torch.from_numpy(np.fft.fft(a).real), torch.from_numpy(np.fft.rfft(a).imag), torch.from_numpy(np.abs(np.fft.ifft(a)))


def fft_options(x):
    a = x.numpy()
    return torch.from_numpy(np.fft.fft(a, n=8, norm="ortho")), torch.from_numpy(np.fft.irfft(np.fft.rfft(a), n=6))


def fft_2d(x):
    a = x.numpy()
    return torch.from_numpy(np.fft.fft2(a)), torch.from_numpy(np.fft.rfftn(a, axes=(0, 1))), \
        torch.from_numpy(np.fft.fftshift(a)), torch.from_numpy(np.fft.ifftshift(a, axes=1))


def fft_float64(x):
    a = x.numpy().astype(np.float64)
    return torch.from_numpy(np.fft.fft(a)), torch.from_numpy(np.fft.fftfreq(5)), torch.from_numpy(np.fft.rfftfreq(6, d=0.5))


def meshgrid_xy(x):
    a = x.numpy()
    u, v = np.meshgrid(a, a[:2])
    return torch.from_numpy(u + v), u.shape


def meshgrid_ij_mixed_dtypes(x):
    a = x.numpy()
    u, v = np.meshgrid(a, np.arange(3), indexing="ij")
    return torch.from_numpy(u * 2), torch.from_numpy(v), v.dtype


def meshgrid_copies(x):
    a = x.numpy()
    u, v = np.meshgrid(a, a)
    u[0, 0] = 100.0  # numpy copied: neither v nor a changes
    return torch.from_numpy(u), torch.from_numpy(v), torch.from_numpy(a)


def meshgrid_sparse(x):
    a = x.numpy()
    u, v = np.meshgrid(a, a[:3], sparse=True)
    return torch.from_numpy(u + v), u.shape, v.shape


def strides_2d(x):
    a = x.numpy()
    return a.strides, a.T.strides, x * a.strides[0]


TRACED = [(dtype_info, X), (numpy_scalars, X), (like_family, X), (fft_1d, X), (fft_options, X), (fft_2d, M),
          (meshgrid_xy, X), (meshgrid_ij_mixed_dtypes, X), (meshgrid_copies, X), (meshgrid_sparse, X)]
# torch.compile breaks on these (ndarray attributes it does not know, dtype keywords); Kiln traces them
BEYOND_TORCH = [(dtype_info_of_an_array, X), (dtype_objects, X), (like_with_dtype, X), (fft_float64, X),
                (strides_2d, M)]


@pytest.mark.parametrize("fn,x", TRACED, ids=[c[0].__name__ for c in TRACED])
def test_traced_whole_like_torch_compile(fn, x) -> None:
    if fn is like_family:  # np.empty_like holds whatever memory held: only its shape and dtype compare
        check_traced(lambda t: like_family(t).shape, fresh(x))
        return
    check_traced(fn, fresh(x))


@pytest.mark.parametrize("fn,x", BEYOND_TORCH, ids=[c[0].__name__ for c in BEYOND_TORCH])
def test_traced_whole_where_torch_compile_breaks(fn, x) -> None:
    check_traced(fn, fresh(x), oracle=False)


def test_strides_of_a_one_dimensional_array() -> None:
    def f(x):
        a = x.numpy()
        return a.strides, a.itemsize, a.nbytes, x * a.strides[0]

    check_traced(f, fresh(X), oracle=False)


def test_strides_numpy_would_lay_out_itself_break() -> None:
    def f(x):
        a = x.numpy()
        return (a + 1).strides

    with pytest.raises(kiln.errors.GraphBreakError, match="strides"):
        kiln.compile(f, backend="eager", fullgraph=True)(M)
    assert kiln.compile(f, backend="eager")(M) == f(M)


def test_numpy_random_breaks_and_gives_numpys_numbers() -> None:
    def f(x):
        a = x.numpy()
        np.random.seed(0)
        return torch.from_numpy(a + np.random.rand(6))

    check_breaks(f, fresh(X), "random")
