import torch, collections, copy, operator
from harness import case, fn_program, t, Program, kw

@case("q_ct")
def q_dict_items_mutate_during_iter_raises():
    def f(x):
        d = {"a": 1, "b": 2}
        try:
            for k, v in d.items():
                d[k + "x"] = v
        except RuntimeError as e:
            return x + 1, "changed size" in str(e)
        return x
    return fn_program(f, (t(3),))

@case("q_ct")
def q_set_mutate_during_iter_raises():
    def f(x):
        s = {1, 2, 3}
        try:
            for v in s:
                s.add(v + 10)
        except RuntimeError:
            return x - 1
        return x
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_setdefault_fromkeys():
    def f(x):
        d = dict.fromkeys(["a", "b"], 0)
        d.setdefault("a", 5)
        lst = d.setdefault("c", [])
        lst.append(x)
        return d["c"][0] * 2 + d["a"], sorted(d)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_pop_popitem_update():
    def f(x):
        d = {"a": x, "b": x * 2, "c": 3}
        a = d.pop("a")
        z = d.pop("zz", 7)
        k, v = d.popitem()
        d.update({"q": 1}, r=2)
        d |= {"s": 4}
        return a + z + v, list(d), k
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_views_ops():
    def f(x):
        d = {"a": 1, "b": 2, "c": 3}
        e = {"b": 0, "d": 1}
        ks = d.keys() & e.keys()
        ks2 = d.keys() - {"a"}
        return x * len(ks), sorted(ks2), list(d.values()), ("a", 1) in d.items(), list(reversed(d))
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_comprehension_filter():
    def f(xs):
        d = {f"k{i}": v * i for i, v in enumerate(xs) if i % 2 == 0}
        return d
    return fn_program(f, ([t(3), t(3), t(3), t(3)],))

@case("q_ct")
def q_dict_of_tensors_input_mutated():
    def f(d):
        d["out"] = d["a"] + d["b"]
        del d["b"]
        d["a"].mul_(2)
        return len(d)
    return fn_program(f, ({"a": t(3), "b": t(3)},), observe=None)

@case("q_ct")
def q_list_input_mutated_order():
    def f(xs, x):
        xs.append(x * 2)
        xs.insert(0, x)
        xs.pop(1)
        xs.reverse()
        return len(xs)
    lst = [t(3), t(3)]
    return fn_program(f, (lst, t(3)), observe=lambda: list(lst))

@case("q_ct")
def q_list_methods_sort_index_count():
    def f(x):
        l = [3, 1, 2, 3]
        l.sort(key=lambda v: -v)
        l.extend((5, 6))
        l.remove(3)
        return x * l.index(2) + l.count(3), l, l[::-2], l[1:4:2]
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_slice_assignment_del():
    def f(x):
        l = [x, x * 2, x * 3, x * 4]
        l[1:3] = [x - 1]
        del l[-1]
        l[::1] = l[::-1]
        return l
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_mul_add_compare():
    def f(x):
        a = [1, 2] * 2
        b = a + [3]
        return x * len(b), a < b, [1, 2] == [1, 2], [x] * 2
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_copy_vs_alias():
    def f(xs):
        a = xs
        b = xs.copy()
        c = list(xs)
        a.append(1)
        return len(xs), len(b), len(c), b is xs
    lst = [t(3)]
    return fn_program(f, (lst,), observe=lambda: len(lst))

@case("q_ct")
def q_tuple_methods_unpack_star():
    def f(x):
        tp = (1, 2, 3, 2)
        a, *mid, b = tp
        return x * tp.count(2) + tp.index(3), mid, (*tp[:2], *mid), tp + (4,)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_tuple_compare_hash():
    def f(x):
        a = (1, 2)
        d = {a: x, (1, 3): x * 2}
        return d[(1, 2)] + d[(1, 3)], (1, 2) < (1, 2, 0), hash(a) == hash((1, 2))
    return fn_program(f, (t(3),))

@case("q_ct")
def q_set_ops_frozenset():
    def f(x):
        a = {1, 2, 3}
        b = frozenset([2, 3, 4])
        c = a ^ b
        a -= {1}
        a.discard(9)
        return x * len(c), sorted(a | b), a.issubset(b), a.isdisjoint({7}), sorted(a.symmetric_difference(b))
    return fn_program(f, (t(3),))

@case("q_ct")
def q_set_remove_missing_raises():
    def f(x):
        s = {1}
        try:
            s.remove(2)
        except KeyError as e:
            return x + e.args[0]
        return x
    return fn_program(f, (t(3),))

@case("q_ct")
def q_set_comprehension_strings():
    def f(x):
        s = {w.upper() for w in ["a", "b", "a"]}
        s.update("cd")
        return x * len(s), sorted(s), s.pop() in {"A", "B", "c", "d"}
    return fn_program(f, (t(3),))

@case("q_ct")
def q_ordereddict_move_to_end():
    def f(x):
        od = collections.OrderedDict(a=1, b=2, c=3)
        od.move_to_end("a")
        od.move_to_end("c", last=False)
        k, v = od.popitem(last=False)
        return x * v, list(od.keys()), k
    return fn_program(f, (t(3),))

@case("q_ct")
def q_defaultdict_list_and_int():
    def f(x):
        d = collections.defaultdict(list)
        c = collections.defaultdict(int)
        for i, w in enumerate("abcab"):
            d[w].append(i)
            c[w] += 1
        return x * c["a"] + len(d["b"]), dict(d), "z" in c, c["z"], "z" in c
    return fn_program(f, (t(3),))

@case("q_ct")
def q_defaultdict_tensor_factory():
    def f(xs):
        d = collections.defaultdict(lambda: torch.zeros(3))
        for i, v in enumerate(xs):
            d[i % 2] = d[i % 2] + v
        return d[0], d[1]
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_ct")
def q_counter_most_common():
    def f(x):
        c = collections.Counter("abracadabra")
        c.update("zz")
        mc = c.most_common(2)
        return x * mc[0][1], mc, c["q"], sum(c.values())
    return fn_program(f, (t(3),))

@case("q_ct")
def q_counter_arith():
    def f(x):
        a = collections.Counter(a=3, b=1)
        b = collections.Counter(a=1, b=2)
        return x * (a - b)["a"], dict(a + b), dict(a & b), dict(a | b)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_deque_ops_maxlen():
    def f(x):
        dq = collections.deque([1, 2, 3], maxlen=3)
        dq.append(4)
        dq.appendleft(0)
        dq.rotate(1)
        v = dq.popleft()
        dq.extendleft([7, 8])
        return x * v, list(dq), dq.maxlen
    return fn_program(f, (t(3),))

@case("q_ct")
def q_deque_of_tensors_window():
    def f(xs):
        win = collections.deque(maxlen=2)
        outs = []
        for v in xs:
            win.append(v)
            outs.append(sum(win))
        return outs
    return fn_program(f, ([t(3), t(3), t(3)],))

@case("q_ct")
def q_chainmap_lookup():
    def f(x):
        cm = collections.ChainMap({"a": 1}, {"a": 2, "b": 3})
        return x * cm["a"] + cm["b"], len(cm), sorted(cm)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_merge_operator_order():
    def f(x):
        a = {"x": 1, "y": 2}
        b = {"y": 3, "z": 4}
        m = a | b
        return x * m["y"], list(m.items()), {**b, **a}
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_get_missing_keyerror():
    def f(x):
        d = {"a": x}
        try:
            return d["b"]
        except KeyError as e:
            return x * 2, e.args
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_del_missing_and_in():
    def f(x):
        d = {1: x}
        r = 0
        try:
            del d[2]
        except KeyError:
            r = 1
        return x + r + (1 in d), len(d)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_nested_containers_deepcopy():
    def f(x):
        a = {"l": [1, 2], "t": (3,)}
        b = copy.deepcopy(a)
        b["l"].append(9)
        c = copy.copy(a)
        c["l"].append(7)
        return x * len(a["l"]), a, b
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_of_lists_tensors_mutated_inner():
    def f(xs):
        for row in xs:
            row.append(row[0] * 2)
        return sum(len(r) for r in xs)
    data = [[t(2)], [t(2), t(2)]]
    return fn_program(f, (data,), observe=lambda: [list(r) for r in data])

@case("q_ct")
def q_dict_input_new_key_and_iter_order():
    def f(d, x):
        d["z"] = x
        d["a"] = d["a"] * 2
        return list(d)
    dd = {"a": t(3), "m": t(3)}
    return fn_program(f, (dd, t(3)), observe=lambda: dict(dd))

@case("q_ct")
def q_list_comprehension_nested_if():
    def f(x):
        m = [[i * j for j in range(3) if j != i] for i in range(3)]
        flat = [v for row in m for v in row if v]
        return x * sum(flat), m
    return fn_program(f, (t(3),))

@case("q_ct")
def q_walrus_in_comprehension():
    def f(xs):
        out = [y for v in xs if (y := v * 2).sum() > -100]
        return out, y
    return fn_program(f, ([t(3), t(3)],))

@case("q_ct")
def q_walrus_while_loop():
    def f(x):
        items = [1, 2, 3]
        total = x
        while (n := len(items)) > 1:
            total = total + items.pop() * n
        return total
    return fn_program(f, (t(3),))

@case("q_ct")
def q_slice_objects():
    def f(x):
        s = slice(1, None, 2)
        l = list(range(10))
        return x[s], l[s], s.start, s.stop, s.step, s.indices(10), l[slice(-3, None)]
    return fn_program(f, (t(6),))

@case("q_ct")
def q_range_arith_props():
    def f(x):
        r = range(2, 20, 3)
        return x * len(r) + r[2] + r[-1], r.index(8), 11 in r, list(r[1:3]), r.start, r.step, list(reversed(range(3)))
    return fn_program(f, (t(3),))

@case("q_ct")
def q_range_equal_and_count():
    def f(x):
        return x * range(0, 6, 2).count(4), range(0, 3) == range(0, 3, 1), range(5)[::2] == range(0, 5, 2)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_str_methods_basic():
    def f(x, s):
        parts = s.strip().split("_")
        name = "-".join(p.capitalize() for p in parts)
        return x * len(parts), name, s.startswith(" a"), s.replace("_", ""), s.find("b"), s.upper().lower(), s.count("_")
    return fn_program(f, (t(3), " ab_cd_ef "))

@case("q_ct")
def q_str_format_variants():
    def f(x, v):
        a = "{:.2f}|{:>5}|{:03d}".format(v, "ab", 7)
        b = f"{v!r:>8}{v:+.1e}"
        c = "%s-%d-%.1f" % ("q", 3, v)
        return x + len(a + b + c), a, b, c
    return fn_program(f, (t(3), 3.14159))

@case("q_ct")
def q_str_partition_zfill_etc():
    def f(x):
        s = "key=value=2"
        h, sep, tl = s.partition("=")
        r = s.rpartition("=")
        return x + len(h), tl, r, "7".zfill(3), "ab".center(6, "*"), "a,b,,c".split(",", 2), "AbC".swapcase(), "x y".title()
    return fn_program(f, (t(3),))

@case("q_ct")
def q_str_predicates_and_join_ints():
    def f(x):
        vals = ["12", "ab", "1a", "  "]
        flags = [(v.isdigit(), v.isalpha(), v.isalnum(), v.isspace()) for v in vals]
        return x * sum(a for a, _, _, _ in flags), flags, ",".join(map(str, [1, 2, 3]))
    return fn_program(f, (t(3),))

@case("q_ct")
def q_str_encode_ord_chr():
    def f(x):
        s = "abc"
        return x * ord(s[1]) + len(s.encode()), chr(100), [ord(c) - 96 for c in s], s[::-1], s * 2
    return fn_program(f, (t(3),))

@case("q_ct")
def q_str_key_to_dict_of_tensors():
    def f(d):
        out = {}
        for k, v in d.items():
            out[k.replace("old", "new")] = v + 1
        return out
    return fn_program(f, ({"old_a": t(2), "b_old": t(2)},))

@case("q_ct")
def q_bytes_and_bytearray():
    def f(x):
        b = bytearray(b"ab")
        b.append(99)
        return x + len(b), bytes(b), b"xy" + b"z", b[0]
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_sort_in_place_tensors_by_key():
    def f(xs):
        xs = list(xs)
        xs.sort(key=lambda v: v.shape[0])
        return [v.shape[0] for v in xs], xs[0]
    return fn_program(f, ([t(4), t(2), t(3)],))

@case("q_ct")
def q_dict_keys_iter_while_pop_copy():
    def f(x):
        d = {"a": 1, "b": 2, "c": 3}
        for k in list(d):
            if d[k] % 2:
                d.pop(k)
        return x * len(d), d
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_equality_and_ordering_insensitive():
    def f(x):
        a = {"a": 1, "b": 2}
        b = {"b": 2, "a": 1}
        return x + (a == b), list(a) == list(b), a.get("c") is None
    return fn_program(f, (t(3),))

@case("q_ct")
def q_unpack_dict_into_kwargs_and_star_list():
    def g(a, b, c):
        return a * 100 + b * 10 + c
    def f(x):
        args = [1]
        kws = {"c": 3}
        return x * g(*args, 2, **kws), g(**{"a": 1, "b": 2, "c": 0})
    return fn_program(f, (t(3),))

@case("q_ct")
def q_tuple_of_tensors_input_indexing_neg():
    def f(tp):
        return tp[-1] - tp[0], tp[1:], len(tp)
    return fn_program(f, ((t(2), t(2), t(2)),))

@case("q_ct")
def q_list_index_out_of_range():
    def f(x):
        l = [1, 2]
        try:
            return l[5]
        except IndexError as e:
            return x - 1, str(e)
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_pop_empty_raises():
    def f(x):
        l = []
        try:
            l.pop()
        except IndexError:
            return x * 3
        return x
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_iteration_values_tensor_sum():
    def f(d):
        total = 0
        for i, (k, v) in enumerate(sorted(d.items())):
            total = total + v * (i + 1)
        return total
    return fn_program(f, ({"b": t(3), "a": t(3), "c": t(3)},))

@case("q_ct")
def q_counter_elements_subtract():
    def f(x):
        c = collections.Counter(a=2, b=1)
        c.subtract({"a": 1, "c": 2})
        return x * c["a"], sorted(c.elements()), c.total()
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_extend_self_and_iadd_alias():
    def f(x):
        a = [x]
        b = a
        a += [x * 2]
        a.extend(a)
        return len(b), b[3]
    return fn_program(f, (t(3),))

@case("q_ct")
def q_list_del_slice_step():
    def f(x):
        l = list(range(10))
        del l[::3]
        return x * len(l), l
    return fn_program(f, (t(3),))

@case("q_ct")
def q_dict_from_zip_and_items_sorted_by_value():
    def f(x):
        d = dict(zip("abc", [3, 1, 2]))
        s = sorted(d.items(), key=operator.itemgetter(1))
        return x * s[0][1], s, max(d, key=d.get)
    return fn_program(f, (t(3),))
