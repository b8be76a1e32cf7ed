"""Corpus: dict, its views, OrderedDict, defaultdict, dict subclasses and user mappings.

Dict views are live (a view taken before the dict changes sees the change), dicts passed in are
mutated for the caller, keys may be tensors (by identity), ints, strings, tuples and torch.Size,
and `**` unpacks any Mapping. Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import collections
from collections.abc import Mapping, MutableMapping

import torch

from .program import Program, case, fn_program, t


class Registry(dict):
    """A dict subclass with an extra method and an overridden __getitem__ default."""

    def total(self):
        return sum(self.values())


class Defaulting(dict):
    def __missing__(self, key):
        return len(key)


class Settings(Mapping):
    """A read-only user mapping over a private dict."""

    def __init__(self, **values):
        self._values = dict(values)

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)


class Store(MutableMapping):
    def __init__(self):
        self._data = {}

    def __getitem__(self, key):
        return self._data[key]

    def __setitem__(self, key, value):
        self._data[key] = value

    def __delitem__(self, key):
        del self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


@case("dicts")
def dict_get_pop_setdefault_update():
    def f(x):
        d = {"a": x + 1, "b": x + 2}
        missing = d.get("zz", 5)
        popped = d.pop("b")
        d.setdefault("c", x * 3)
        d.setdefault("a", x * 100)
        d.update({"d": 4}, e=5)
        return popped + d["a"] + d["c"] + missing + d["d"] + d["e"], sorted(d)
    return fn_program(f, (t(3),))


@case("dicts")
def dict_keys_view_is_live():
    def f(x):
        d = {1: x}
        keys = d.keys()
        d[2] = x + 1
        return 2 in keys, len(keys), list(keys)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_values_view_is_live():
    def f(x):
        d = {"a": x}
        values = d.values()
        d["a"] = x * 2
        d["b"] = x * 3
        return len(values), sum(values)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_items_view_is_live_after_delete():
    def f(x):
        d = {"a": x, "b": x + 1, "c": x + 2}
        items = d.items()
        del d["b"]
        d.pop("c")
        return len(items), [k for k, _ in items]
    return fn_program(f, (t(2),))


@case("dicts")
def dict_view_set_operations():
    def f(x):
        left = {"a": 1, "b": 2, "c": 3}
        right = {"b": 0, "c": 0, "d": 0}
        common = left.keys() & right.keys()
        either = left.keys() | {"z"}
        only = left.keys() - right.keys()
        return x + len(common), sorted(either), sorted(only)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_keys_equal_and_contains():
    def f(x):
        d = {3: x, 4: x + 1}
        other = {4: "u", 3: "v"}
        return d.keys() == other.keys(), 3 in d.keys(), 5 in d, d.keys() == {3, 4}
    return fn_program(f, (t(2),))


@case("dicts")
def dict_iteration_order_and_reversed():
    def f(x):
        d = {"z": 1, "a": 2, "m": 3}
        d["b"] = 4
        out = x
        for k in reversed(d):
            out = out * 2 + d[k]
        return out, list(d), list(reversed(d.values()))
    return fn_program(f, (t(2),))


@case("dicts")
def dict_input_mutated_for_caller():
    def f(d, x):
        d["sum"] = d["a"] + x
        d.pop("drop")
        return len(d)
    return fn_program(f, ({"a": t(2), "drop": 1}, t(2)))


@case("dicts")
def dict_input_keys_read_in_order():
    def f(d):
        return [k for k in d], sum(d.values())
    return fn_program(f, ({"q": t(2), "b": t(2), "x": t(2)},))


@case("dicts")
def dict_copy_independent_of_original():
    def f(x):
        d = {"a": x}
        e = d.copy()
        f2 = dict(d)
        e["b"] = x + 1
        f2["a"] = x * 3
        return len(d), d["a"], f2["a"], len(e)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_from_pairs_and_kwargs():
    def f(x):
        a = dict([("p", x), ("q", x + 1)])
        b = dict(a, r=x * 2)
        c = dict(zip(["u", "v"], [1, 2]))
        return b["r"] + b["p"] + c["v"], sorted(b)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_fromkeys_constants():
    def f(x):
        d = dict.fromkeys(["a", "b", "c"], 0)
        d["b"] += 2
        e = dict.fromkeys("xy")
        return x + d["b"], d, e
    return fn_program(f, (t(2),))


@case("dicts")
def dict_merge_operators():
    def f(x):
        a = {"a": x, "b": 1}
        b = {"b": 2, "c": 3}
        merged = a | b
        a |= {"d": 4}
        return merged["b"] + merged["a"], sorted(merged), sorted(a)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_popitem_and_clear():
    def f(x):
        d = {"a": x, "b": x + 1}
        key, value = d.popitem()
        d.clear()
        return key, value, len(d)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_keyed_by_tensor_identity():
    def f(x, y):
        weights = {x: 2.0, y: 3.0}
        return x * weights[x] + y * weights[y], len(weights)
    return fn_program(f, (t(2), t(2)))


@case("dicts")
def dict_keyed_by_parameter():
    p = torch.nn.Parameter(torch.ones(2))

    def f(x):
        table = {p: x, "k": 1}
        return table[p] * 2 + table["k"]
    return fn_program(f, (t(2),))


@case("dicts")
def dict_keyed_by_size_caches_per_shape():
    def f(x, cache):
        if x.shape not in cache:
            cache[x.shape] = x * 2
        return x + cache[x.shape]
    cache = {}
    return Program(f, ((t(2, 3), cache), (t(2, 3), cache)), observe=lambda: len(cache))


@case("dicts")
def dict_keyed_by_int_and_tuple():
    def f(x):
        d = {0: x, (1, 2): x + 1, 3.5: x + 2}
        return d[0] + d[(1, 2)] + d[3.5]
    return fn_program(f, (t(2),))


@case("dicts")
def dict_key_missing_raises_keyerror():
    def f(x):
        d = {"a": x}
        try:
            return d["b"]
        except KeyError:
            return x - 1
    return fn_program(f, (t(2),))


@case("dicts")
def dict_in_and_not_in():
    def f(x, d):
        out = x
        if "scale" in d:
            out = out * d["scale"]
        if "shift" not in d:
            out = out - 1
        return out
    return fn_program(f, (t(2), {"scale": 3}))


@case("dicts")
def dict_nested_update():
    def f(x):
        config = {"model": {"width": 2}, "lr": 0.1}
        config["model"]["depth"] = 3
        config["model"].update(width=4)
        return x * config["model"]["width"] + config["model"]["depth"], config
    return fn_program(f, (t(2),))


@case("dicts")
def ordered_dict_move_to_end_and_popitem():
    def f(x):
        d = collections.OrderedDict(a=x, b=x + 1, c=x + 2)
        d.move_to_end("a")
        d.move_to_end("c", last=False)
        last = d.popitem()
        first = d.popitem(last=False)
        return list(d), last[0], first[0]
    return fn_program(f, (t(2),))


@case("dicts")
def ordered_dict_equality_is_order_sensitive():
    def f(x):
        a = collections.OrderedDict([("a", 1), ("b", 2)])
        b = collections.OrderedDict([("b", 2), ("a", 1)])
        out = x
        if a != b:
            out = out + 1
        if dict(a) == dict(b):
            out = out * 3
        return out
    return fn_program(f, (t(2),))


@case("dicts")
def ordered_dict_returned_with_tensors():
    def f(x):
        out = collections.OrderedDict()
        out["logits"] = x * 2
        out["loss"] = x.sum()
        return out
    return fn_program(f, (t(3),))


@case("dicts")
def defaultdict_list_factory():
    def f(x):
        groups = collections.defaultdict(list)
        for k in range(4):
            groups[k % 2].append(x * k)
        return len(groups), sum(groups[1]), len(groups[0])
    return fn_program(f, (t(2),))


@case("dicts")
def defaultdict_int_counts():
    def f(x):
        counts = collections.defaultdict(int)
        for word in ["a", "b", "a", "c", "a"]:
            counts[word] += 1
        return x * counts["a"], counts["zzz"], dict(counts)
    return fn_program(f, (t(2),))


@case("dicts")
def defaultdict_lambda_factory():
    def f(x):
        d = collections.defaultdict(lambda: x * 0 + 7)
        d["seen"] = x
        return d["seen"] + d["unseen"], len(d)
    return fn_program(f, (t(2),))


@case("dicts")
def defaultdict_input_factory_called():
    def f(d, x):
        d["new"].append(x)
        return len(d["new"]), len(d)
    return fn_program(f, (collections.defaultdict(list), t(2)))


@case("dicts")
def defaultdict_fromkeys_and_default_factory():
    def f(x):
        d = collections.defaultdict.fromkeys(["a", "b"], 1)
        d["a"] = 5
        return x * d["a"], d.default_factory is None, d.get("b")
    return fn_program(f, (t(2),))


@case("dicts")
def dict_subclass_method_and_items():
    def f(x):
        r = Registry(a=x, b=x + 1)
        r["c"] = x * 2
        return r.total(), sorted(r.keys()), isinstance(r, dict)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_subclass_missing_hook():
    def f(x):
        d = Defaulting(one=1)
        return x + d["one"] + d["three"]
    return fn_program(f, (t(2),))


@case("dicts")
def dict_subclass_input():
    def f(r, x):
        return r.total() + x, len(r)
    return fn_program(f, (Registry(a=1, b=2), t(2)))


@case("dicts")
def user_mapping_double_star_unpacked():
    settings = Settings(scale=2.0, shift=1.0)

    def g(x, scale=1.0, shift=0.0):
        return x * scale + shift

    def f(x):
        return g(x, **settings)
    return fn_program(f, (t(2),))


@case("dicts")
def user_mapping_keys_items_get():
    settings = Settings(a=1, b=2)

    def f(x):
        total = x
        for key, value in settings.items():
            total = total + value
        return total, list(settings.keys()), settings.get("zz", 9), "a" in settings
    return fn_program(f, (t(2),))


@case("dicts")
def user_mutable_mapping_converted_to_dict():
    store = Store()
    store["w"] = torch.ones(2) * 3

    def f(x):
        plain = dict(store)
        return x * plain["w"], len(store)
    return fn_program(f, (t(2),))


@case("dicts")
def user_mutable_mapping_written_in_frame():
    def f(x, store):
        store["out"] = x + 1
        store.setdefault("k", 3)
        return len(store), store["k"]
    store = Store()
    return Program(f, ((t(2), store),), observe=lambda: dict(store._data))


@case("dicts")
def dict_double_star_merge_in_call():
    def g(**kwargs):
        return sorted(kwargs), kwargs["a"] * kwargs.get("b", 1)

    def f(x):
        base = {"a": x}
        return g(**base, b=2), g(**{**base, "c": 0})
    return fn_program(f, (t(2),))


@case("dicts")
def dict_display_with_double_star():
    def f(x):
        base = {"a": 1, "b": x}
        extended = {**base, "b": x * 2, "c": 3}
        return extended["b"], list(extended)
    return fn_program(f, (t(2),))


@case("dicts")
def dict_of_lists_accumulates():
    def f(x):
        history = {"loss": [], "step": []}
        for step in range(3):
            history["loss"].append(x.sum() * step)
            history["step"].append(step)
        return torch.stack(history["loss"]), history["step"]
    return fn_program(f, (t(2),))


@case("dicts")
def dict_get_with_tensor_default():
    def f(x, d):
        return d.get("bias", x * 0) + d.get("weight", x)
    return fn_program(f, (t(2), {"weight": t(2)}))


@case("dicts")
def dict_items_sorted_by_key():
    def f(x):
        d = {"c": 3, "a": 1, "b": 2}
        out = x
        for _, v in sorted(d.items()):
            out = out * 10 + v
        return out
    return fn_program(f, (t(2),))


@case("dicts")
def dict_len_of_closed_over_dict_changes_between_calls():
    table = {"a": 1}

    def f(x):
        return x + len(table)

    def grow(_, i):
        table[f"k{i}"] = i
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=grow)


@case("dicts")
def dict_key_built_with_format_string():
    def f(x, d):
        total = x
        for i in range(2):
            total = total + d[f"layer{{{i}}}"]
        return total
    return fn_program(f, (t(2), {"layer{0}": 1.0, "layer{1}": 2.0}))


@case("dicts", counts=True)
def dict_value_unread_changes_no_recompile():
    config = {"used": 2, "unused": 0}

    def f(x):
        return x * config["used"]

    def touch(_, i):
        config["unused"] = i
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=touch)


@case("dicts", counts=True)
def dict_value_read_changes_recompile():
    config = {"scale": 2}

    def f(x):
        return x * config["scale"]

    def bump(_, i):
        config["scale"] = 2 + i
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=bump)


@case("dicts")
def dict_views_follow_later_mutation():
    def f(x):
        d = {"a": 1, "b": 2}
        ks = d.keys()
        vs = d.values()
        its = d.items()
        d["c"] = 3
        del d["a"]
        return x * len(ks) + sum(vs), list(ks), list(its), "c" in ks, ("b", 2) in its
    return fn_program(f, (t(3),))


@case("dicts")
def ordereddict_move_to_end_and_popitem_first():
    def f(x):
        d = collections.OrderedDict(a=1, b=2, c=3)
        d.move_to_end("a")
        d.move_to_end("c", last=False)
        k, v = d.popitem(last=False)
        return x * v, list(d.items()), k
    return fn_program(f, (t(3),))


@case("dicts")
def defaultdict_input_missing_key_inserted():
    def f(x, d):
        d["q"].append(x)
        return len(d), x + len(d["q"])
    return fn_program(f, (t(3), collections.defaultdict(list, {"p": [1]})))


@case("dicts")
def counter_arithmetic_operators():
    # Counter's +, -, &, | and += are its Python methods, traced (they were a graph break)
    import collections

    def f(x, extra):
        c = collections.Counter("aabbbc")
        d = collections.Counter(a=5, c=-1)
        total = c + d
        c += extra
        return (x * total["a"] + (c - d)["b"], dict(c & d), sorted((c | d).items()), dict(total),
                dict(-d), dict(+d))
    return fn_program(f, (t(3), collections.Counter(b=2)))


@case("dicts")
def tuples_holding_tensors_as_dict_keys_and_set_items():
    # a tuple with tensors in it hashes by its items (the tensors by identity): lookups with a
    # tuple built again, `in`, iteration, and the dict itself returned (they were a graph break)
    def f(a, b):
        d = {(a, b): 1, (b, "s"): 2, ("k", 3): 3}
        d[(a, b)] += 10
        s = {(a, 1), (a, 1), (b, 1)}
        total = sum(d[k] * k[0] for k in d if isinstance(k[0], torch.Tensor))
        return total, (b, "s") in d, (a, "s") in d, len(s), d.get((b, a), -1), d
    return fn_program(f, (t(2), t(2)))


@case("dicts")
def dict_from_outside_keyed_by_dtypes_and_devices():
    # `table[x.dtype]` on a global-style dict keyed by torch.dtype / torch.device: the value read
    # is guarded by an expression naming the key (there was none for a dtype: an internal error)
    table = {torch.float32: 2.0, torch.float64: 3.0, torch.int64: 4.0}
    places = {torch.device("cpu"): "host"}

    def f(x):
        return x * table[x.dtype], torch.float32 in table, places[x.device], x.dtype in (torch.float16, torch.bfloat16)
    return fn_program(f, (t(3),), (t(3, dtype=torch.float64),))


@case("dicts", counts=True)
def size_tuple_as_dict_key_across_shapes():
    # the second shape makes the sizes symbolic: hashing them decides (guards) their values
    table = {(2, 3): 1.5, (3, 2): -1.0, (4, 2): 2.0}

    def f(x):
        seen = {d for d in x.shape}
        counts = {x.shape[0]: "rows", x.shape[1]: "cols"}
        return x * table[tuple(x.shape)], sorted(seen), counts

    return Program(f, ((t(2, 3),), (t(3, 2),), (t(4, 2),), (t(2, 3),)))


@case("dicts")
def missing_keys_raise_key_error_in_the_frame():
    # del of a missing key, pop without a default, popitem of an empty dict: eager's KeyError,
    # caught by the frame's own handler
    def f(x, d):
        caught = []
        try:
            del d["nope"]
        except KeyError:
            caught.append("del")
        try:
            d.pop("gone")
        except KeyError:
            caught.append("pop")
        empty = {"a": x}
        empty.popitem()
        try:
            empty.popitem()
        except KeyError:
            caught.append("popitem")
        return x + len(caught), caught, d
    return fn_program(f, (t(2), {"a": 1}))


@case("dicts")
def id_of_values_made_in_the_frame_as_keys():
    # a memo keyed by id() of an intermediate tensor and of objects made in the frame: equal ids are
    # the same object (an input's id stays a break: a dict from outside may hold its real number)
    class Node:
        pass

    def f(x):
        memo = {}

        def once(v):
            if id(v) not in memo:
                memo[id(v)] = v * 2
            return memo[id(v)]
        y = x + 1
        a, b = Node(), Node()
        rank = {id(a): 1, id(b): 2}
        return once(y) + once(y) + rank[id(b)], len(memo), len({id(a), id(a), id(b)})
    return fn_program(f, (t(3),))
