"""Small programs mixing tensors with builtins and the standard library (itertools, functools,
operator, collections, dataclasses, enum, math, str formatting, heapq, bisect, copy, random), run by
tests/capture/test_dynbuiltins_programs.py. Each module's PROGS lists (name, fn, make_args[, calls,
reset]): make_args() or make_args(i) gives fresh arguments for call i; reset() puts back the state
the program reads from outside (a global container, the random module's seed)."""
