"""An ATen call of a compiled graph that raises (a linalg op on a singular matrix, an index out of
range) raises the exception type eager's binding raises for it, on either CPU wrapper: the native
one re-raised every c10 error it did not name as a plain RuntimeError, so `torch.linalg.cholesky` of
a matrix that is not positive-definite escaped a user's `except torch.linalg.LinAlgError`."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.cpp

RAISING = [
    ("cholesky_used", lambda a: torch.linalg.cholesky(a) @ a + 1),
    ("cholesky_summed", lambda a: torch.linalg.cholesky(a * 2).sum()),
    ("cholesky_ex_checked", lambda a: torch.linalg.cholesky_ex(a, check_errors=True)[0] + 1),
    ("inv_singular", lambda a: torch.linalg.inv(a * 0) + 1),
    ("solve_singular", lambda a: torch.linalg.solve(a * 0, a).relu()),
    # Kiln's gather kernels check their indices themselves: eager's IndexError, with a message naming the index
    ("index_select_out_of_range", lambda a: torch.index_select(a, 0, torch.tensor([7])) * 2),
    ("embedding_out_of_range", lambda a: F.embedding(torch.tensor([9]), a) + 1),
]
_OWN_MESSAGE = {"index_select_out_of_range", "embedding_out_of_range"}


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("wrapper", ["native", "python"])
@pytest.mark.parametrize("name,fn", RAISING, ids=[r[0] for r in RAISING])
def test_an_aten_calls_error_keeps_eagers_type(name, fn, wrapper, requires_grad):
    a = (-torch.eye(3)).requires_grad_(requires_grad)
    with pytest.raises(Exception) as eager:
        fn(a)
    kiln.reset()
    compiled = kiln.compile(fn)
    with kiln.config.patch(cpu_wrapper=wrapper), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # the first calls and the tier-up's
            with pytest.raises(type(eager.value)) as got:
                compiled(a)
            assert type(got.value) is type(eager.value)
            if name not in _OWN_MESSAGE:
                assert str(got.value).splitlines()[0] == str(eager.value).splitlines()[0]
    assert not [w for w in caught if "kiln" in str(w.message)], [str(w.message)[:200] for w in caught]
