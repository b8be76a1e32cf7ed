"""A list mutated inside a `for` loop whose body has a graph break: the resume function must keep
iterating the same list by index, as CPython's list iterator does (appends, removes and pops made
after the break are seen), and must not compile once per loop position."""
import torch

import kiln

gb = torch._dynamo.graph_break
GLOBAL_LIST = [1, 2]


def local_append(x):
    l = [1, 2]
    for v in l:
        x = x + v
        gb()
        if len(l) < 4:
            l.append(v * 10)
    return x, l


def append_before_break(x):
    l = [1, 2]
    for v in l:
        if len(l) < 5:
            l.append(v + 1)
        x = x + v
        gb()
    return x, l


def argument_append(x, l):
    for v in l:
        x = x + v
        gb()
        if len(l) < 4:
            l.append(v * 10)
    return x, l


def global_append(x):
    for v in GLOBAL_LIST:
        x = x + v
        gb()
        if len(GLOBAL_LIST) < 4:
            GLOBAL_LIST.append(v * 10)
    return x, list(GLOBAL_LIST)


def remove_in_body(x):
    l = [1, 2, 3, 4, 5]
    for v in l:
        x = x + v
        gb()
        if v == 2:
            l.remove(3)
    return x, l


def pop_in_body(x):
    l = [1, 2, 3, 4, 5]
    for v in l:
        x = x * 2 + v
        gb()
        l.pop()
    return x, l


def nested_loops(x):
    outer = [1, 2]
    for a in outer:
        inner = [a]
        for b in inner:
            x = x + a * b
            gb()
            if len(inner) < 3:
                inner.append(b + 1)
        if len(outer) < 3:
            outer.append(a + 5)
    return x, outer


def _check(fn, make_args):
    GLOBAL_LIST[:] = [1, 2]
    expected = fn(*make_args())
    GLOBAL_LIST[:] = [1, 2]
    got = kiln.compile(fn)(*make_args())
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1]


def test_local_list_appended_after_the_break():
    _check(local_append, lambda: (torch.zeros(2),))


def test_list_appended_before_the_break():
    _check(append_before_break, lambda: (torch.zeros(2),))


def test_argument_list_appended():
    args = [torch.zeros(2), [1, 2]]
    GLOBAL_LIST[:] = [1, 2]
    expected_list = [1, 2]
    expected = argument_append(torch.zeros(2), expected_list)
    got = kiln.compile(argument_append)(*args)
    torch.testing.assert_close(got[0], expected[0])
    assert args[1] == expected_list == [1, 2, 10, 20]


def test_global_list_appended():
    _check(global_append, lambda: (torch.zeros(2),))


def test_remove_in_body():
    _check(remove_in_body, lambda: (torch.zeros(2),))


def test_pop_in_body():
    _check(pop_in_body, lambda: (torch.zeros(2),))


def test_nested_loops():
    _check(nested_loops, lambda: (torch.zeros(2),))


def test_unmutated_list_does_not_compile_per_position():
    def loop(x, xs):
        for t in xs:
            x = x + t
            gb()
        return x

    xs = [torch.full((2,), float(i)) for i in range(12)]
    kiln.reset()
    compiled = kiln.compile(loop)
    torch.testing.assert_close(compiled(torch.zeros(2), xs), loop(torch.zeros(2), xs))
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["compiles"] <= 4, stats
