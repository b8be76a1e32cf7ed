"""A generator's body and its consumer take turns, as CPython runs them (kiln/capture/variables/
generator.py): side effects of the body (a log, print, a counter, a tensor mutated in place)
interleave with the consumer's, and the body reads state (a list, a dict, an attribute, a global,
a tensor) as the consumer left it at that step. Each program is compared with eager, values and the
log, under kiln.compile's eager and default backends, with and without fullgraph; the real
torch.compile is the oracle that fullgraph=True traces it."""
from __future__ import annotations

import contextlib
import io
import itertools
from typing import Any, Callable

import pytest
import torch
import torch._dynamo

import kiln
from trace_oracle import same

X = torch.arange(4.0)
LOG: list = []
SCALE = 1.0


class Knob:
    def __init__(self) -> None:
        self.scale = 1.0


# ------------------------------------------------------------------------------------ the programs

def _produce(x, log):
    for i in range(3):
        log.append(f"produce {i}")
        yield x * i


def produce_consume(x, log):
    out = x * 0
    for v in _produce(x, log):
        log.append("consume")
        out = out + v
    return out


def _produce_global(x):
    for i in range(3):
        LOG.append(f"produce {i}")
        yield x * i


def produce_consume_global_log(x, log):
    out = x * 0
    for v in _produce_global(x):
        LOG.append("consume")
        out = out + v
    log.extend(LOG)
    LOG.clear()
    return out


def consumer_reads_the_log_length(x, log):
    out = []
    for v in _produce(x, log):
        out.append(v * len(log))  # eager: 1, 2, 3 items logged so far
    return out


def _reads_list(x, items):
    for i in range(3):
        yield x * items[-1] + len(items)


def body_reads_a_list_the_consumer_appends_to(x, log):
    items = [1]
    out = []
    for v in _reads_list(x, items):
        items.append(len(items) + 1)
        out.append(v)
    log.extend(items)
    return out


def _reads_dict(x, d):
    for k in ("a", "b", "c"):
        yield x * d.get(k, -1)


def body_reads_a_dict_the_consumer_writes(x, log):
    d = {"a": 2}
    out = []
    for v in _reads_dict(x, d):
        d["b"] = 3
        d["c"] = 5
        out.append(v)
    return out


def _reads_attribute(x, knob):
    for _ in range(3):
        yield x * knob.scale


def body_reads_an_attribute_the_consumer_sets(x, log):
    knob = Knob()
    out = []
    for v in _reads_attribute(x, knob):
        knob.scale = knob.scale + 1.0
        out.append(v)
    return out


def _reads_global(x):
    for _ in range(3):
        yield x * SCALE


def body_reads_a_global_the_consumer_writes(x, log):
    global SCALE
    out = []
    for v in _reads_global(x):
        SCALE = SCALE + 1.0
        out.append(v)
    SCALE = 1.0
    return out


def _reads_tensor(x):
    for i in range(3):
        yield x * 1.0 + i


def consumer_mutates_a_tensor_the_body_reads(x, log):
    out = []
    for v in _reads_tensor(x):
        x.add_(10)
        out.append(v)
    return out


def _mutates_tensor(x):
    for i in range(3):
        x.mul_(2)
        yield i


def body_mutates_a_tensor_the_consumer_reads(x, log):
    out = []
    for i in _mutates_tensor(x):
        out.append(x * 1.0 + i)
    return out


def generator_expression_with_side_effects(x, log):
    out = x * 0
    for v in (log.append(i) or x * i for i in range(3)):
        log.append("consume")
        out = out + v
    return out


def _logged(tag, x, log):
    for i in range(2):
        log.append(f"{tag}{i}")
        yield x + i


def zip_of_two_logging_generators(x, log):
    out = []
    for a, b in zip(_logged("a", x, log), _logged("b", x, log)):
        log.append("pair")
        out.append(a * b)
    return out


def next_calls_between_other_work(x, log):
    g = _produce(x, log)
    log.append("made")
    a = next(g)
    log.append("between")
    b = next(g)
    log.append("after")
    c = next(g)
    return a + b + c


def _delegating(x, log):
    log.append("outer start")
    yield from _produce(x, log)
    log.append("outer end")
    yield x * 100


def yield_from_delegation(x, log):
    out = []
    for v in _delegating(x, log):
        log.append("consume")
        out.append(v)
    return out


def two_generators_alternated_by_next(x, log):
    g, h = _logged("g", x, log), _logged("h", x, log)
    a = next(g)
    b = next(h)
    log.append("mid")
    c = next(g)
    d = next(h)
    return a + b + c + d


def enumerate_and_map_over_a_logging_generator(x, log):
    def tagged(v):
        log.append("map")
        return v * 2
    out = []
    for i, v in enumerate(map(tagged, _produce(x, log))):
        log.append(f"consume {i}")
        out.append(v)
    return out


def list_of_a_generator_then_the_consumer(x, log):
    values = list(_produce(x, log))
    log.append("after list")
    return values


def sum_of_a_logging_generator_expression(x, log):
    total = sum(log.append(i) or x * i for i in range(3))
    log.append("summed")
    return total


def any_stops_a_logging_generator_early(x, log):
    found = any((log.append(i) or i >= 1) for i in range(5))
    log.append("done")
    return x + found


def consumer_writes_what_the_body_yields_next(x, log):
    # the body reads `state` after each resume: the consumer's write of the step before is seen
    state = {"k": 1}

    def gen():
        for _ in range(3):
            yield state["k"]
    out = []
    for k in gen():
        state["k"] = k * 3
        out.append(x * k)
    return out


def body_closes_over_a_cell_the_consumer_rebinds(x, log):
    k = 1

    def gen():
        for _ in range(3):
            yield x * k
    out = []
    for v in gen():
        k += 1
        out.append(v)
    return out


def pure_generator(x, log):
    def squares(n):
        for i in range(n):
            yield x * i * i
    return sum(squares(3))


def _counted(x, log):
    log.append("start")
    for i in range(3):
        log.append(f"before {i}")
        yield x + i
        log.append(f"after {i}")
    log.append("end")


def nonlocal_counter_the_consumer_reads(x, log):
    count = 0

    def gen():
        nonlocal count
        for i in range(3):
            count += 1
            yield x * i
    out = []
    for v in gen():
        out.append(v + count)
    return out


def loop_left_early_then_resumed(x, log):
    g = _counted(x, log)
    for v in g:
        log.append("first loop")
        break
    rest = list(g)
    log.append("drained")
    return v, rest


def chain_of_two_logging_generators(x, log):
    out = []
    for v in itertools.chain(_logged("a", x, log), _logged("b", x, log)):
        log.append("consume")
        out.append(v)
    return out


def islice_of_a_logging_generator(x, log):
    out = [v for v in itertools.islice(_counted(x, log), 2)]
    log.append("sliced")
    return out


def zip_with_a_shorter_range_after(x, log):
    return [v * k for v, k in zip(_counted(x, log), range(2))]


def zip_with_a_shorter_range_before(x, log):
    return [v * k for k, v in zip(range(2), _counted(x, log))]


def filter_of_a_logging_generator(x, log):
    out = []
    for i in filter(lambda i: log.append(f"test {i}") or i % 2 == 0, (log.append(f"make {i}") or i for i in range(4))):
        log.append(f"keep {i}")
        out.append(x * i)
    return out


def unpacking_runs_the_body_to_its_end(x, log):
    a, b, c = _counted(x, log)
    log.append("unpacked")
    return a + b + c


def next_with_a_default_at_the_end(x, log):
    g = _counted(x, log)
    items = [next(g), next(g), next(g)]
    log.append("three")
    last = next(g, None)
    log.append("default")
    return items, last is None


def dict_comprehension_over_a_logging_generator(x, log):
    d = {i: v for i, v in enumerate(_counted(x, log))}
    log.append(len(d))
    return d


def join_of_a_logging_generator_expression(x, log):
    text = "-".join(log.append(i) or str(i) for i in range(3))
    log.append(text)
    return x + len(text)


def max_and_sorted_of_logging_generators(x, log):
    top = max(log.append(("max", i)) or (i * 7) % 5 for i in range(4))
    order = sorted(log.append(("sorted", i)) or (i * 3) % 4 for i in range(4))
    return x * top, order


def generator_abandoned_by_an_exception(x, log):
    try:
        for v in _counted(x, log):
            log.append("consume")
            raise KeyError("stop")
    except KeyError:
        log.append("caught")
    return x + 1


def body_mutates_a_view_of_the_consumer_tensor(x, log):
    def halves(t):
        for part in (t[:2], t[2:]):
            part.add_(1)
            yield part.sum()
    out = []
    for s in halves(x):
        out.append(s + x.sum())
    return out


def map_of_a_logging_function_over_a_list(x, log):
    def scaled(k):
        log.append(f"map {k}")
        return x * k
    out = []
    for v in map(scaled, [1, 2, 3]):
        log.append("consume")
        out.append(v)
    return out


def filter_with_a_logging_predicate_over_a_list(x, log):
    out = []
    for k in filter(lambda k: log.append(f"test {k}") or k != 2, [1, 2, 3]):
        log.append(f"keep {k}")
        out.append(x * k)
    return out


def map_of_a_tensor_op_the_consumer_mutates_between(x, log):
    parts = [x[:2], x[2:]]
    out = []
    for v in map(torch.neg, parts):
        parts[1].add_(5)  # eager negates the second part after this
        out.append(v.clone())
    return out


def pairwise_of_a_logging_generator(x, log):
    out = []
    for a, b in itertools.pairwise(_counted(x, log)):
        log.append("pair")
        out.append(a * b)
    return out


def zip_longest_of_logging_generators(x, log):
    out = []
    for a, b in itertools.zip_longest(_logged("a", x, log), _counted(x, log), fillvalue=0):
        log.append("row")
        out.append(a + b)
    return out


def accumulate_with_a_logging_function(x, log):
    def add(a, b):
        log.append("add")
        return a + b
    out = []
    for v in itertools.accumulate([x, x * 2, x * 3], add):
        log.append("consume")
        out.append(v)
    return out


class LoggingCountdown:
    def __init__(self, x, log, n):
        self.x, self.log, self.n = x, log, n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        self.log.append(f"next {self.n}")
        return self.x * self.n


def zip_of_user_iterators_with_logging_next(x, log):
    out = []
    for a, b in zip(LoggingCountdown(x, log, 2), LoggingCountdown(x, log, 3)):
        log.append("pair")
        out.append(a + b)
    return out


def loop_over_a_user_iterator_with_logging_next(x, log):
    out = []
    for v in LoggingCountdown(x, log, 3):
        log.append("consume")
        out.append(v)
    return out


def list_extended_by_a_generator_that_reads_it(x, log):
    items = [1, 2]
    items.extend(log.append(len(items)) or i for i in range(2))
    return x * len(items), items


def groupby_of_a_logging_generator(x, log):
    out = []
    for k, group in itertools.groupby(log.append(f"g{i}") or i // 2 for i in range(5)):
        log.append(f"key {k}")
        if k != 1:
            out.append(x * len(list(group)))
    return out


def groupby_with_a_logging_key_over_a_list(x, log):
    def first(s):
        log.append(s)
        return s[0]
    return [(k, x * len(list(g))) for k, g in itertools.groupby(["aa", "ab", "b", "ca"], key=first)]


PROGRAMS: list[Callable[..., Any]] = [
    produce_consume,
    produce_consume_global_log,
    consumer_reads_the_log_length,
    body_reads_a_list_the_consumer_appends_to,
    body_reads_a_dict_the_consumer_writes,
    body_reads_an_attribute_the_consumer_sets,
    body_reads_a_global_the_consumer_writes,
    consumer_mutates_a_tensor_the_body_reads,
    body_mutates_a_tensor_the_consumer_reads,
    generator_expression_with_side_effects,
    zip_of_two_logging_generators,
    next_calls_between_other_work,
    yield_from_delegation,
    two_generators_alternated_by_next,
    enumerate_and_map_over_a_logging_generator,
    list_of_a_generator_then_the_consumer,
    sum_of_a_logging_generator_expression,
    any_stops_a_logging_generator_early,
    consumer_writes_what_the_body_yields_next,
    body_closes_over_a_cell_the_consumer_rebinds,
    pure_generator,
    nonlocal_counter_the_consumer_reads,
    loop_left_early_then_resumed,
    chain_of_two_logging_generators,
    islice_of_a_logging_generator,
    zip_with_a_shorter_range_after,
    zip_with_a_shorter_range_before,
    filter_of_a_logging_generator,
    unpacking_runs_the_body_to_its_end,
    next_with_a_default_at_the_end,
    dict_comprehension_over_a_logging_generator,
    join_of_a_logging_generator_expression,
    max_and_sorted_of_logging_generators,
    generator_abandoned_by_an_exception,
    body_mutates_a_view_of_the_consumer_tensor,
    map_of_a_logging_function_over_a_list,
    filter_with_a_logging_predicate_over_a_list,
    map_of_a_tensor_op_the_consumer_mutates_between,
    pairwise_of_a_logging_generator,
    zip_longest_of_logging_generators,
    accumulate_with_a_logging_function,
    zip_of_user_iterators_with_logging_next,
    loop_over_a_user_iterator_with_logging_next,
    list_extended_by_a_generator_that_reads_it,
    groupby_of_a_logging_generator,
    groupby_with_a_logging_key_over_a_list,
]


def _call(fn: Callable[..., Any]) -> tuple[Any, list, torch.Tensor]:
    x = X.clone()
    log: list = []
    result = fn(x, log)
    return result, log, x


def _check(fn: Callable[..., Any], compiled: Callable[..., Any]) -> None:
    expected, eager_log, eager_x = _call(fn)
    for _ in range(2):  # the first call captures, the second runs what was cached
        got, log, x = _call(compiled)
        same(got, expected)
        assert log == eager_log, f"side effects {log} != eager's {eager_log}"
        same(x, eager_x, "the argument after the call")


def _torch_traces_whole(fn: Callable[..., Any]) -> bool:
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="eager", fullgraph=True)(*_call_args())
    except Exception:
        return False
    finally:
        torch._dynamo.reset()
    return True


def _call_args() -> tuple[torch.Tensor, list]:
    return X.clone(), []


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_side_effects_in_eager_order(fn: Callable[..., Any]) -> None:
    kiln.reset()
    _check(fn, kiln.compile(fn, backend="eager"))
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_side_effects_in_eager_order_fullgraph(fn: Callable[..., Any]) -> None:
    kiln.reset()
    if not _torch_traces_whole(fn):
        with contextlib.suppress(kiln.errors.GraphBreakError):
            _check(fn, kiln.compile(fn, backend="eager", fullgraph=True))
        return
    _check(fn, kiln.compile(fn, backend="eager", fullgraph=True))


@pytest.mark.cpp
@pytest.mark.parametrize("fn", [produce_consume, body_mutates_a_tensor_the_consumer_reads,
                                consumer_mutates_a_tensor_the_body_reads, zip_of_two_logging_generators],
                         ids=lambda f: f.__name__)
def test_side_effects_in_eager_order_default_backend(fn: Callable[..., Any]) -> None:
    kiln.reset()
    _check(fn, kiln.compile(fn))


# ------------------------------------------------------------------ printing, and graph breaks

def _printing(x):
    for i in range(2):
        print("produce", i)
        yield x + i


def print_interleaved(x):
    out = []
    for v in _printing(x):
        print("consume")
        out.append(v)
    return out


@pytest.mark.parametrize("fullgraph", [False, True])
def test_print_in_the_body_and_the_consumer_in_eager_order(fullgraph: bool) -> None:
    eager_out = io.StringIO()
    with contextlib.redirect_stdout(eager_out):
        expected = print_interleaved(X.clone())
    kiln.reset()
    compiled = kiln.compile(print_interleaved, backend="eager", fullgraph=fullgraph)
    for _ in range(2):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                got = compiled(X.clone())
        except kiln.errors.GraphBreakError:
            assert fullgraph
            return
        same(got, expected)
        assert out.getvalue() == eager_out.getvalue()


def logging_generator_live_across_a_graph_break(x, log):
    out = []
    for v in _produce(x, log):
        if v.sum() > 0:  # a data-dependent branch: a graph break with the generator live
            log.append("positive")
        log.append("consume")
        out.append(v + 1)
    return out


def pure_generator_live_across_a_graph_break(x, log):
    def scaled():
        for i in range(3):
            yield x * i
    out = []
    for v in scaled():
        if v.sum() > 0:  # a data-dependent branch: a graph break with the generator live
            log.append("positive")
        log.append("consume")
        out.append(v + 1)
    return out


@pytest.mark.parametrize("fn", [logging_generator_live_across_a_graph_break,
                                pure_generator_live_across_a_graph_break], ids=lambda f: f.__name__)
def test_generator_live_across_a_graph_break(fn: Callable[..., Any]) -> None:
    kiln.reset()
    _check(fn, kiln.compile(fn, backend="eager"))


def test_a_list_argument_the_consumer_grows_is_read_by_the_body_as_it_grows() -> None:
    def gen(items):
        i = 0
        while i < len(items):
            yield items[i]
            i += 1

    def f(x, items):
        out = x * 0
        for v in gen(items):
            if v < 3:
                items.append(v + 1)
            out = out + v
        return out

    expected_items = [0]
    expected = f(X.clone(), expected_items)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for _ in range(2):
        items = [0]
        same(compiled(X.clone(), items), expected)
        assert items == expected_items


@pytest.mark.parametrize("initial", [None, 10])
def test_accumulate_starts_from_initial(initial: Any) -> None:
    def f(x):
        totals = list(itertools.accumulate([1, 2, 3], initial=initial))
        products = list(itertools.accumulate([x, x + 1], lambda a, b: a * b, initial=x * 0 + 2))
        return totals, products, list(itertools.accumulate([]))
    kiln.reset()
    for fullgraph in (False, True):
        same(kiln.compile(f, backend="eager", fullgraph=fullgraph)(X.clone()), f(X.clone()))


def test_groupby_groups_read_as_eager_reads_them() -> None:
    def f(x):
        data = [1, 1, 2, 3, 3, 3, 1]
        whole = [(k, list(g)) for k, g in itertools.groupby(data)]
        stale = [(k, list(g)) for k, g in list(itertools.groupby(data))]  # groups read after the outer moved on
        it = itertools.groupby(data)
        k1, g1 = next(it)
        first = next(g1)
        k2, g2 = next(it)
        return x + 1, whole, stale, (k1, first, k2, list(g2), list(g1)), list(itertools.groupby([]))
    kiln.reset()
    same(kiln.compile(f, backend="eager", fullgraph=True)(X.clone()), f(X.clone()))


def test_zip_longest_and_pairwise_of_plain_lists() -> None:
    def f(x):
        rows = list(itertools.zip_longest([x, x + 1, x + 2], (1,), [], fillvalue=-1))
        return rows, list(itertools.pairwise([x, x * 2, x * 3])), list(itertools.pairwise([x]))
    kiln.reset()
    same(kiln.compile(f, backend="eager", fullgraph=True)(X.clone()), f(X.clone()))


# ------------------------------------- a generator dropped while paused inside try/finally or with

def _with_finally(x, log):
    try:
        for i in range(3):
            log.append(f"p{i}")
            yield x * i
    finally:
        log.append("finally")


def loop_left_early_runs_the_finally_at_once(x, log):
    for v in _with_finally(x, log):
        log.append("consume")
        break
    log.append("after the loop")
    return v


def next_of_a_temporary_runs_the_finally_at_once(x, log):
    v = next(_with_finally(x, log))
    log.append("after next")
    return v


def generator_held_in_a_local_closed_at_return(x, log):
    g = _with_finally(x, log)
    v = next(g)
    log.append("held")
    return v


def loop_over_a_generator_with_finally_to_its_end(x, log):
    return [v + 1 for v in _with_finally(x, log)]


@pytest.mark.parametrize("fn", [loop_left_early_runs_the_finally_at_once, next_of_a_temporary_runs_the_finally_at_once,
                                generator_held_in_a_local_closed_at_return,
                                loop_over_a_generator_with_finally_to_its_end], ids=lambda f: f.__name__)
def test_cleanup_of_a_dropped_generator_in_eager_order(fn: Callable[..., Any]) -> None:
    # when eager drops the generator cannot be told from the trace: the frame runs eagerly (or,
    # run to its end, the finally ran in the trace)
    kiln.reset()
    _check(fn, kiln.compile(fn, backend="eager"))
    kiln.reset()
    try:
        _check(fn, kiln.compile(fn, backend="eager", fullgraph=True))
    except kiln.errors.GraphBreakError as exc:
        assert "left paused inside a try/finally" in str(exc)
        assert fn is not loop_over_a_generator_with_finally_to_its_end
