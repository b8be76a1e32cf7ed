"""Corpus: torch API forms: keyword arguments to torch functions (input=, other=, dim=, out=),
tensor methods and properties, torch.Size arithmetic, dtype/finfo/iinfo queries, queries
torch.compile folds to constants (distributed, backends flags, fx tracing, autocast state),
torch.distributions, tensor subclasses, in-place ops and views of inputs.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from .program import Program, case, fn_program, t

logger = logging.getLogger("kiln_corpus_library")
logger.addHandler(logging.NullHandler())
logger.propagate = False


class Tagged(torch.Tensor):
    """A plain tensor subclass that marks results of torch functions."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@case("torch_api")
def is_floating_point_keyword_input():
    def f(x):
        y = x + 1
        return torch.is_floating_point(y), torch.is_floating_point(input=y), torch.is_complex(input=y)
    return fn_program(f, (t(2),))


@case("torch_api")
def keyword_forms_of_binary_ops():
    def f(x, y):
        return torch.add(input=x, other=y, alpha=2), torch.mul(x, other=y), torch.sub(x, y, alpha=3), \
            torch.div(x, y, rounding_mode="floor")
    return fn_program(f, (t(3), t(3)))


@case("torch_api")
def keyword_forms_of_reductions():
    def f(x):
        return torch.sum(x, dim=1, keepdim=True), torch.mean(input=x, dim=(0,)), torch.amax(x, dim=-1), \
            torch.max(x, dim=0).values, torch.std(x, dim=1, unbiased=False)
    return fn_program(f, (t(3, 4),))


@case("torch_api")
def keyword_forms_of_shape_ops():
    def f(x):
        return torch.cat(tensors=[x, x], dim=0), torch.stack([x, x], dim=1), torch.reshape(x, shape=(-1,)), \
            torch.transpose(x, dim0=0, dim1=1), torch.flatten(x, start_dim=0)
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def cat_kwargs_from_dict():
    def f(x, y):
        kwargs = {"tensors": (x, y), "dim": 0}
        return torch.cat(**kwargs)
    return fn_program(f, (t(2), t(3)))


@case("torch_api")
def out_argument_to_torch_function():
    def f(x, y, out):
        torch.add(x, y, out=out)
        return out * 2
    return fn_program(f, (t(3), t(3), torch.empty(3)))


@case("torch_api")
def tensor_methods_and_properties():
    def f(x):
        return x.T, x.mT, x.ndim, x.dim(), x.ndimension(), x.numel(), x.nelement(), x.element_size(), \
            x.is_contiguous(), x.is_leaf, x.is_cuda, x.is_sparse, x.dtype, x.device, x.layout
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def tensor_type_conversions():
    def f(x):
        return x.to(torch.float64), x.double(), x.half().float(), x.long(), x.int(), x.bool(), \
            x.type(torch.float64), x.to(dtype=torch.int32), x.type(), x.new_zeros(2), x.new_ones((1, 2))
    return fn_program(f, (t(3),))


@case("torch_api")
def tensor_type_from_other_tensor():
    def f(x, y):
        m = x.to(torch.float16)
        return y.type(m.type()), y.type_as(m)
    return fn_program(f, (t(2), t(2)))


@case("torch_api")
def size_arithmetic_and_methods():
    def f(x):
        s = x.size()
        new_shape = s[:-1] + (2, 3)
        return x.view(*new_shape), s.numel(), len(s), s[-1], list(s), torch.Size([2, 3]) == (2, 3), s.count(4)
    return fn_program(f, (t(4, 6),))


@case("torch_api")
def size_index_and_comparison():
    def f(x, y):
        out = x
        if x.shape == y.shape:
            out = out + y
        if x.shape[1:] == torch.Size([3]):
            out = out * 2
        return out, x.shape.index(3)
    return fn_program(f, (t(2, 3), t(2, 3)))


@case("torch_api")
def view_and_in_place_on_input():
    def f(x):
        v = x[1:]
        v.mul_(10)
        x[0] = -1
        return x.sum()
    return fn_program(f, (t(3),))


@case("torch_api")
def view_with_storage_offset_returned():
    def f(x):
        return x[1:, 1:], x.view(-1)[2:5], x.t()[0]
    return fn_program(f, (t(3, 3),))


@case("torch_api")
def in_place_on_view_of_intermediate():
    def f(x):
        y = x * 1
        y[:, 0].fill_(0)
        y.diagonal().add_(5)
        return y
    return fn_program(f, (t(3, 3),))


@case("torch_api")
def inplace_methods_chain():
    def f(x):
        y = x.clone()
        y.add_(1).mul_(2).clamp_(min=0, max=5)
        return y
    return fn_program(f, (t(4),))


@case("torch_api")
def finfo_iinfo_and_promote_types():
    def f(x):
        big = torch.finfo(x.dtype).max
        bits = torch.iinfo(torch.int32).bits
        promoted = torch.promote_types(torch.int32, torch.float32)
        return x.clamp(max=big) + bits, promoted, torch.finfo(torch.float16).eps
    return fn_program(f, (t(2),))


@case("torch_api")
def default_dtype_query():
    def f(x):
        if x.dtype == torch.get_default_dtype():
            return x + 1
        return x - 1
    return fn_program(f, (t(2),), (t(2, dtype=torch.float64),))


@case("torch_api")
def distributed_queries_fold():
    def f(x):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return x * 0
        return x + 1
    return fn_program(f, (t(2),))


@case("torch_api")
def backend_flags_fold():
    def f(x):
        if torch.backends.cuda.matmul.allow_tf32:
            return x.sin()
        if torch.backends.cudnn.enabled:
            return x.cos()
        return x
    return fn_program(f, (t(2),))


@case("torch_api")
def fx_tracing_and_onnx_export_queries():
    def f(x):
        if torch.fx._symbolic_trace.is_fx_tracing() or torch.onnx.is_in_onnx_export():
            return x - 1
        return x + 1
    return fn_program(f, (t(2),))


@case("torch_api")
def autocast_and_privateuse1_queries():
    def f(x):
        out = x
        if not torch._C._is_any_autocast_enabled():
            out = out + 1
        if torch._C._get_privateuse1_backend_name() == "privateuseone":
            out = out * 2
        return out
    return fn_program(f, (t(2),))


@case("torch_api")
def compiler_is_compiling_query():
    def f(x):
        if torch.compiler.is_compiling():
            return x + 1
        return x + 1
    return fn_program(f, (t(2),))


@case("torch_api", fullgraph=False)
def logging_warning_from_library_code():
    def f(x):
        if x.shape[0] > 1:
            logger.warning("more than one row")
        return x * 2
    return fn_program(f, (t(3),))


@case("torch_api")
def distributions_normal_log_prob():
    def f(x):
        dist = torch.distributions.Normal(torch.zeros(2), torch.ones(2))
        return dist.log_prob(x), dist.mean, dist.stddev
    return fn_program(f, (t(2),))


@case("torch_api")
def distributions_categorical_entropy():
    def f(logits):
        dist = torch.distributions.Categorical(logits=logits)
        return dist.entropy(), dist.probs
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def tensor_subclass_with_torch_function():
    def f(x):
        return (x * 2).sum(), type(x).__name__
    return fn_program(f, (t(3).as_subclass(Tagged),))


@case("torch_api", fullgraph=False)
def tensor_subclass_made_in_frame():
    def f(x):
        y = x.as_subclass(Tagged)
        return (y + 1).as_subclass(torch.Tensor)
    return fn_program(f, (t(3),))


@case("torch_api")
def functional_ops_with_keywords():
    def f(x):
        return F.softmax(x, dim=-1), F.gelu(x, approximate="tanh"), F.pad(x, (1, 1), value=0.5), \
            F.normalize(x, p=2.0, dim=1), F.dropout(x, p=0.5, training=False)
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def functional_losses():
    def f(x, target):
        return F.mse_loss(x, target), F.cross_entropy(x, target.argmax(dim=1)), \
            F.binary_cross_entropy_with_logits(x, target.sigmoid(), reduction="sum")
    return fn_program(f, (t(3, 4), t(3, 4)))


@case("torch_api")
def factory_functions_with_dtype_and_device():
    def f(x):
        return torch.zeros(2, 3, dtype=torch.int64), torch.ones_like(x, dtype=torch.float64), \
            torch.full((2,), 3.5), torch.arange(0, 6, 2), torch.linspace(0, 1, 5), torch.eye(2), \
            torch.empty(3).fill_(1.0), torch.tensor([1, 2, 3], device=x.device), torch.zeros(x.shape)
    return fn_program(f, (t(2),))


@case("torch_api")
def tensor_from_python_list_and_range():
    def f(x):
        return x + torch.tensor([1.0, 2.0]), torch.tensor(range(3)), torch.as_tensor([[1, 2]], dtype=torch.float32)
    return fn_program(f, (t(2),))


@case("torch_api")
def indexing_forms():
    def f(x, idx):
        return x[idx], x[:, None], x[..., 0], x[1::2, -1], x[[0, 1]], x[0, [1, 2]]
    return fn_program(f, (t(3, 4), torch.tensor([0, 2])))


@case("torch_api")
def index_put_and_masked_fill():
    def f(x, mask):
        y = x.clone()
        y[mask] = 0.0
        z = x.masked_fill(~mask, -1.0)
        return y, z
    return fn_program(f, (t(4), torch.tensor([True, False, True, False])))


@case("torch_api")
def where_and_clamp_tensor_bounds():
    def f(x, low, high):
        return torch.where(x > 0, x, x * 0.1), torch.clamp(x, min=low, max=high), x.clip(-1, 1)
    return fn_program(f, (t(4), -torch.ones(4), torch.ones(4)))


@case("torch_api")
def tensor_split_chunk_unbind():
    def f(x):
        a, b = x.chunk(2)
        parts = torch.split(x, [1, 3])
        rows = x.unbind(0)
        return a + b, len(parts), parts[1], len(rows), torch.tensor_split(x, 2)
    return fn_program(f, (t(4, 2),))


@case("torch_api")
def einsum_matmul_bmm():
    def f(a, b):
        return torch.einsum("ij,jk->ik", a, b), a @ b, torch.bmm(a[None], b[None]), torch.mm(a, b)
    return fn_program(f, (t(2, 3), t(3, 2)))


@case("torch_api")
def scalar_tensor_arithmetic_with_python_numbers():
    def f(x):
        s = x.sum()
        return s * 2 + 1, 3 - s, 2 ** x, x.abs() ** 0.5, 1 / (x.abs() + 1)
    return fn_program(f, (t(3),))


@case("torch_api")
def comparison_ops_return_bool_tensors():
    def f(x, y):
        return x > y, x == y, torch.eq(x, y), x.ne(y), torch.logical_and(x > 0, y > 0), (x > 0).any(), (x > 0).all()
    return fn_program(f, (t(3), t(3)))


@case("torch_api", fullgraph=False)
def random_ops_under_manual_seed():
    def f(x):
        torch.manual_seed(3)
        return x + torch.rand(2), torch.randn_like(x), torch.randint(0, 5, (3,))
    return fn_program(f, (t(2),))


@case("torch_api", fullgraph=False)
def dropout_training_random_under_seed():
    def f(x):
        torch.manual_seed(0)
        return F.dropout(x, p=0.5, training=True)
    return fn_program(f, (torch.ones(8),))


@case("torch_api", fullgraph=False)
def requires_grad_and_detach_in_frame():
    def f(x):
        y = x * 2
        z = y.detach()
        w = torch.ones(2).requires_grad_()
        return y.requires_grad, z.requires_grad, w.requires_grad, (w * y).grad_fn is not None
    return fn_program(f, (t(2, requires_grad=True),))


@case("torch_api", fullgraph=False)
def autograd_grad_inside_frame():
    def f(x):
        x = x.detach().requires_grad_(True)
        y = (x ** 3).sum()
        (g,) = torch.autograd.grad(y, x)
        return g
    return fn_program(f, (t(3),))


@case("torch_api")
def complex_tensor_ops():
    def f(x):
        z = torch.complex(x, x * 2)
        return z.abs(), z.real, z.imag, torch.view_as_real(z), z.conj().imag
    return fn_program(f, (t(3),))


@case("torch_api")
def integer_tensor_division_and_remainder():
    def f(x):
        return x // 3, x % 3, torch.div(x, 2), torch.floor_divide(x, 2), x.float() / 2, torch.remainder(x, -3)
    return fn_program(f, (torch.tensor([-7, -2, 0, 5, 9]),))


@case("torch_api")
def sort_topk_argmax():
    def f(x):
        values, idx = torch.sort(x, descending=True)
        top = torch.topk(x, k=2)
        return values, idx, top.values, top.indices, x.argmax(), torch.argsort(x)
    return fn_program(f, (t(5),))


@case("torch_api")
def cumulative_and_scan_ops():
    def f(x):
        return x.cumsum(0), torch.cumprod(x, dim=0), torch.logcumsumexp(x, 0), x.flip(0), torch.roll(x, 1)
    return fn_program(f, (t(4),))


@case("torch_api")
def tensor_item_under_fullgraph_breaks_like_torch():
    def f(x):
        return x * x.sum().item()
    return fn_program(f, (t(3),))


@case("torch_api")
def tensor_is_checks():
    def f(x):
        out = x
        if torch.is_tensor(x) and not torch.is_complex(x) and x.is_floating_point():
            out = out + 1
        if isinstance(x.shape, tuple) and x.requires_grad is False:
            out = out * 2
        return out
    return fn_program(f, (t(2),))


@case("torch_api")
def nn_init_helpers_in_frame():
    def f(x):
        fan_in = torch.nn.init._calculate_correct_fan(x, "fan_in")
        return x + fan_in
    return fn_program(f, (t(3, 4),))


@case("torch_api")
def tensor_new_tensor_and_clone_contiguous():
    def f(x):
        y = x.t().contiguous()
        return y, y.is_contiguous(), x.new_tensor([1.0, 2.0]), x.clone(memory_format=torch.contiguous_format)
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def scatter_gather_index_select():
    def f(x, idx):
        return torch.gather(x, 1, idx), x.index_select(0, idx[:, 0]), torch.zeros(3, 3).scatter_(1, idx, 1.0)
    return fn_program(f, (t(3, 3), torch.tensor([[0], [2], [1]])))


@case("torch_api")
def dtype_attributes_and_comparisons():
    def f(x):
        out = x
        if x.dtype.is_floating_point and not x.dtype.is_complex:
            out = out + x.dtype.itemsize
        if x.dtype in (torch.float16, torch.bfloat16):
            out = out * 0
        return out, x.dtype.is_signed
    return fn_program(f, (t(2),))


@case("torch_api")
def torch_size_concatenation_keeps_size_type():
    # torch.Size's __add__ and __radd__ give a torch.Size (tuple + Size too), not a plain tuple
    def f(x):
        s = x.shape
        return (s + (1,), (4,) + s, s + s, s[1:], s * 2, s.numel(), s == torch.Size([2, 3]),
                torch.Size([s[0], 7]), s.index(3), s.count(2))
    return fn_program(f, (t(2, 3),))


# held-out probes (probec): torch_api

@case("torch_api")
def tensor_method_kw_positional_mix_probec():
    def f(x):
        return (x.transpose(0, 1), x.transpose(dim0=1, dim1=0), x.permute(1, 0), x.permute((1, 0)), x.permute(dims=[1, 0]),
                x.view(-1), x.view((3, 2)), x.reshape(shape=(6,)), x.expand(2, 2, 3), x.repeat(1, 2), x.flip(dims=(0,)),
                x.roll(1, 1), x.narrow(1, 0, 2), x.unsqueeze(dim=0), x.squeeze(), torch.squeeze(x.unsqueeze(0), dim=0))
    return fn_program(f, (t(2, 3),))


@case("torch_api")
def out_kwarg_input_buffer_probec():
    def f(x, y, out):
        torch.sin(x, out=out)
        return out + y
    return fn_program(f, (t(3), t(3), torch.zeros(3)))


@case("torch_api")
def reductions_dim_tuple_and_names_probec():
    def f(x):
        return (x.amax(dim=(0, 2)), x.amin((1,)), x.logsumexp(dim=-1), torch.prod(x, 1, keepdim=True), x.norm(dim=1),
                x.norm(p=1), torch.linalg.vector_norm(x, ord=2, dim=(1, 2)), x.all(dim=0), x.any(), x.cumsum(dim=1), x.argmax(dim=2))
    return fn_program(f, (t(2, 3, 4),))


@case("torch_api")
def size_unpack_list_slicing_probec():
    def f(x):
        *lead, last = x.shape
        return x.reshape(*lead, last, 1), x.reshape([*lead, -1]), x.view(x.shape[:-1] + (last,)), len(lead)
    return fn_program(f, (t(2, 3, 4),))


@case("torch_api", fullgraph=False)
def tensor_dunder_setattr_grad_called_explicitly():
    # `p.__setattr__("grad", g)` is the store itself: it was recorded as a graph op and dropped as
    # dead code, so a later read of p.grad saw None (an AttributeError eager never raises)
    lin = torch.nn.Linear(2, 2, bias=False)

    def f(x):
        lin.weight.__setattr__("grad", x * 5)
        norm = torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
        return norm, lin.weight.grad.sum()
    return fn_program(f, (t(2, 2),))


@case("torch_api")
def tensor_nbytes_itemsize_element_size():
    def f(x):
        return x * 2, x.nbytes, x.itemsize, x.element_size(), x.dtype.itemsize, x[1:].nbytes

    return Program(f, ((t(2, 3),), (t(2, 3, dtype=torch.float64),)))
