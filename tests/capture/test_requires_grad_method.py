"""`t.requires_grad_(flag)` inside compiled code: a no-op when the flag does not change.

transformers' `enable_input_require_grads` (called by `gradient_checkpointing_enable`) hooks the
input embeddings with `output.requires_grad_(True)`; in training the output already requires grad,
so the call changes nothing and must not split the graph. A call that does change the flag still
breaks (it runs natively), with eager's result.
"""
from __future__ import annotations

import torch

import kiln


def test_unchanged_flag_stays_in_the_graph() -> None:
    emb = torch.nn.Embedding(10, 4)
    emb.register_forward_hook(lambda module, args, out: out.requires_grad_(True))

    def fn(ids):
        return emb(ids).sin().sum()

    ids = torch.tensor([[1, 2, 3]])
    kiln.reset()
    explained = kiln.explain(fn)(ids)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    out = kiln.compile(fn, backend="aot_eager")(ids)
    out.backward()
    torch.testing.assert_close(out, fn(ids))


def test_unchanged_false_and_keyword_form() -> None:
    def fn(x):
        y = (x * 2).requires_grad_(requires_grad=False)  # x does not require grad: neither does y
        return y.requires_grad_(False) + 1

    kiln.reset()
    assert kiln.explain(fn)(torch.ones(3)).graph_break_count == 0
    torch.testing.assert_close(kiln.compile(fn, backend="eager")(torch.ones(3)), fn(torch.ones(3)))


def test_changing_the_flag_still_breaks_with_eagers_result() -> None:
    def fn(x):
        y = (x * 2).requires_grad_()
        return y * 3

    kiln.reset()
    assert kiln.explain(fn)(torch.ones(3)).graph_break_count == 1
    out = kiln.compile(fn, backend="eager")(torch.ones(3))
    assert out.requires_grad and out.grad_fn is not None
