"""Corpus: numpy interop (numpy functions on arrays made from tensors and back, numpy constants,
np.finfo/iinfo/dtype, *_like, fft, meshgrid, ndarray attributes) and Python's random module
(seeded in the frame and outside it).

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from .program import Program, case, fn_program, t


@case("numpy", fullgraph=False)
def numpy_constants_and_scalars():
    def f(x):
        return x * np.pi + np.float32(2.0), int(np.int64(3) + 1)
    return fn_program(f, (t(2),))


@case("numpy")
def numpy_finfo_iinfo():
    def f(x):
        return x + np.iinfo(np.int16).max, x.clamp(min=np.finfo(np.float32).min), float(np.finfo(np.float64).eps)
    return fn_program(f, (t(2),))


@case("numpy")
def numpy_dtype_object():
    def f(x):
        dt = np.dtype("float32")
        return x + dt.itemsize, dt.name
    return fn_program(f, (t(2),))


@case("numpy")
def numpy_functions_on_tensor_arrays():
    def f(x):
        a = x.numpy()
        b = np.exp(a) + np.sum(a, axis=0)
        return torch.from_numpy(b)
    return fn_program(f, (t(2, 3),))


@case("numpy")
def numpy_ones_like_and_zeros_like():
    def f(x):
        a = x.numpy()
        return torch.from_numpy(np.ones_like(a) + np.zeros_like(a) * 3 + np.full_like(a, 2.0))
    return fn_program(f, (t(3),))


@case("numpy")
def numpy_fft_round_trip():
    def f(x):
        spectrum = np.fft.fft(x.numpy())
        return torch.from_numpy(np.fft.ifft(spectrum).real)
    return fn_program(f, (t(8, dtype=torch.float64),))


@case("numpy")
def numpy_meshgrid():
    def f(x, y):
        gx, gy = np.meshgrid(x.numpy(), y.numpy())
        return torch.from_numpy(gx * gy)
    return fn_program(f, (t(3), t(2)))


@case("numpy", fullgraph=False)
def ndarray_attributes_shape_strides():
    def f(x):
        a = x.numpy()
        return x + a.shape[0], a.ndim, a.size, a.strides, a.dtype.itemsize
    return fn_program(f, (t(2, 3),))


@case("numpy")
def numpy_array_input_converted():
    def f(x, arr):
        return x + torch.from_numpy(arr), torch.as_tensor(arr).sum()
    return fn_program(f, (t(3), np.arange(3, dtype=np.float32)))


@case("numpy")
def numpy_reductions_and_where():
    def f(x):
        a = x.numpy()
        return torch.from_numpy(np.where(a > 0, a, 0.0)), torch.from_numpy(np.mean(a, axis=1))
    return fn_program(f, (t(2, 3),))


@case("numpy")
def numpy_random_under_seed():
    def f(x):
        np.random.seed(1)
        noise = np.random.rand(2).astype(np.float32)
        return x + torch.from_numpy(noise)
    return fn_program(f, (t(2),))


@case("numpy")
def numpy_concatenate_stack_reshape():
    def f(x, y):
        a, b = x.numpy(), y.numpy()
        both = np.concatenate([a, b]).reshape(2, -1)
        return torch.from_numpy(np.stack([both, both * 2], axis=0))
    return fn_program(f, (t(4), t(4)))


@case("numpy")
def numpy_matmul_and_transpose():
    def f(x):
        a = x.numpy()
        return torch.from_numpy(a @ a.T), torch.from_numpy(np.transpose(a))
    return fn_program(f, (t(2, 3),))


@case("numpy")
def tensor_numpy_method_and_back():
    def f(x):
        arr = (x * 2).numpy()
        return torch.tensor(arr) + 1
    return fn_program(f, (t(3),))


@case("random", fullgraph=False)
def python_random_seeded_in_frame():
    def f(x):
        random.seed(7)
        return x * random.random(), random.randint(1, 10), random.uniform(0, 1)
    return fn_program(f, (t(2),))


@case("random", fullgraph=False)
def python_random_without_seed_in_frame():
    def f(x):
        return x + random.random()
    return Program(f, ((t(2),), (t(2),)))


@case("random", fullgraph=False)
def python_random_choice_and_shuffle():
    def f(x):
        rng = random.Random(3)
        items = [1, 2, 3, 4]
        rng.shuffle(items)
        return x * rng.choice(items), items
    return fn_program(f, (t(2),))


@case("random", fullgraph=False)
def random_state_continues_after_frame():
    def f(x):
        return x * random.random()

    def drive(compiled):
        first = compiled(torch.ones(2))
        after = random.random()
        return first, after
    return Program(f, drive=drive)


@case("random", fullgraph=False)
def torch_rand_reproducible_with_generator():
    def f(x):
        g = torch.Generator().manual_seed(5)
        return x + torch.rand(2, generator=g)
    return fn_program(f, (t(2),))


@case("random", fullgraph=False)
def math_random_combination():
    def f(x):
        random.seed(11)
        angle = random.random() * math.tau
        return x * math.cos(angle)
    return fn_program(f, (t(2),))


# held-out probes (probec): numpy_random

@case("numpy_random")
def numpy_scalar_arg_probec():
    def f(x, s):
        return x * s, x + np.float32(2.0)
    return fn_program(f, (t(3), np.float64(1.5)), (t(3), np.float64(2.5)))


@case("numpy_random")
def numpy_input_from_numpy_probec():
    def f(a, x):
        return torch.from_numpy(a) + x
    return fn_program(f, (np.arange(3, dtype=np.float32), t(3)), (np.ones(3, dtype=np.float32), t(3)))


@case("numpy_random", fullgraph=False)
def process_setter_threads_probec():
    # a process setter in the frame runs on every call (it ran once at trace time, then was dropped)
    saved = torch.get_num_threads()

    def f(x):
        torch.set_num_threads(1)
        n = torch.get_num_threads()
        torch.set_num_threads(saved)
        return x * n
    return fn_program(f, (t(2),), (t(2),))


@case("numpy_random", fullgraph=False)
def get_set_rng_state_probec():
    def f(x):
        s = torch.get_rng_state()
        a = torch.rand(2)
        torch.set_rng_state(s)
        b = torch.rand(2)
        return x + a - b
    return fn_program(f, (t(2),))
