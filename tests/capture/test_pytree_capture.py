"""`torch.utils._pytree` inside compiled code: flatten, unflatten, map and friends stay in one graph.

Each case runs with fullgraph=True under the "eager" and "aot_eager" backends and must give eager's
result; torch._dynamo.explain's graph count is the oracle. Trees cover tuples, lists, dicts (insertion
order), OrderedDict, namedtuples, torch.Size, torch.return_types, dataclasses (register_dataclass),
a class registered with register_pytree_node, transformers' ModelOutput, None leaves and is_leaf.
"""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree

import kiln

Point = collections.namedtuple("Point", "x y")


class Pair:
    def __init__(self, a, b) -> None:
        self.a, self.b = a, b


pytree.register_pytree_node(Pair, lambda p: ([p.a, p.b], "pair"), lambda values, ctx: Pair(*values))


@dataclasses.dataclass
class Fields:
    u: torch.Tensor
    v: torch.Tensor | None = None


pytree.register_dataclass(Fields)
OUTER_SPEC = pytree.tree_structure((0, {"a": 0}))


def _flatten_tuple(x):
    leaves, spec = pytree.tree_flatten((x, x + 1))
    return leaves[1] * 2 + spec.num_leaves


def _flatten_dict_in_insertion_order(x):
    leaves, spec = pytree.tree_flatten({"b": x, "a": [x * 2, (x, 3)], "c": None})
    doubled = [leaf * 2 if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return pytree.tree_unflatten(doubled, spec)["a"][1][0] + leaves[0]


def _tree_map_nested(x):
    out = pytree.tree_map(lambda t: t.sin(), {"a": x, "b": (x, [x * 2])})
    return out["b"][1][0] - out["a"]


def _tree_map_with_rests_prefix(x):
    return pytree.tree_map(lambda a, b: a * len(b), [x, x + 1], [[x, x], (x,)])[0]


def _tree_map_two_trees(x):
    return pytree.tree_map(lambda a, b: a * b, [x, (x, x)], [2.0, (x, 3.0)])[1][1]


def _namedtuple(x):
    return pytree.tree_map(lambda t: t + 1, Point(x, x * 2)).y


def _registered_class(x):
    return pytree.tree_map(lambda t: t * 3, Pair(x, x.cos())).b


def _dataclass_with_none_field(x):
    return pytree.tree_map(lambda t: t.exp(), Fields(x)).u


def _dataclass(x):
    return pytree.tree_map(lambda t: t.exp(), Fields(x, x * 2)).v


def _ordered_dict_and_spec_unflatten(x):
    leaves, spec = pytree.tree_flatten(collections.OrderedDict(b=x, a=x + 1))
    return spec.unflatten([t * 3 for t in leaves])["a"]


def _return_types(x):
    return pytree.tree_map(lambda t: t.float() * 2, torch.max(x.reshape(2, -1), dim=0)).indices


def _torch_size(x):
    return x * pytree.tree_leaves(x.shape)[0]


def _map_only_and_is_leaf(x):
    mapped = pytree.tree_map_only(torch.Tensor, lambda t: t * 2, {"k": (x, 1.5, "s")})
    leaves = pytree.tree_leaves([x, [x, [x]]], is_leaf=lambda n: isinstance(n, list) and len(n) == 1)
    return mapped["k"][0] * mapped["k"][1] + len(leaves)


def _map_only_tuple_of_types(x):
    return pytree.tree_map_only((int, float), lambda n: n * 10, [x, 2, 0.5])[1] * x


def _all_any(x):
    nested = [x, (x, None)]
    return x * pytree.tree_all(lambda t: t is None or t.dim() == 1, nested) + pytree.tree_any(lambda t: t is None, nested)


def _map_in_place(x):
    seen = []
    pytree.tree_map_(lambda t: seen.append(t * 2), [x, x + 1])
    return seen[1]


def _structure_queries(x):
    spec = pytree.tree_structure([x, (x, x)])
    same = spec == pytree.tree_structure([x * 2, (x, x)])
    return x * spec.num_leaves + spec.num_nodes + same


def _outer_spec(x):
    return pytree.tree_unflatten([x, x * 2], OUTER_SPEC)[1]["a"]


def _leaves_with_path(x):
    pairs = pytree.tree_leaves_with_path({"a": [x, x * 2]})
    return pairs[1][1] + len(pairs[0][0])


def _arg_tree_leaves(x):
    return sum(pytree.arg_tree_leaves(x, [x * 2], k=(x,)))


def _model_output(x):
    from transformers.modeling_outputs import BaseModelOutput

    out = pytree.tree_map(lambda t: t.sin(), BaseModelOutput(last_hidden_state=x, hidden_states=(x, x + 1)))
    return out.hidden_states[1] * isinstance(out, BaseModelOutput)


CASES = {f.__name__.strip("_"): f for f in (
    _flatten_tuple, _flatten_dict_in_insertion_order, _tree_map_nested, _tree_map_with_rests_prefix,
    _tree_map_two_trees, _namedtuple, _registered_class, _dataclass_with_none_field, _dataclass,
    _ordered_dict_and_spec_unflatten, _return_types, _torch_size, _map_only_and_is_leaf,
    _map_only_tuple_of_types, _all_any, _map_in_place, _structure_queries, _outer_spec,
    _leaves_with_path, _arg_tree_leaves, _model_output)}


def _needs(name: str) -> None:
    if name == "model_output":
        pytest.importorskip("transformers")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_in_one_graph(name: str, backend: str) -> None:
    _needs(name)
    fn = CASES[name]
    x = torch.randn(4)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, backend=backend, fullgraph=True)(x), fn(x))
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_counts_match_dynamo(name: str) -> None:
    import torch._dynamo

    _needs(name)
    fn = CASES[name]
    x = torch.randn(4)
    torch._dynamo.reset()
    oracle = torch._dynamo.explain(fn)(x)
    kiln.reset()
    ours = kiln.explain(fn)(x)
    assert (ours.graph_count, ours.graph_break_count) == (oracle.graph_count, oracle.graph_break_count) == (1, 0)


def test_gradients_through_tree_map() -> None:
    def fn(x, w):
        out = pytree.tree_map(lambda a, b: a * b, {"p": x, "q": [x.sin()]}, {"p": w, "q": [w]})
        return out["p"].sum() + out["q"][0].sum()

    x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    fn(x, w).backward()
    want = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    kiln.reset()
    kiln.compile(fn, backend="aot_eager", fullgraph=True)(x, w).backward()
    torch.testing.assert_close((x.grad, w.grad), want)


def test_tree_from_the_caller_is_guarded_by_structure() -> None:
    def fn(tree):
        leaves, spec = pytree.tree_flatten(tree)
        return pytree.tree_unflatten([t * 2 for t in leaves], spec)

    x = torch.randn(3)
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for tree in ([x, {"a": x}], [x, {"a": x}, x], [x, {"b": x}], (x, {"a": x})):
        got, want = compiled(tree), fn(tree)
        assert pytree.tree_structure(got) == pytree.tree_structure(want)
        torch.testing.assert_close(pytree.tree_leaves(got), pytree.tree_leaves(want))
    assert kiln.stats()["recompiles"] == 3


def test_returned_spec_is_the_real_one() -> None:
    fn = lambda x: pytree.tree_flatten([x, (x, {"k": x})])  # noqa: E731
    x = torch.randn(2)
    kiln.reset()
    leaves, spec = kiln.compile(fn, backend="eager")(x)
    assert spec == fn(x)[1] and len(leaves) == 3


def test_structure_mismatch_raises_as_eager() -> None:
    def fn(x):
        return pytree.tree_map(lambda a, b: a + b, [x, x], [x])

    kiln.reset()
    with pytest.raises(ValueError):
        kiln.compile(fn, backend="eager")(torch.randn(2))
