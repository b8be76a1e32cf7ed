"""The Dynamo-style corpus (tests/capture/corpus/): Kiln against eager and the real torch.compile.

Every case runs eagerly, through torch.compile(backend=CompileCounter) and through
kiln.compile(backend="eager") (corpus/oracle.py); torch.compile's outcome is recorded in
corpus/torch_outcomes.json for the code as it is (corpus/recorded.py), rechecked live on a fixed sample here
and on every case under `-m slow`. A case counts when torch.compile passes it: its
values and side effects equal eager's and, under fullgraph=True, it raises no graph break. Kiln
passes a counted case when its values and side effects equal eager's with no fallback warning and,
under fullgraph=True, no graph break (and, for cases marked counts=True, torch.compile's number of
graphs). Cases Kiln fails today are listed in KNOWN_FAILURES with the verdict they fail with and
run as strict xfails: a fix flips one and the table must shrink; a different verdict (a break
turned into a wrong answer) fails the test. Cases torch.compile itself fails are listed in
TORCH_FAILS and not counted, but Kiln must still give no wrong answer and no crash on them.
`PYTHONPATH=. python -m tests.capture.corpus.report` prints the whole table with the differences.
"""
from __future__ import annotations

from collections import Counter

import pytest

from corpus import CASES, judge
from corpus.oracle import BREAK, COUNT, CRASH, ERROR, PASS, WRONG, torch_outcome
from corpus.recorded import TABLE, recorded, stale_cases
from recorded_oracle import sampled

# name: (verdict, one-line reason), grouped by root cause (wrong answers first), each group headed by the
# Kiln files likely at fault.
KNOWN_FAILURES: dict[str, tuple[str, str]] = {
    # hasattr/getattr-with-default answer False when Kiln cannot trace the attribute (tracer.has_attr turns
    # Unsupported into False); PartialVariable has no func/args/keywords: kiln/capture/tracer.py,
    # kiln/capture/variables/functions.py
    # a class's __dict__ read through a guarded source (a global class) is an opaque mappingproxy:
    # `"k" in type(obj).__dict__` breaks (kiln/capture/variables/builder.py wraps only unguarded ones)
    # the absence of an attribute is not guarded (hasattr False, getattr's default): kiln/capture/tracer.py
    # (has_attr), kiln/capture/guards.py
    # len() and membership of a global or closed-over set are not guarded: kiln/capture/variables/builder.py,
    # kiln/capture/variables/dict.py (SetVariable)
    # dict views are snapshots (keys()/values()/items() give lists): kiln/capture/variables/dict.py
    # closure cells across a graph break: a rebinding or nonlocal write after the break is lost, a cell of a
    # function made in the frame is empty: kiln/capture/code.py (resume functions), kiln/capture/glue.py,
    # kiln/capture/variables/functions.py
    # nn.Module attribute lookup order (class data descriptors > instance __dict__ > class attributes >
    # _parameters/_buffers/_modules): kiln/capture/variables/module.py
    # a __call__ override is ignored (the compiled module, and a submodule inside forward): kiln/api.py,
    # kiln/capture/variables/module.py
    # the compiled-module wrapper: attribute writes, dir(), pickle, Parameter assignment, a full backward hook on
    # the top module: kiln/api.py (OptimizedModule)
    # user objects: enum members' descriptors: kiln/capture/variables/user_object.py
    # a container built before a break and popped after it: the resume's glue reads the popped item after replaying
    # the pop (a crash, or another item: a wrong answer): kiln/capture/glue.py (reconstruct of nested reads),
    # kiln/capture/side_effects.py
    # contextlib.redirect_stdout/redirect_stderr: IndexError in the glue: kiln/capture/variables/context_manager.py
    # classes: a guard on type.__name__ fails its own capture; type(name, bases, ns) in the frame; super() in a
    # classmethod chain (mro.index): kiln/capture/guards.py, kiln/capture/variables/user_object.py
    # modules: LazyLinear's first call, a ModuleList subclass with its own __getitem__, a ModuleList indexed by a
    # dynamic int, Sequential slicing, a module __getattr__ override: kiln/capture/variables/module.py,
    # kiln/capture/output_graph.py
    # torch functions' keyword forms (is_floating_point(input=...)): kiln/capture/variables/torch.py
    # tensor subclasses (__torch_function__) cannot be made fake: kiln/fake/convert.py
    "tensor_subclass_with_torch_function": (BREAK, "a tensor subclass with __torch_function__ is a clean break, not traced"),
    # collections: deque, defaultdict, dict.fromkeys, dict subclasses, user Mappings, tensors as dict/set keys, set
    # methods: kiln/capture/variables/dict.py, kiln/capture/variables/sequence.py,
    # kiln/capture/variables/user_object.py (opaque calls)
    # itertools and operator: kiln/capture/variables/builtin.py, kiln/capture/variables/iterator.py
    # builtins over values known at trace time: sorted/min/max with key, list.sort(key=), delattr, locals(),
    # sys.intern, str.join of a generator: kiln/capture/variables/builtin.py, kiln/capture/variables/sequence.py
    # user objects made in the frame: ==/is/id, dunder operators, __call__, __getattr__, total_ordering, dataclass
    # __eq__, __slots__, __dict__, a C-function property, user iterators, AttributeError caught:
    # kiln/capture/variables/user_object.py
    # functions made in the frame (__module__, __doc__ for wraps/contextmanager) and tensors in defaults:
    # kiln/capture/variables/functions.py, kiln/capture/variables/builder.py
    # grad mode and global state: no_grad() as a decorator made in the frame, torch._C._set_grad_enabled in a user
    # context manager, set_default_dtype, disable_saved_tensors_hooks: kiln/capture/variables/grad_mode.py,
    # kiln/capture/variables/torch.py
    # queries torch.compile folds to constants (distributed, backends flags, is_fx_tracing, autocast state,
    # privateuse1 name), distributions' lazy properties, x * y.item() (torch keeps it a tensor op):
    # kiln/capture/variables/torch.py, kiln/capture/variables/tensor.py
    # a module's introspection (named_buffers, state_dict) after the trace rebound one of its buffers reads
    # the real tables, which do not have the change yet: a break (kiln/capture/variables/module.py)
    "buffer_rebound_in_submodule_and_read_by_parent": (BREAK, "named_buffers() after the trace changed the module's..."),
    "tensor_item_under_fullgraph_breaks_like_torch": (BREAK, "Tensor.item() reads the tensor's data, which is no..."),
    # numpy: np.dtype, np.finfo, np.fft, np.meshgrid: kiln/capture/variables/numpy_functions.py
    # generators (yield from / SEND, send(), throw()), symbolic float methods (is_integer), tensor hooks registered
    # in the frame (a pure hook on a tensor the graph computes stays in the graph): kiln/capture/tracer.py, kiln/capture/variables/iterator.py, kiln/capture/variables/symint.py,
    # kiln/capture/variables/tensor.py
    # a generator returned from the frame: stepped (never run ahead, so its body's effects keep eager's order),
    # it cannot be rebuilt for the caller; torch.compile runs it to its end inside the frame:
    # kiln/capture/variables/generator.py
    "generator_returned_from_frame": (BREAK, "a stepped generator cannot leave the frame (its body would run ahead)"),
    # graph counts: automatic dynamic for a changed global/dict value (3 graphs, torch 2), the code object of an
    # inner function not its identity (3 vs 1), a dict value never read guarded (3 vs 1), no graph for a frame
    # without ops (1 vs 2): kiln/symbolic/policy.py, kiln/capture/guards.py, kiln/capture/entry.py
    "none_then_tensor_argument": (COUNT, "1 graphs, torch.compile made 2"),
}

# Cases the real torch.compile (torch 2.13) does not pass: not counted in the pass rate.
TORCH_FAILS: dict[str, str] = {
    "reversed_of_a_set_raises_type_error": "reversed(set) raises with another message (a sequence is required)",
    "exit_stack_manager_suppresses_the_block_error": "AttributeError from a member_descriptor inside ExitStack.__exit__",
    "lru_cache_recursive_fills_the_cache_as_eager": "the traced lru_cache body leaves the cache empty",
    "lru_cache_cleared_between_calls_refills": "the traced lru_cache body leaves the cache empty",
    "new_returning_another_type_skips_init": "a side effect of __init__ (a list append) is lost on the second call",
    "namedtuple_subclass_new_transforms_fields_and_is_returned": "_replace on the subclass returns an empty tuple",
    "getattribute_of_object_made_in_frame_runs": "constructing a class with a __getattribute__ is unsupported",
    "getattribute_super_on_object_made_in_frame": "constructing a class with a __getattribute__ is unsupported",
    "abstract_class_instantiated_raises_type_error": "object.__new__ of a user class is unsupported",
    "getattribute_transforming_input_object_guards_the_stored_value": "type.__getattribute__ is unsupported",
    "cached_property_of_input_object_counts_its_computation": "cached_property's RLock is unsupported",
    "lru_cache_body_appends_runs_on_miss_only": "an lru_cache'd body's append is replayed on cache hits",
    "lru_cache_method_and_global_counter_on_miss_only": "an lru_cache'd method's write is replayed on cache hits",
    "tuple_and_list_builtins_on_shape": "x.permute(*range(n - 1, -1, -1)) is traced as permute(2, -1, -1)",
    "str_and_repr_of_user_object": "str() of a user object made in the frame raises AttributeError in __str__",
    "exception_raised_by_torch_op_caught": "x @ y's shape error is a compile error, not the RuntimeError to catch",
    "partial_of_partial": "partial(partial(f, k=...), ...).keywords leaves the inner keywords out",
    "break_with_live_dict_view": "a keys view held across a break does not see a later insert",
    "hook_added_between_calls": "a forward hook added after the first call is not seen",
    "global_module_forward_hook": "global forward hooks fire for the OptimizedModule wrapper too",
    "range_properties_and_slicing": "`8 in range(2, 20, 3)` answers 1, not True",
    "numpy_random_under_seed": "np.random.seed inside the frame: a different stream of numbers",
    "string_format_of_float_and_int_precision": "format(0.00125, '.2%') answers '0.00125'",
    "inference_tensor_argument_queried": "tensor.is_inference() is a graph break (fullgraph=True fails)",
    "cause_assigned_then_raised": "super().__init__() of a user exception class is not traced",
    "chain_through_callee_and_back": "super().__init__() of a user exception class is not traced",
    "raise_from_non_exception_is_type_error": "`raise X from 5`: the TypeError says 'exception cause must be None or...'",
    "user_iterator_stepped_by_next_then_drained": "iter() of a user iterator object: TypeError (no len()) inside Dynamo",
    "user_iterable_returns_separate_cursor": "an __iter__ returning another user class's instance is not traced",
    "class_made_natively_takes_frame_module": "type(name, bases, ns) in the frame: __module__ is a Dynamo module's",
    "namedtuple_made_in_frame_module": "namedtuple made in the frame: __module__ is a Dynamo module's",
    "enum_made_by_functional_api_in_frame": "Enum('Level', ...) in the frame: __module__ is a Dynamo module's",
    "frame_read_in_frame_and_by_callee": "inspect.currentframe() after a break names the resume function",
    "binary_dunders_reflected_and_subclass_first": "user object * tensor: Dynamo calls Tensor's op with the object",
    "inplace_dunder_on_input_object_mutates_it": "user object += tensor: Dynamo calls Tensor's op with the object",
    "itertools_groupby_with_key_and_combinations_with_replacement": "itertools.combinations_with_replacement is not traced",
    "global_forward_hook_runs_once_around_compiled_module": "a global hook runs on the OptimizedModule wrapper too",
    "global_hook_registered_between_calls_reaches_inlined_module": "a global hook registered after the first call is skipped",
    "pre_hook_with_kwargs_added_between_calls": "a pre-hook added after the first call is not seen",
    "abc_register_between_calls_changes_isinstance": "ABC.register() after the first call is not seen by isinstance",
    "float_argument_signed_zero": "a graph traced for a float argument 0.0 is reused for -0.0",
    "is_leaf_of_leaf_nonleaf_and_detached_inputs": "x.is_leaf is not guarded: a non-leaf input reuses a leaf's graph",
}

MIN_CASES = 400
PASS_RATE_FLOOR = 0.99  # Kiln passes / cases torch.compile passes (99.19%, 614 of 619); raise it as KNOWN_FAILURES shrinks


class KilnFailsCase(Exception):
    """A case Kiln does not pass (the one exception a KNOWN_FAILURES xfail expects)."""


def _params() -> list:
    params = []
    for name in CASES:
        marks = []
        if name in KNOWN_FAILURES:
            verdict, reason = KNOWN_FAILURES[name]
            marks.append(pytest.mark.xfail(raises=KilnFailsCase, strict=True, reason=f"{verdict}: {reason}"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params())
def test_case_matches_eager_where_torch_compile_does(name: str) -> None:
    outcome = judge(CASES[name])
    known = KNOWN_FAILURES.get(name)
    if name in TORCH_FAILS:
        assert not outcome.torch_passes, f"torch.compile now passes {name}: take it off TORCH_FAILS"
        failing = outcome.kiln in (WRONG, CRASH)  # where torch fails, only these are Kiln's failures
    else:
        assert outcome.torch_passes, f"torch.compile does not pass {name} ({outcome.torch_why}): list it in TORCH_FAILS"
        failing = outcome.kiln != PASS
    if not failing:
        return
    if known is not None and known[0] != outcome.kiln:
        pytest.fail(f"{name} now fails as {outcome.kiln}, KNOWN_FAILURES says {known[0]}: {outcome.kiln_why}")
    raise KilnFailsCase(f"{outcome.kiln}: {outcome.kiln_why}")


def test_tables_name_existing_cases_and_the_pass_rate_holds() -> None:
    assert len(CASES) >= MIN_CASES, f"the corpus has {len(CASES)} cases, fewer than {MIN_CASES}"
    assert set(KNOWN_FAILURES) <= set(CASES), set(KNOWN_FAILURES) - set(CASES)
    assert set(TORCH_FAILS) <= set(CASES), set(TORCH_FAILS) - set(CASES)
    verdicts = {PASS, WRONG, ERROR, BREAK, CRASH, COUNT}
    assert all(verdict in verdicts - {PASS} for verdict, _ in KNOWN_FAILURES.values())
    for name in set(KNOWN_FAILURES) & set(TORCH_FAILS):
        assert KNOWN_FAILURES[name][0] in (WRONG, CRASH), name
    # the strict xfails keep KNOWN_FAILURES equal to what fails, so the rate follows from the tables
    counted = [name for name in CASES if name not in TORCH_FAILS]
    failing = [name for name in counted if name in KNOWN_FAILURES]
    rate = 1 - len(failing) / len(counted)
    by_verdict = Counter(KNOWN_FAILURES[name][0] for name in failing)
    by_category = Counter(CASES[name].category for name in failing)
    print(f"\nKiln passes {len(counted) - len(failing)} / {len(counted)} = {rate:.1%} of the cases torch.compile "
          f"passes ({len(CASES)} cases); failing by verdict {dict(by_verdict)}; by category {dict(by_category)}")
    assert rate >= PASS_RATE_FLOOR, f"pass rate {rate:.1%} fell below {PASS_RATE_FLOOR:.1%}"


def test_recorded_torch_outcomes_are_current() -> None:
    """Each case's torch.compile outcome is recorded for the code as it is (corpus/recorded.py)."""
    stale = stale_cases()
    assert not stale, (f"{len(stale)} corpus cases ({', '.join(stale[:5])}, ...) have no torch.compile outcome "
                       f"recorded for their code in {TABLE.path.name}: run `PYTHONPATH=. python -m "
                       f"tests.capture.corpus.report --record` and commit the table")


def _live_matches_recorded(name: str) -> None:
    case = CASES[name]
    known = recorded(case)
    if known is None:
        pytest.skip("not recorded for this code (test_recorded_torch_outcomes_are_current fails)")
    live = torch_outcome(case, live=True)
    assert (live.passes, live.graphs) == (known.passes, known.graphs), (live, known)  # `why` may name addresses


@pytest.mark.parametrize("name", sampled(CASES, 40))
def test_recorded_outcome_is_what_torch_compile_does(name: str) -> None:
    _live_matches_recorded(name)
