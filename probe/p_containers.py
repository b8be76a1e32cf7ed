import collections, dataclasses, typing
from collections import OrderedDict, defaultdict, namedtuple, Counter, deque
import torch
from harness import case, fn_program, t, Program, kw

Pt = namedtuple("Pt", ["a", "b"])

class NT(typing.NamedTuple):
    x: torch.Tensor
    scale: float = 2.0

@dataclasses.dataclass
class DC:
    w: torch.Tensor
    n: int = 3
    tags: list = dataclasses.field(default_factory=list)

@case("containers")
def c_dict_update_and_iterate_items():
    def f(x):
        d = {"a": x, "b": x * 2}
        d.update(c=x + 1, a=x - 1)
        out = 0
        for k, v in d.items():
            out = out + v * len(k)
        return out, list(d)
    return fn_program(f, (t(4),))

@case("containers")
def c_dict_setdefault_and_pop_default():
    def f(x, d):
        d.setdefault("s", []).append(x.sum())
        y = d.pop("missing", x)
        d["n"] = d.get("n", 0) + 1
        return y * 2
    d = {}
    return fn_program(f, (t(3), d), (t(3), d), observe=lambda: d)

@case("containers")
def c_list_mutation_of_input():
    def f(xs):
        xs.append(xs[0] + xs[-1])
        xs.insert(0, xs.pop())
        xs.reverse()
        del xs[1]
        return torch.stack(xs)
    return fn_program(f, ([t(2), t(2), t(2)],))

@case("containers")
def c_list_slice_assign_and_extend():
    def f(x):
        l = [x, x + 1, x + 2, x + 3]
        l[1:3] = [x * 10]
        l.extend(v * 2 for v in l[:2])
        l += [x.neg()]
        return sum(l), len(l)
    return fn_program(f, (t(3),))

@case("containers")
def c_tuple_unpack_star():
    def f(x):
        a, *rest, z = (x, x + 1, x + 2, x + 3)
        return a + z + sum(rest), len(rest)
    return fn_program(f, (t(2),))

@case("containers")
def c_namedtuple_replace_and_fields():
    def f(x):
        p = Pt(x, x * 2)
        q = p._replace(b=x + 5)
        d = q._asdict()
        return q.a + q.b, tuple(d.keys()), Pt._fields, p[1] * 3
    return fn_program(f, (t(3),))

@case("containers")
def c_typing_namedtuple_default():
    def f(x):
        n = NT(x)
        m = NT(x, scale=0.5)
        return n.x * n.scale + m.x * m.scale, isinstance(n, tuple)
    return fn_program(f, (t(3),))

@case("containers")
def c_namedtuple_input_returned_modified():
    def f(p):
        return Pt(p.a.sin(), p.b + p.a)
    return fn_program(f, (Pt(t(2), t(2)),))

@case("containers")
def c_dataclass_made_and_mutated():
    def f(x):
        d = DC(x)
        d.n += 2
        d.tags.append("t")
        return d.w * d.n, len(d.tags), dataclasses.fields(d)[1].name
    return fn_program(f, (t(3),))

@case("containers")
def c_dataclass_input_mutated():
    def f(d):
        d.w = d.w * 2
        d.tags.append(d.n)
        d.n = d.n + 1
        return d.w.sum()
    d = DC(torch.ones(3), 1, [])
    return fn_program(f, (d,), (d,), observe=lambda: (d.w, d.n, list(d.tags)))

@case("containers")
def c_dataclass_asdict_replace():
    def f(x):
        d = DC(x, 4)
        e = dataclasses.replace(d, n=7)
        return e.w * e.n + d.n, e.n
    return fn_program(f, (t(2),))

@case("containers")
def c_ordereddict_move_to_end():
    def f(x):
        od = OrderedDict()
        od["a"] = x
        od["b"] = x + 1
        od["c"] = x + 2
        od.move_to_end("a")
        k, v = od.popitem(last=False)
        return list(od.keys()), k, v * 3, od["a"]
    return fn_program(f, (t(2),))

@case("containers")
def c_defaultdict_list_grouping():
    def f(x):
        g = defaultdict(list)
        for i, name in enumerate(["p", "q", "p", "r", "q"]):
            g[name].append(x * i)
        return {k: torch.stack(v).sum(0) for k, v in g.items()}
    return fn_program(f, (t(3),))

@case("containers")
def c_defaultdict_int_counter():
    def f(x):
        g = defaultdict(int)
        for c in "abracadabra":
            g[c] += 1
        return x * g["a"] + g["z"], sorted(g.items())
    return fn_program(f, (t(2),))

@case("containers")
def c_counter_most_common():
    def f(x):
        c = Counter([1, 2, 2, 3, 3, 3])
        top = c.most_common(1)[0]
        return x * top[0] + top[1]
    return fn_program(f, (t(2),))

@case("containers")
def c_set_operations():
    def f(x):
        s = {1, 2, 3}
        s.add(4)
        s.discard(1)
        u = s | {9}
        i = s & {2, 4, 8}
        return x * len(u) + sum(i), 4 in s, sorted(s - {2})
    return fn_program(f, (t(2),))

@case("containers")
def c_frozenset_membership_branch():
    KEYS = frozenset({"relu", "gelu"})
    def f(x, kind):
        if kind in KEYS:
            return x.relu()
        return x.tanh()
    return fn_program(f, (t(3), "relu"), (t(3), "tanh"), (t(3), "gelu"))

@case("containers")
def c_deque_rotate_append():
    def f(x):
        d = deque([x, x + 1, x + 2], maxlen=3)
        d.append(x * 5)
        d.rotate(1)
        d.appendleft(x - 1)
        return list(d)[0] + d[-1], len(d)
    return fn_program(f, (t(2),))

@case("containers")
def c_nested_dict_of_lists_input_mutated():
    def f(state, x):
        state["hist"].append(x.mean())
        state["cfg"]["steps"] += 1
        return x * state["cfg"]["lr"]
    st = {"hist": [], "cfg": {"steps": 0, "lr": 0.1}}
    return fn_program(f, (st, t(3)), (st, t(3)), observe=lambda: st)

@case("containers")
def c_dict_comprehension_with_filter():
    def f(x):
        d = {f"k{i}": x * i for i in range(5) if i % 2}
        return sum(d.values()), sorted(d)
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_keys_set_ops():
    def f(x):
        a = {"x": 1, "y": 2, "z": 3}
        b = {"y": 0, "w": 0}
        return x + len(a.keys() & b.keys()), sorted(a.keys() - b.keys())
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_del_and_contains():
    def f(d, x):
        if "drop" in d:
            del d["drop"]
        return x + len(d)
    d = {"drop": 1, "keep": 2}
    return fn_program(f, (d, t(2)), (d, t(2)), observe=lambda: dict(d))

@case("containers")
def c_list_sort_with_key_lambda():
    def f(x):
        items = [(3, x), (1, x * 2), (2, x * 3)]
        items.sort(key=lambda p: p[0])
        return [p[1] for p in items][0], [p[0] for p in items]
    return fn_program(f, (t(2),))

@case("containers")
def c_list_index_count():
    def f(x):
        l = [5, 3, 5, 7]
        return x * l.index(7) + l.count(5)
    return fn_program(f, (t(2),))

@case("containers")
def c_list_of_tensors_input_len_changes():
    def f(xs):
        return sum(xs) / len(xs)
    return fn_program(f, ([t(2), t(2)],), ([t(2), t(2), t(2)],), ([t(2)],))

@case("containers")
def c_tuple_compare_and_hash():
    def f(x):
        a = (1, 2, 3)
        b = (1, 2, 4)
        return x + (a < b) + (hash(a) == hash((1, 2, 3)))
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_ordering_after_reinsert():
    def f(x):
        d = {"a": 1, "b": 2, "c": 3}
        del d["a"]
        d["a"] = 4
        return list(d.items()), x * d["a"]
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_pop_then_break_then_read():
    def f(x):
        d = {"a": x, "b": x + 1}
        y = d.pop("a")
        torch._dynamo.graph_break()
        return y + d["b"], list(d)
    return fn_program(f, (t(2),))

@case("containers")
def c_list_mutated_across_break():
    def f(x, acc):
        acc.append(x + 1)
        print("mid")
        acc.append(x + 2)
        return acc[-1] * 2
    acc = []
    return fn_program(f, (t(2), acc), observe=lambda: acc)

@case("containers")
def c_dict_with_tensor_values_returned_and_aliased():
    def f(x):
        d = {"a": x}
        d["b"] = d["a"]
        d["a"] = d["a"] + 1
        return d, d["b"] is x
    return fn_program(f, (t(2),))

@case("containers")
def c_list_comprehension_nested():
    def f(x):
        m = [[x * i * j for j in range(3)] for i in range(2)]
        return torch.stack([torch.stack(r) for r in m]).sum()
    return fn_program(f, (t(2),))

@case("containers")
def c_zip_dict_construct():
    def f(x):
        names = ["w", "b"]
        d = dict(zip(names, [x, x.sum()]))
        return d["w"] + d["b"], len(d)
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_fromkeys_mutable():
    def f(x):
        d = dict.fromkeys(["a", "b"], 0)
        d["a"] += 2
        return x * d["a"] + d["b"]
    return fn_program(f, (t(2),))

@case("containers")
def c_set_of_ints_from_shape():
    def f(x):
        s = set(x.shape)
        return x * len(s), sorted(s)
    return fn_program(f, (t(2, 3, 2),))

@case("containers")
def c_chain_map_lookup():
    def f(x):
        cm = collections.ChainMap({"a": 1}, {"a": 2, "b": 3})
        return x * cm["a"] + cm["b"]
    return fn_program(f, (t(2),))

@case("containers")
def c_list_multiply_and_copy():
    def f(x):
        l = [x] * 3
        m = l.copy()
        m[0] = x + 1
        return l[0] is x, m[0] - l[0], len(l + m)
    return fn_program(f, (t(2),))

@case("containers")
def c_dict_items_while_building_new():
    def f(d):
        out = {}
        for k in list(d):
            out[k.upper()] = d[k] * 2
        return out
    return fn_program(f, ({"a": t(2), "b": t(2)},))

@case("containers")
def c_global_list_appended():
    def f(x):
        LOG.append(x.shape[0])
        return x + len(LOG)
    LOG.clear()
    return fn_program(f, (t(2),), (t(2),), (t(3),), observe=lambda: list(LOG))
LOG = []

@case("containers")
def c_dict_in_namedtuple_mutated():
    def f(p):
        p.b["k"] = p.a * 2
        return p.a + 1
    p = Pt(t(2), {})
    return fn_program(f, (p,), observe=lambda: p.b)
