"""The tracked values of capture, one kind a file: constants, tensors, symbolic numbers, sequences,
dicts and sets, slices, iterators, functions and cells, builtins, torch functions, nn.Modules, other
Python objects, grad-mode managers; `builder.wrap_value` decides which kind an outside value becomes.
Each kind answers the tracer's questions at trace time and rebuilds its value for the glue.
Corresponds to torch/_dynamo/variables/.
"""
