"""A corpus of small programs in the style of PyTorch's own TorchDynamo tests, written for Kiln.

Each module holds the cases of one category (containers, closures, functools, classes, nn.Module
rules, hooks, context managers, exceptions, generators, recompiles, graph breaks, torch API forms,
numpy and random); importing the package registers them all in `CASES`. The oracle
(corpus/oracle.py) judges Kiln against eager and the real torch.compile; the runner is
tests/capture/test_dynamo_style_corpus.py and `python -m tests.capture.corpus.report` prints the table.
"""
from . import (  # noqa: F401  (each import registers its module's cases)
    builtins_cases,
    class_construction,
    classes,
    closures,
    containers,
    context_managers,
    dicts,
    exceptions,
    functools_cases,
    generators,
    graph_breaks,
    hooks,
    iteration,
    module_trees,
    modules,
    object_protocol_cases,
    numpy_random,
    recompiles,
    sets_and_deques,
    shapes_numerics,
    strings,
    tensor_state,
    torch_api,
    views_aliasing,
)
from .oracle import Outcome, judge
from .program import CASES, Case

__all__ = ["CASES", "Case", "Outcome", "judge"]
