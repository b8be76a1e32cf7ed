"""The real torch.compile as a graph-count oracle, shared by the tests that compare Kiln's counts with it.

tests/ is on sys.path for every test (its conftest.py sits there), so any test imports this as
`from torch_oracle import torch_graph_count`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch


def torch_graph_count(fn: Callable[..., Any], calls: Iterable[tuple], dynamic: Optional[bool] = None,
                      between: Optional[Callable[[int], None]] = None) -> int:
    """How many graphs torch.compile(backend=<a counter>, dynamic=dynamic) compiles over these calls.

    `between(i)` runs before every call but the first (to change state between calls, as the Kiln side of
    the test does). Dynamo's caches are reset before and after, so no count leaks into another test.
    """
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    try:
        for i, args in enumerate(calls):
            if i and between is not None:
                between(i)
            compiled(*args)
    finally:
        torch._dynamo.reset()
    return int(counter.frame_count)
