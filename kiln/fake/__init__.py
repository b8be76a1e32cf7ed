"""kiln.fake: tensors with shape, dtype, device and strides but no storage, and the mode making them.

Capture and AOT autograd run every op of a model on these; see docs/seams.md for the contract.
`FakeTensorMode` is usable standalone: inside `with FakeTensorMode():` factories, module
construction and ops all produce `FakeTensor`s and no kernel runs.
PyTorch counterpart: torch._subclasses.fake_tensor.
"""
from kiln.fake import cache
from kiln.fake.impls import register_fake_impl
from kiln.fake.mode import FakeTensorMode
from kiln.fake.tensor import FakeTensor, is_fake, mode_of

__all__ = ["FakeTensor", "FakeTensorMode", "is_fake", "mode_of", "register_fake_impl"]
