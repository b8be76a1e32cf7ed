"""Example programs that Kiln compiles: a small GPT (examples.gpt) and the guided tour of
`make demo` (examples.demo). They are user code, written the way people write PyTorch models;
nothing in them knows about Kiln except the demo that drives it.
"""
