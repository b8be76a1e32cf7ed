import torch
from harness import case, fn_program, t, Program, kw
from pk import drv

def T(*s, **k):
    return t(*s, **k)

@case("tv")
def tv_slice_offset_out():
    return drv(lambda x: x[1:], T(6))

@case("tv")
def tv_col_select_out():
    return drv(lambda x: x[:, 2], T(3, 4))

@case("tv")
def tv_narrow_out():
    return drv(lambda x: x.narrow(1, 1, 2), T(3, 4))

@case("tv")
def tv_unfold_out():
    return drv(lambda x: x.unfold(0, 3, 2), T(9))

@case("tv")
def tv_unfold_compute():
    return drv(lambda x: x.unfold(0, 3, 2).sum(1) * 2, T(9))

@case("tv")
def tv_diagonal_offset_out():
    return drv(lambda x: x.diagonal(1), T(4, 4))

@case("tv")
def tv_diagonal_compute():
    return drv(lambda x: x.diagonal(-1) + 1, T(4, 5))

@case("tv")
def tv_as_strided_offset_out():
    return drv(lambda x: x.as_strided((2, 3), (3, 1), 2), T(12))

@case("tv")
def tv_as_strided_offset_compute():
    return drv(lambda x: x.as_strided((2, 3), (1, 2), 3) * 3, T(12))

@case("tv")
def tv_expand_out():
    return drv(lambda x: x.expand(3, 4), T(1, 4))

@case("tv")
def tv_expand_compute_add():
    return drv(lambda x, y: x.expand(3, 4) + y, T(4), T(3, 4))

@case("tv")
def tv_t_out():
    return drv(lambda x: x.t(), T(3, 4))

@case("tv")
def tv_t_compute():
    return drv(lambda x: x.t() * 2, T(3, 4))

@case("tv")
def tv_permute_compute():
    return drv(lambda x: x.permute(2, 0, 1) + 1, T(2, 3, 4))

@case("tv")
def tv_transpose_out_and_compute():
    return drv(lambda x: (x.transpose(0, 1), x.transpose(0, 1).sin()), T(3, 4))

@case("tv")
def tv_input_is_offset_view():
    x = T(10)
    return drv(lambda a: a * 2 + 1, x[3:7])

@case("tv")
def tv_input_is_transposed():
    x = T(4, 3)
    return drv(lambda a: a.sum(0) + a[0], x.t())

@case("tv")
def tv_input_is_diag_view():
    x = T(4, 4)
    return drv(lambda a: a.exp(), x.diagonal())

@case("tv")
def tv_input_is_expanded():
    x = T(1, 5)
    return drv(lambda a: a.cumsum(0), x.expand(3, 5))

@case("tv")
def tv_input_col_view_mutated():
    x = T(3, 4)
    return drv(lambda a: a.mul_(2), x[:, 1])

@case("tv")
def tv_input_offset_view_inplace_return_none():
    base = T(10)
    def f(a):
        a.add_(1)
    return drv(f, base[2:6])

@case("tv")
def tv_inplace_view_of_view_input():
    def f(x):
        v = x[1:].t()[1:]
        v.mul_(10)
        return x
    return drv(f, T(4, 3))

@case("tv")
def tv_overlapping_views_inplace():
    def f(x):
        a = x[0:4]
        b = x[2:6]
        a.add_(1)
        b.mul_(2)
        return a + b
    return drv(f, T(8))

@case("tv")
def tv_index_put_into_slice():
    def f(x, v):
        x[1:].index_put_((torch.tensor([0, 2]),), v)
        return x
    return drv(f, T(5, 2), T(2, 2))

@case("tv")
def tv_index_put_accumulate_slice():
    def f(x, v):
        x[:, 1].index_put_((torch.tensor([0, 0, 2]),), v, accumulate=True)
        return x
    return drv(f, T(3, 3), T(3))

@case("tv")
def tv_scatter_into_col():
    def f(x, s):
        x[:, 1:].scatter_(1, torch.tensor([[0], [1], [0]]), s)
        return x.sum()
    return drv(f, T(3, 3), T(3, 1))

@case("tv")
def tv_scatter_add_into_slice():
    def f(x, s):
        x[1:].scatter_add_(0, torch.tensor([[0, 1], [1, 0]]), s)
        return x
    return drv(f, T(3, 2), T(2, 2))

@case("tv")
def tv_masked_fill_slice():
    def f(x):
        x[:, ::2].masked_fill_(x[:, ::2] > 0, -1.0)
        return x
    return drv(f, T(3, 4))

@case("tv")
def tv_copy_into_slice():
    def f(x, y):
        x[1:3].copy_(y)
        return x * 1
    return drv(f, T(4, 3), T(3))

@case("tv")
def tv_copy_into_transposed():
    def f(x, y):
        x.t().copy_(y)
        return x
    return drv(f, T(3, 2), T(2, 3))

@case("tv")
def tv_copy_dtype_into_slice():
    def f(x, y):
        x[::2].copy_(y)
        return x
    return drv(f, T(6), torch.arange(3))

@case("tv")
def tv_out_arg_add():
    def f(x, y, o):
        torch.add(x, y, out=o)
        return o
    return drv(f, T(3), T(3), torch.empty(3))

@case("tv")
def tv_out_arg_slice():
    def f(x, o):
        torch.mul(x, 2, out=o[1:])
        return o
    return drv(f, T(3), torch.zeros(4))

@case("tv")
def tv_out_arg_resize():
    def f(x, o):
        torch.sin(x, out=o)
        return o
    return drv(f, T(2, 3), torch.empty(0))

@case("tv")
def tv_out_arg_mm():
    def f(a, b, o):
        torch.mm(a, b, out=o)
        return o.sum()
    return drv(f, T(2, 3), T(3, 4), torch.empty(2, 4))

@case("tv")
def tv_resize_local():
    def f(x):
        y = x.clone()
        y.resize_(2, 2)
        return y
    return drv(f, T(8))

@case("tv")
def tv_resize_input():
    def f(x):
        x.resize_(2, 3)
        return x.sum(0)
    return drv(f, T(6))

@case("tv")
def tv_set_input():
    def f(x, y):
        x.set_(y)
        return x + 1
    return drv(f, T(3), T(4))

@case("tv")
def tv_inputs_alias_each_other():
    base = T(6)
    def f(a, b):
        a.add_(1)
        return a + b
    return drv(f, base[:4], base[2:])

@case("tv")
def tv_same_input_twice():
    x = T(4)
    def f(a, b):
        a.mul_(2)
        return b + 1
    return drv(f, x, x)

@case("tv")
def tv_aliasing_inputs_same_view():
    base = T(3, 3)
    def f(a, b):
        b.zero_()
        return a.sum()
    return drv(f, base, base[1])

@case("tv")
def tv_output_is_input():
    return drv(lambda x: x, T(3))

@case("tv")
def tv_output_is_input_inplace():
    return drv(lambda x: x.add_(1), T(3))

@case("tv")
def tv_output_view_of_inplace_input():
    def f(x):
        x.mul_(3)
        return x.view(2, 2), x[1:]
    return drv(f, T(4))

@case("tv")
def tv_two_outputs_same_base():
    def f(x):
        y = x * 2
        return y[0], y[1], y
    return drv(f, T(2, 3))

@case("tv")
def tv_output_view_of_intermediate_then_mutated():
    def f(x):
        y = x + 1
        v = y[1:]
        y.mul_(2)
        return v
    return drv(f, T(4))

@case("tv")
def tv_output_reshape_of_input():
    return drv(lambda x: x.reshape(6), T(2, 3))

@case("tv")
def tv_output_reshape_noncontig_input():
    return drv(lambda x: x.t().reshape(6), T(2, 3))

@case("tv")
def tv_output_unsqueeze_view():
    return drv(lambda x: x.unsqueeze(1)[:, :, None], T(3))

@case("tv")
def tv_output_view_dtype():
    return drv(lambda x: x.view(torch.int32), T(4))

@case("tv")
def tv_output_real_view_complex():
    return drv(lambda x: torch.view_as_real(x), torch.randn(3, dtype=torch.complex64))

@case("tv")
def tv_output_view_as_complex():
    return drv(lambda x: torch.view_as_complex(x) * 2, T(3, 2))

@case("tv")
def tv_channels_last_input():
    x = T(2, 3, 4, 5).to(memory_format=torch.channels_last)
    return drv(lambda a: a * 2 + 1, x)

@case("tv")
def tv_channels_last_noncontig_input():
    x = T(2, 3, 4, 6).to(memory_format=torch.channels_last)[..., ::2]
    return drv(lambda a: a.relu() + a.mean(1, keepdim=True), x)

@case("tv")
def tv_channels_last_conv():
    w = T(4, 3, 3, 3)
    x = T(1, 3, 6, 6).to(memory_format=torch.channels_last)
    return drv(lambda a, w: torch.nn.functional.conv2d(a, w, padding=1), x, w)

@case("tv")
def tv_permuted_input_inplace():
    x = T(2, 3, 4).permute(2, 0, 1)
    return drv(lambda a: a.add_(a[0]), x)

@case("tv")
def tv_inplace_on_expanded_raises():
    def f(x):
        y = x.expand(3, 3)
        y.add_(1)
        return y
    return drv(f, T(1, 3))

@case("tv")
def tv_inplace_overlapping_self_read():
    def f(x):
        x[1:].add_(x[:-1])
        return x
    return drv(f, T(5))

@case("tv")
def tv_detach_inplace_shares():
    def f(x):
        d = x.detach()
        d.mul_(2)
        return x + 0
    return drv(f, T(3))

@case("tv")
def tv_unbind_outputs():
    return drv(lambda x: x.unbind(1), T(2, 3))

@case("tv")
def tv_split_outputs():
    return drv(lambda x: x.split(2), T(5, 2))

@case("tv")
def tv_chunk_outputs_compute():
    return drv(lambda x: [c * 2 for c in x.chunk(3, 1)], T(2, 6))

@case("tv")
def tv_squeeze_input_mut():
    x = T(3, 1)
    def f(a):
        a.squeeze(1).add_(5)
        return a
    return drv(f, x)

@case("tv")
def tv_index_select_out_stride():
    return drv(lambda x: x.t().index_select(0, torch.tensor([2, 0])), T(3, 4))

@case("tv")
def tv_clone_preserve_format():
    x = T(2, 3, 4, 5).to(memory_format=torch.channels_last)
    return drv(lambda a: a.clone(), x)

@case("tv")
def tv_contiguous_of_t():
    return drv(lambda x: x.t().contiguous(), T(3, 4))

@case("tv")
def tv_empty_like_t_strides():
    def f(x):
        y = torch.empty_like(x.t())
        y.fill_(1)
        return y
    return drv(f, T(3, 4))

@case("tv")
def tv_zeros_like_permuted():
    return drv(lambda x: torch.zeros_like(x) + x, T(2, 3, 4).permute(1, 2, 0))

@case("tv")
def tv_fill_diag_input():
    def f(x):
        x.fill_diagonal_(0.0)
        return x
    return drv(f, T(3, 3))

@case("tv")
def tv_setitem_int_slice():
    def f(x):
        x[1, 1:3] = 5.0
        return x
    return drv(f, T(3, 4))

@case("tv")
def tv_setitem_tensor_on_view():
    def f(x, v):
        y = x.view(2, 6)
        y[:, ::3] = v
        return x
    return drv(f, T(12), T(2, 2))

@case("tv")
def tv_setitem_ellipsis():
    def f(x):
        x[..., 0] = x[..., 1]
        return x
    return drv(f, T(2, 3))

@case("tv")
def tv_view_input_then_out_view():
    x = T(10)
    def f(a):
        a.add_(1)
        return a[1:3]
    return drv(f, x[2:8])

@case("tv")
def tv_as_strided_input_overlap():
    x = T(6)
    return drv(lambda a: a * 1, x.as_strided((3, 3), (1, 1)))

@case("tv")
def tv_as_strided_scatter():
    def f(x, s):
        return torch.as_strided_scatter(x, s, (2, 2), (1, 2), 1)
    return drv(f, T(8), T(2, 2))

@case("tv")
def tv_select_scatter_slice_scatter():
    def f(x, s):
        return torch.slice_scatter(x, s, 1, 1, 3) , torch.select_scatter(x, s[:, 0], 1, 0)
    return drv(f, T(3, 4), T(3, 2))

@case("tv")
def tv_diagonal_scatter():
    return drv(lambda x, s: torch.diagonal_scatter(x, s, 1), T(3, 3), T(2))

@case("tv")
def tv_index_copy_inplace():
    def f(x, s):
        x.index_copy_(0, torch.tensor([2, 0]), s)
        return x
    return drv(f, T(3, 2), T(2, 2))

@case("tv")
def tv_index_fill_view():
    def f(x):
        x.t().index_fill_(0, torch.tensor([1]), -3.0)
        return x
    return drv(f, T(3, 3))

@case("tv")
def tv_masked_scatter():
    def f(x, s):
        x.masked_scatter_(x > 0, s)
        return x
    return drv(f, T(6), T(6))

@case("tv")
def tv_put_take():
    def f(x):
        y = x.clone()
        y.put_(torch.tensor([0, 5]), torch.tensor([9.0, 8.0]))
        return y, x.take(torch.tensor([1, 4]))
    return drv(f, T(2, 3))

@case("tv")
def tv_mutation_then_return_input_alias_twice():
    def f(x):
        x.sub_(1)
        return x, x
    return drv(f, T(3))

@case("tv")
def tv_inplace_returns_view_result():
    def f(x):
        return x[1:].mul_(2)
    return drv(f, T(4))

@case("tv")
def tv_transpose_inplace_method():
    def f(x):
        y = x.clone()
        y.t_()
        return y
    return drv(f, T(2, 3))

@case("tv")
def tv_unsqueeze_inplace_input():
    def f(x):
        x.unsqueeze_(0)
        return x * 2
    return drv(f, T(3))

@case("tv")
def tv_squeeze_inplace_input_return():
    def f(x):
        x.squeeze_()
        return x
    return drv(f, T(3, 1))

@case("tv")
def tv_swapdims_inplace_input():
    def f(x):
        x.swapdims_(0, 1)
        return x.sum(1)
    return drv(f, T(2, 3))

@case("tv")
def tv_zero_size_slice_out():
    return drv(lambda x: x[3:3] * 2, T(5))

@case("tv")
def tv_neg_step_flip():
    return drv(lambda x: x.flip(0)[1:], T(5))

@case("tv")
def tv_roll_offset_input():
    return drv(lambda x: x.roll(1, 0), T(8)[2:])

@case("tv")
def tv_movedim_output():
    return drv(lambda x: x.movedim(0, -1), T(2, 3, 4))

@case("tv")
def tv_mutate_input_via_view_and_return_base_grad():
    def f(x, w):
        y = x * 1
        y[0].mul_(w)
        return y
    return drv(f, T(2, 3, requires_grad=True), T(3, requires_grad=True), grad=True)

@case("tv")
def tv_input_view_requires_grad():
    base = T(6, requires_grad=True)
    def f(a):
        return a * a
    return drv(f, base[1:4], grad=True)

@case("tv")
def tv_inplace_on_nonleaf_view_grad():
    def f(x):
        y = x.clone()
        y[1:].mul_(3)
        return y
    return drv(f, T(4, requires_grad=True), grad=True)

@case("tv")
def tv_out_alias_input_grad():
    def f(x):
        return x.view(2, 2), x * 2
    return drv(f, T(4, requires_grad=True), grad=True)

@case("tv")
def tv_out_t_grad():
    return drv(lambda x: x.t(), T(2, 3, requires_grad=True), grad=True)

@case("tv")
def tv_expand_grad():
    return drv(lambda x: x.expand(3, 2) * torch.arange(6.).view(3, 2), T(1, 2, requires_grad=True), grad=True)

@case("tv")
def tv_inplace_on_leaf_view_errors():
    def f(x):
        x[0].add_(1)
        return x
    return drv(f, T(3, requires_grad=True))

@case("tv")
def tv_data_mutation():
    def f(x):
        x.data.mul_(2)
        return x * 1
    return drv(f, T(3, requires_grad=True), grad=True)

@case("tv")
def tv_data_assign():
    def f(x, y):
        x.data = y
        return x + 1
    return drv(f, T(3, requires_grad=True), T(3))
