"""Programs for test_dynbuiltins_programs.py: itertools."""
import itertools, functools, operator, torch
T = lambda: (torch.arange(6.).reshape(2,3),)
X = lambda: (torch.ones(3),)

def chain1(x):
    return [t * 2 for t in itertools.chain([x, x + 1], (x - 1,))]
def chain_from_iter(x):
    return sum(itertools.chain.from_iterable([[x, 1], [2.0, x]]))
def product1(x):
    out = x
    for a, b in itertools.product([1, 2], [3, 4]):
        out = out + a * b
    return out
def product_repeat(x):
    return [x * (a - b) for a, b in itertools.product(range(2), repeat=2)]
def accumulate1(x):
    return list(itertools.accumulate([x, x * 2, x * 3]))
def accumulate_fn(x):
    return list(itertools.accumulate([1, 3, 2, 5], max)), x + 1
def accumulate_initial(x):
    return list(itertools.accumulate([1, 2, 3], operator.mul, initial=10)), x * 2
def islice1(x):
    return [x * i for i in itertools.islice(itertools.count(3), 2, 6, 2)]
def islice_list(x):
    return list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None))
def zip_longest1(x):
    return [(a, b) for a, b in itertools.zip_longest([x, x], [1], fillvalue=-1)]
def count_break(x):
    for i in itertools.count(1, 2):
        x = x + i
        if i > 5:
            break
    return x
def repeat1(x):
    return list(itertools.repeat(x, 3)), list(itertools.repeat(2, times=2))
def groupby1(x):
    out = []
    for k, g in itertools.groupby([1, 1, 2, 3, 3, 3]):
        out.append((k, len(list(g))))
    return x + len(out), out
def groupby_key(x):
    return {k: list(v) for k, v in itertools.groupby(["aa", "ab", "b", "ba"], key=lambda s: s[0])}, x * 3
def pairwise1(x):
    return [b - a for a, b in itertools.pairwise([x, x * 2, x * 4])]
def combinations1(x):
    return [a * b for a, b in itertools.combinations([x, x + 1, x + 2], 2)]
def combinations_wr(x):
    return list(itertools.combinations_with_replacement([1, 2, 3], 2)), x + 1
def permutations1(x):
    return sum(a - b for a, b in itertools.permutations([x, x * 2, 3.0], 2))
def tee1(x):
    a, b = itertools.tee([x, x + 1, x + 2])
    return list(a), [t * 2 for t in b]
def starmap1(x):
    return list(itertools.starmap(torch.add, [(x, 1), (x, 2)]))
def starmap_pow(x):
    return list(itertools.starmap(pow, [(2, 3), (3, 2)])), x
def cycle_break(x):
    n = 0
    for v in itertools.cycle([1, 2, 3]):
        x = x + v
        n += 1
        if n == 5:
            break
    return x
def takewhile1(x):
    return list(itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1])), x + 1
def dropwhile1(x):
    return list(itertools.dropwhile(lambda v: v < 3, [1, 2, 3, 1])), x + 1
def filterfalse1(x):
    return list(itertools.filterfalse(lambda v: v % 2, range(6))), x
def compress1(x):
    return list(itertools.compress([x, x + 1, x + 2], [1, 0, 1]))
def batched_like(x):
    it = iter(range(7))
    return [list(itertools.islice(it, 3)) for _ in range(3)], x
def chain_tensor_rows(x):
    return torch.stack(list(itertools.chain(x, x * 2)))
def product_tensors(x):
    return [a + b for a, b in itertools.product(x.unbind(0), [1.0, 2.0])]
def zip_longest_none(x):
    return list(itertools.zip_longest([1, 2, 3], "ab")), x
def islice_tensor(x):
    return list(itertools.islice(x, 1)), x
def count_float(x):
    c = itertools.count(0.5, 0.25)
    return x + next(c) + next(c) + next(c)
def nested_itertools(x):
    return [x * s for s in itertools.accumulate(itertools.chain(range(2), itertools.repeat(3, 2)))]
def tee_after_next(x):
    it = iter([1, 2, 3])
    next(it)
    a, b = itertools.tee(it, 2)
    return list(a), list(b), x

PROGS = [(n, f, X) for n, f in list(globals().items()) if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "") == __name__ and n not in ("T", "X")]
