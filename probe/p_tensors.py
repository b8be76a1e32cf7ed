import torch
import numpy as np
from harness import case, fn_program, t, Program, kw

@case("views")
def v_inplace_on_offset_slice():
    def f(x):
        y = x[2:5]
        y.mul_(2)
        return x, y
    return fn_program(f, (t(8),))

@case("views")
def v_inplace_on_strided_view_of_input():
    def f(x):
        x[::2].add_(10)
        return x.sum()
    return fn_program(f, (t(7),), observe=None)

@case("views")
def v_inplace_on_transposed_narrow():
    def f(x):
        v = x.t().narrow(0, 1, 2)
        v.zero_()
        return x
    return fn_program(f, (t(3, 4),))

@case("views")
def v_view_of_view_offsets_mutation():
    def f(x):
        a = x.view(4, 4)[1:]
        b = a[:, 2:]
        b.fill_(7)
        return x, a.sum()
    return fn_program(f, (t(16),))

@case("views")
def v_setitem_with_tensor_mask():
    def f(x):
        x[x > 0] = 0
        return x
    return fn_program(f, (t(6),))

@case("views")
def v_setitem_index_list():
    def f(x):
        y = x.clone()
        y[[0, 2]] = y[[1, 3]] * 2
        return y
    return fn_program(f, (t(4, 2),))

@case("views")
def v_unbind_then_inplace():
    def f(x):
        a, b = x.unbind(0)
        b.add_(a)
        return x
    return fn_program(f, (t(2, 3),))

@case("views")
def v_split_chunks_inplace():
    def f(x):
        parts = x.split([1, 2], dim=1)
        parts[1].mul_(-1)
        return x, [p.shape for p in parts]
    return fn_program(f, (t(2, 3),))

@case("views")
def v_diagonal_inplace():
    def f(x):
        x.diagonal().add_(100)
        return x
    return fn_program(f, (t(3, 3),))

@case("views")
def v_as_strided_read():
    def f(x):
        return x.as_strided((2, 2), (1, 2), 1) * 2
    return fn_program(f, (t(8),))

@case("views")
def v_expand_then_clone_then_inplace():
    def f(x):
        y = x.unsqueeze(0).expand(3, -1).clone()
        y[1] += 1
        return y, y.stride()
    return fn_program(f, (t(4),))

@case("views")
def v_input_view_returned_and_base_mutated():
    def f(x):
        v = x[1:]
        x.mul_(3)
        return v
    return fn_program(f, (t(5),))

@case("views")
def v_reshape_of_noncontiguous():
    def f(x):
        y = x.t().reshape(-1)
        return y, y.is_contiguous()
    return fn_program(f, (t(3, 2),))

@case("views")
def v_data_assignment():
    def f(x):
        y = torch.zeros(3)
        y.data = x * 2
        return y + 1
    return fn_program(f, (t(3),))

@case("views")
def v_data_inplace_no_grad_tracking():
    def f(w):
        w.data.mul_(0.5)
        return w * 2
    return fn_program(f, (t(3, requires_grad=True),))

@case("views")
def v_index_put_accumulate():
    def f(x):
        y = torch.zeros(4)
        y.index_put_((torch.tensor([0, 0, 2]),), x, accumulate=True)
        return y
    return fn_program(f, (t(3),))

@case("views")
def v_copy_into_slice_from_broadcast():
    def f(x):
        out = torch.empty(3, 4)
        out.copy_(x)
        out[:, 0] = 5
        return out
    return fn_program(f, (t(4),))

@case("views")
def v_inplace_on_squeezed_input_view():
    def f(x):
        x.squeeze(0).sub_(1)
        return x.shape
    return fn_program(f, (t(1, 3),), observe=None)

@case("views")
def v_masked_fill_inplace_view():
    def f(x):
        v = x[:, 1:]
        v.masked_fill_(v < 0, 0.0)
        return x
    return fn_program(f, (t(3, 3),))

@case("tensor_attrs")
def ta_shape_dtype_device_branch():
    def f(x):
        if x.dtype == torch.float32 and x.device.type == "cpu":
            r = x * x.shape[0]
        else:
            r = x.float()
        return r, x.ndim, x.dim(), x.numel(), x.size(-1)
    return fn_program(f, (t(3),), (t(3, dtype=torch.int64),), (t(2, 2),))

@case("tensor_attrs")
def ta_requires_grad_inplace_toggle():
    def f(x):
        y = x.detach().clone()
        y.requires_grad_()
        return y * 2, y.requires_grad, x.requires_grad
    return fn_program(f, (t(3),))

@case("tensor_attrs")
def ta_grad_attribute_read():
    def f(w):
        return w.grad * 2 if w.grad is not None else w * 0
    w = t(3, requires_grad=True)
    w.grad = torch.ones(3)
    return fn_program(f, (w,))

@case("tensor_attrs")
def ta_grad_set_in_frame():
    def f(w, g):
        w.grad = g * 2
        return w.grad.sum()
    w = t(3, requires_grad=True)
    return fn_program(f, (w, t(3)), observe=lambda: w.grad)

@case("tensor_attrs")
def ta_is_leaf_grad_fn():
    def f(x):
        y = x * 2
        return y, y.is_leaf, y.grad_fn is None, x.is_leaf
    return fn_program(f, (t(3, requires_grad=True),), (t(3),))

@case("tensor_attrs")
def ta_dtype_conversion_methods():
    def f(x):
        return x.to(torch.float16).dtype, x.half().float(), x.double().dtype, x.int(), x.bool()
    return fn_program(f, (t(3),))

@case("tensor_attrs")
def ta_type_as_and_new_ops():
    def f(x, y):
        return y.type_as(x), x.new_zeros(2, 2), x.new_ones(3).dtype, x.new_full((2,), 3.5), x.new_tensor([1, 2])
    return fn_program(f, (t(3, dtype=torch.float64), t(3, dtype=torch.int64)))

@case("tensor_attrs")
def ta_item_and_tolist():
    def f(x):
        v = x.sum().item()
        return x * 2, v > 0, x.tolist()
    return fn_program(f, (t(3),))

@case("tensor_attrs")
def ta_stride_storage_offset():
    def f(x):
        v = x[1:, ::2]
        return v.stride(), v.storage_offset(), v.is_contiguous(), v * 2
    return fn_program(f, (t(4, 6),))

@case("tensor_attrs")
def ta_size_unpack_and_view():
    def f(x):
        b, c, h = x.size()
        return x.view(b, c * h), x.shape[-2:]
    return fn_program(f, (t(2, 3, 4),), (t(3, 3, 4),))

@case("tensor_attrs")
def ta_element_size_nbytes():
    def f(x):
        return x * x.element_size(), x.nbytes
    return fn_program(f, (t(4),))

@case("tensor_attrs")
def ta_is_floating_complex():
    def f(x):
        if x.is_floating_point():
            return x.sin()
        return x + 1, x.is_complex(), torch.is_tensor(x)
    return fn_program(f, (t(3),), (t(3, dtype=torch.int32),))

@case("tensor_attrs")
def ta_T_mT_H_attrs():
    def f(x):
        return x.T + 1, x.mT.shape, x.real
    return fn_program(f, (t(2, 3),))

@case("tensor_attrs")
def ta_retain_grad_backward_in_frame():
    def f(x):
        y = x * 3
        y.retain_grad()
        y.sum().backward()
        return x.grad, y.grad
    return fn_program(f, (t(3, requires_grad=True),))

@case("tensor_attrs")
def ta_backward_outside_then_grad_compare():
    def f(x, w):
        return (x @ w).relu().sum()
    def drive(cf):
        torch.manual_seed(1)
        x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
        l = cf(x, w)
        l.backward()
        return l, w.grad
    return Program(f, drive=drive)

@case("tensor_attrs")
def ta_detach_shares_storage():
    def f(x):
        d = x.detach()
        d.add_(1)
        return x
    return fn_program(f, (t(3),))

@case("tensor_attrs")
def ta_version_counter_visible():
    def f(x):
        v0 = x._version
        x.add_(1)
        return x._version - v0
    return fn_program(f, (t(3),))

@case("tensor_attrs")
def ta_names_of_dims_via_shape_list():
    def f(x):
        dims = list(x.shape)
        dims[-1] = -1
        return x.reshape(*dims[:-1], -1)
    return fn_program(f, (t(2, 3, 2),))

@case("tensor_attrs")
def ta_int_tensor_division_semantics():
    def f(x):
        return x // 3, x / 3, x % 3, torch.div(x, 3, rounding_mode="trunc")
    return fn_program(f, (t(5, dtype=torch.int64),))

@case("tensor_attrs")
def ta_scalar_tensor_promotions():
    def f(x):
        return x + 1.5, x * torch.tensor(2.0, dtype=torch.float64), (x > 0).sum(), x.to(torch.int8) + 300
    return fn_program(f, (t(3, dtype=torch.int32),))

@case("tensor_attrs")
def ta_bool_of_single_element_tensor_branch():
    def f(x):
        if x.sum() > 0:
            return x + 1
        return x - 1
    return fn_program(f, (torch.ones(3),), (-torch.ones(3),))

@case("tensor_attrs")
def ta_len_and_iter_over_tensor():
    def f(x):
        out = []
        for row in x:
            out.append(row.sum())
        return torch.stack(out), len(x)
    return fn_program(f, (t(3, 2),))

@case("tensor_attrs")
def ta_python_scalar_from_shape_math():
    import math
    def f(x):
        n = x.shape[0]
        return x * math.sqrt(n) / math.log(n + 1), int(n / 2), n ** 2
    return fn_program(f, (t(4),), (t(9),))

@case("random")
def r_manual_seed_in_frame():
    def f(x):
        torch.manual_seed(3)
        a = torch.rand(3)
        torch.manual_seed(3)
        b = torch.rand(3)
        return x + a - b, a
    return fn_program(f, (t(3),))

@case("random")
def r_randn_like_and_dropout_train():
    def f(x):
        return torch.randn_like(x), torch.nn.functional.dropout(x, 0.5, training=True)
    return fn_program(f, (t(8),), (t(8),))

@case("random")
def r_randint_randperm():
    def f(x):
        return x[torch.randperm(x.shape[0])], torch.randint(0, 10, (4,))
    return fn_program(f, (t(5),), (t(5),))

@case("random")
def r_generator_object():
    def f(x):
        g = torch.Generator().manual_seed(7)
        return x + torch.rand(3, generator=g)
    return fn_program(f, (t(3),))

@case("random")
def r_rng_state_get_set():
    def f(x):
        s = torch.get_rng_state()
        a = torch.rand(2)
        torch.set_rng_state(s)
        b = torch.rand(2)
        return x + a + b, torch.equal(a, b)
    return fn_program(f, (t(2),))

@case("random")
def r_bernoulli_multinomial_normal_inplace():
    def f(x):
        y = torch.empty(4).normal_(0, 1)
        z = torch.empty(4).uniform_()
        return y + z + x, torch.bernoulli(torch.full((4,), 0.5))
    return fn_program(f, (t(4),), (t(4),))

@case("random")
def r_random_with_graph_break_in_between():
    def f(x):
        a = torch.rand(2)
        print("break")
        b = torch.rand(2)
        return x + a * b
    return fn_program(f, (t(2),), (t(2),))

@case("random")
def r_python_random_module():
    import random
    def f(x):
        random.seed(5)
        return x * random.random(), random.randint(0, 9)
    return fn_program(f, (t(2),))

@case("numpy")
def n_numpy_ops_on_tensor_numpy():
    def f(x):
        a = x.numpy()
        b = np.sin(a) + np.sum(a) * 2
        return torch.from_numpy(b)
    return fn_program(f, (t(3),))

@case("numpy")
def n_numpy_array_input():
    def f(a):
        return np.clip(a * 2, -1, 1).mean(), a.shape
    return fn_program(f, (np.arange(6, dtype=np.float32).reshape(2, 3),))

@case("numpy")
def n_numpy_constant_in_graph():
    W = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    def f(x):
        return x * torch.from_numpy(W), torch.as_tensor(W).sum()
    return fn_program(f, (t(3),))

@case("numpy")
def n_numpy_int_scalar_arith():
    def f(x, n):
        return x * n, x + np.float32(2.5)
    return fn_program(f, (t(2), np.int64(3)), (t(2), np.int64(4)))

@case("numpy")
def n_numpy_dtype_preserved():
    def f(x):
        a = x.numpy().astype(np.float64)
        return torch.from_numpy(a * 2)
    return fn_program(f, (t(3),))

@case("numpy")
def n_numpy_argmax_and_where():
    def f(a):
        i = np.argmax(a)
        return np.where(a > 0, a, 0), int(i)
    return fn_program(f, (np.array([1.0, -2.0, 3.0]),))

@case("numpy")
def n_tensor_from_list_of_numpy_scalars():
    def f(x):
        vals = [np.float64(1.5), np.float64(2.5)]
        return x + torch.tensor(vals)
    return fn_program(f, (t(2),))
