"""nn.Module programs, part d: containers the frame builds and then changes (ModuleList append /
extend / insert / setitem / delitem / pop, Sequential append, ModuleDict built from a dict and
written, containers of a subclass made in the frame, writes across a graph break, nested built
containers), and torch.func.jacrev / jacfwd with chunk_size and randomness. Same conventions as
part a.
"""
from __future__ import annotations

import torch
from torch import nn

from modules3_programs_a import d

X = torch.randn


class MyDict(nn.ModuleDict):
    pass


class MyList(nn.ModuleList):
    pass


def ml_append(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            s.ml = nn.ModuleList([s.a]); s.ml.append(s.b)
            for l in s.ml: x = l(x)
            return x
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [len(m.ml), m.ml[1] is m.b, m.ml[0] is m.a]
def ml_extend_insert(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4); s.c = nn.Tanh()
        def forward(s, x):
            s.ml = nn.ModuleList()
            s.ml.extend([s.a, s.b]); s.ml.insert(1, s.c)
            for l in s.ml: x = l(x)
            return x, len(s.ml)
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [[type(l).__name__ for l in m.ml], list(m.ml._modules)]
def ml_setitem(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            ml = nn.ModuleList([s.a, s.a]); ml[1] = s.b; ml[-2] = s.b
            for l in ml: x = l(x)
            s.keep = ml
            return x
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [m.keep[0] is m.b]
def md_setitem(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2); s.b = nn.Linear(4, 2)
        def forward(s, x):
            s.heads = nn.ModuleDict({"a": s.a}); s.heads["b"] = s.b
            return sum(h(x) for h in s.heads.values())
    m = M(); cm = C(m); x = X(2, 4)
    out = [d(cm(x)) for _ in range(2)]
    return out + [sorted(m.heads.keys()), m.heads["b"] is m.b]
def md_update_pop(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2); s.b = nn.Linear(4, 2)
        def forward(s, x):
            md = nn.ModuleDict(); md.update({"a": s.a, "b": s.b}); p = md.pop("a")
            return md["b"](x) + p(x), list(md.keys()), "a" in md
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def seq_append(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4)
        def forward(s, x):
            seq = nn.Sequential(s.a); seq.append(nn.ReLU())
            return seq(x), len(seq)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def ml_pop_del(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4); s.c = nn.ReLU()
        def forward(s, x):
            ml = nn.ModuleList([s.a, s.b, s.c]); del ml[0]; last = ml.pop(-1)
            for l in ml: x = l(x)
            return last(x), len(ml)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]


def sub_md_update_pop(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2); s.b = nn.Linear(4, 2)
        def forward(s, x):
            md = MyDict(); md.update({"a": s.a, "b": s.b}); p = md.pop("a")
            return md["b"](x) + p(x), list(md.keys()), "a" in md
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def sub_md_setitem_del(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2); s.b = nn.Linear(4, 2)
        def forward(s, x):
            md = MyDict({"a": s.a}); md["b"] = s.b; del md["a"]
            return md["b"](x), list(md.keys()), len(md)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def sub_ml_append(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            ml = MyList([s.a]); ml.append(s.b); ml.insert(0, s.b); r = ml.pop(1)
            for l in ml: x = l(x)
            return r(x), len(ml)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def md_plain_new_modules(C):
    class M(nn.Module):
        def forward(s, x):
            if not hasattr(s, "md"):
                s.md = nn.ModuleDict(); s.md["lin"] = nn.Linear(4, 2); s.md.update({"act": nn.Tanh()})
            return s.md["act"](s.md["lin"](x))
    m = M(); cm = C(m); x = X(2, 4)
    return [d(cm(x)) for _ in range(3)] + [list(m.md.keys())]
def md_pop_missing(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2)
        def forward(s, x):
            md = nn.ModuleDict({"a": s.a})
            try:
                md.pop("zz")
            except KeyError as e:
                return md["a"](x), str(e)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def ml_index_error(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 2)
        def forward(s, x):
            ml = nn.ModuleList([s.a])
            try:
                ml[3] = s.a
            except IndexError as e:
                return ml[0](x), str(e)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def ml_iadd_returned(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.ReLU()
        def forward(s, x):
            ml = nn.ModuleList([s.a]); ml += [s.b]
            for l in ml: x = l(x)
            return x, ml
    m = M(); cm = C(m); x = X(2, 4)
    outs = [cm(x) for _ in range(2)]
    return [d(o[0]) for o in outs] + [len(outs[0][1]), outs[0][1][1] is m.b, outs[0][1] is outs[1][1]]


def built_across_break(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            ml = nn.ModuleList([s.a]); s.ml = ml
            print("", end="")  # a graph break
            ml.append(s.b)
            for l in ml: x = l(x)
            return x, s.ml is ml, len(s.ml)
    m = M(); cm = C(m); x = X(2, 4)
    outs = [cm(x) for _ in range(2)]
    return outs + [len(m.ml)]
def built_appended_after_break(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            ml = nn.ModuleList([s.a]); ml.append(s.b); s.ml = ml
            y = ml[0](x)
            print("", end="")
            ml.insert(0, nn.ReLU())
            for l in ml: x = l(x)
            return x + y, s.ml is ml, len(s.ml)
    m = M(); cm = C(m); x = X(2, 4)
    outs = [cm(x) for _ in range(2)]
    return outs + [len(m.ml), [type(l).__name__ for l in m.ml]]
def built_nested(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            blocks = nn.ModuleList()
            blocks.append(nn.Sequential(s.a, nn.ReLU()))
            blocks.append(nn.Sequential(s.b))
            blocks[1].append(nn.Tanh())
            for blk in blocks: x = blk(x)
            s.blocks = blocks
            return x
    m = M(); cm = C(m); x = X(2, 4)
    outs = [d(cm(x)) for _ in range(2)]
    return outs + [[len(b) for b in m.blocks], m.blocks[0][0] is m.a]
def built_extend_from_source(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.src = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        def forward(s, x):
            ml = nn.ModuleList([nn.Identity()]); ml.extend(s.src); ml.insert(1, nn.GELU())
            if x.shape[0] == 3: ml.insert(-1, nn.ReLU())
            for l in ml: x = l(x)
            return x, [type(l).__name__ for l in ml]
    m = M(); cm = C(m); out = [cm(X(2, 4)) for _ in range(2)]
    try:
        cm(X(3, 4))
    except KeyError as e:
        out.append(str(e))
    return out
def built_dict_nonstr_key(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4)
        def forward(s, x):
            md = nn.ModuleDict()
            try:
                md[1] = s.a
            except TypeError as e:
                return x * 2, str(e)
            return x, list(md.keys())
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def built_modulelist_slice(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            ml = nn.ModuleList([s.a, nn.ReLU(), s.b]); ml.append(nn.Tanh())
            for l in ml[1:]: x = l(x)
            return x, len(ml[::-1])
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(2)]
def built_container_grads(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)
        def forward(s, x):
            md = nn.ModuleDict({"a": s.a}); md.update([("b", s.b)]); md["c"] = md.pop("a")
            return md["c"](md["b"](x)), list(md.keys())
    m = M(); cm = C(m); x = X(2, 4)
    y, k = cm(x); y.sum().backward()
    return [d(y), k, d(m.a.weight.grad), d(m.b.weight.grad)]


def jacrev_chunk(C):
    m = nn.Linear(3, 2); params = {k: v.detach() for k, v in m.named_parameters()}
    def f(params, x):
        return torch.func.jacrev(lambda p: torch.func.functional_call(m, p, (x,)), chunk_size=1)(params)
    cf = C(f); out = []
    for _ in range(2):
        j = cf(params, X(4, 3)); out += [d(j["weight"]), d(j["bias"])]
    return out
def jacrev_chunk3_aux(C):
    w = torch.randn(5, 3)
    def f(x):
        return torch.func.jacrev(lambda y: ((w @ y).sin(), y.sum()), has_aux=True, chunk_size=3)(x)
    cf = C(f); return [cf(X(3)), cf(X(3))]
def jacrev_chunk_bad(C):
    def f(x):
        return torch.func.jacrev(torch.sin, chunk_size=0)(x)
    return [C(f)(X(3))]
def jacfwd_random_different(C):
    def f(x):
        return torch.func.jacfwd(lambda y: y.sin() * torch.rand(()), randomness="different")(x)
    cf = C(f); torch.manual_seed(1); a = cf(X(3)); return [a.shape]
def jacfwd_random_same_values(C):
    def f(x):
        torch.manual_seed(3)
        return torch.func.jacfwd(lambda y: torch.nn.functional.dropout(y.sin(), 0.5), randomness="same")(x)
    cf = C(f); return [cf(X(4)), cf(X(4))]
def jacfwd_random_error(C):
    def f(x):
        return torch.func.jacfwd(lambda y: torch.nn.functional.dropout(y, 0.5))(x)
    return [C(f)(X(4))]
def jacfwd_no_random_with_option(C):
    w = torch.randn(3, 3)
    def f(x):
        return torch.func.jacfwd(lambda y: (w @ y).tanh(), randomness="different")(x)
    cf = C(f); return [cf(X(3)), cf(X(3))]
def jacrev_chunk_backward(C):
    w = torch.randn(3, 3, requires_grad=True)
    def f(x):
        return torch.func.jacrev(lambda y: (w @ y).tanh(), chunk_size=2)(x).sum()
    cf = C(f); x = X(3); loss = cf(x); loss.backward(); return [d(loss), d(w.grad)]
def jacrev_chunk_returned(C):
    def f(x):
        return torch.func.jacrev(torch.sin, chunk_size=2), x * 2
    jf, y = C(f)(X(3)); return [d(y), d(jf(torch.ones(3)))]


PROGRAMS_D = [ml_append, ml_extend_insert, ml_setitem, md_setitem, md_update_pop, seq_append, ml_pop_del,
              sub_md_update_pop, sub_md_setitem_del, sub_ml_append, md_plain_new_modules, md_pop_missing,
              ml_index_error, ml_iadd_returned, built_across_break, built_appended_after_break, built_nested,
              built_extend_from_source, built_dict_nonstr_key, built_modulelist_slice, built_container_grads,
              jacrev_chunk, jacrev_chunk3_aux, jacrev_chunk_bad, jacfwd_random_different,
              jacfwd_random_same_values, jacfwd_random_error, jacfwd_no_random_with_option, jacrev_chunk_backward,
              jacrev_chunk_returned]


# BatchNorm with momentum=None (a cumulative average: 1 / num_batches_tracked, read at a graph break):
# the momentum is a symbolic float after its second value, under AOT autograd too (an ATen op takes
# it as a Python number, which guarded it: a graph per call)
def bn_cumulative_average(C):
    m = nn.BatchNorm1d(4, momentum=None); cm = C(m); out = []
    for i in range(5):
        out += [d(cm(X(8, 4) * (i + 1))), d(m.running_mean), d(m.running_var), int(m.num_batches_tracked)]
    return out


def bn_cumulative_average_backward(C):
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, momentum=None)); cm = C(m); out = []
    for _ in range(4):
        m.zero_grad()
        y = cm(X(2, 3, 3, 3)); y.mul(torch.arange(y.numel()).reshape(y.shape).sin()).sum().backward()
        out += [d(y), d(m[1].running_var), d(m[0].weight.grad), d(m[1].weight.grad), m[1].running_var._version]
    return out


PROGRAMS_D += [bn_cumulative_average, bn_cumulative_average_backward]


def built_kept_and_local_across_break(C):
    # the container is on `self` and in a local when the frame breaks: the resume reads both paths to
    # one new object each call (guarded as one object, not as the first call's: a recompile per call)
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)

        def forward(s, x):
            ml = nn.ModuleList([s.a]); ml.append(s.b); s.ml = ml
            y = ml[0](x)
            print("", end="")  # a graph break
            ml.insert(0, nn.ReLU())
            for layer in ml:
                x = layer(x)
            return x + y, s.ml is ml, len(s.ml)
    m = M(); cm = C(m); x = X(2, 4)
    return [cm(x) for _ in range(5)]


PROGRAMS_D.append(built_kept_and_local_across_break)


class Blocks(nn.ModuleList):
    def __init__(s):
        super().__init__()
        s.tag = "blocks"


def sub_custom_init_written(C):
    class M(nn.Module):
        def __init__(s):
            super().__init__(); s.a = nn.Linear(4, 4); s.b = nn.Linear(4, 4)

        def forward(s, x):
            blocks = Blocks(); blocks.append(s.a); blocks.insert(0, s.b)
            for layer in blocks:
                x = layer(x)
            return x, len(blocks), blocks.tag
    m = M(); cm = C(m)
    return [cm(X(2, 4)) for _ in range(2)]


PROGRAMS_D.append(sub_custom_init_written)
