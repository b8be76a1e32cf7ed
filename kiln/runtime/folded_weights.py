"""Folded and packed convolution weights at call time: the op `kiln::fold_conv_bn` that the wrapper of
a graph rewritten by kiln.lower.fold_batch_norm calls, `kiln::pack_conv_weight` that one rewritten by
kiln.lower.pack_convolution calls, and the cache that keeps their results between calls.

It lives in the runtime, imported with it, because a wrapper read back from the disk cache names
the op, and the op must exist before that record is decoded (a warm start never imports the
lowering). Input: a convolution's weight and bias and a BatchNorm's parameters and statistics;
output: the folded weight (NHWC where the convolution runs NHWC) and bias.
"""
from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

_LIBRARY = torch.library.Library("kiln", "FRAGMENT")
# The results are the cache's tensors, which live as long as the weight's cache entry: the schema
# says they alias the weight, so that the wrapper's memory planner never hands their storage to
# another buffer (it reuses only results it knows to be fresh) and nothing writes to them.
_LIBRARY.define("fold_conv_bn(Tensor(a) weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
                "Tensor running_mean, Tensor running_var, float eps, bool channels_last) -> (Tensor(a), Tensor(a))")
# The same, with the folded weight reordered once into oneDNN's own blocked format for one input
# size (mkldnn::_reorder_convolution_weight), for mkldnn::_convolution_pointwise: a convolution given
# a plain weight reorders it on every call, which for ResNet's 256- and 512-channel layers costs
# more than the arithmetic at small images.
_LIBRARY.define("fold_conv_bn_packed(Tensor(a) weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
                "Tensor running_mean, Tensor running_var, float eps, int[] padding, int[] stride, "
                "int[] dilation, int groups, int[] input_size) -> (Tensor(a), Tensor(a))")
# A convolution's own weight reordered once for oneDNN (no BatchNorm to fold): where no gradient is
# wanted, a parameter's reorder, which ATen's convolution repeats on every call, is kept between calls.
# The second result is the bias the convolution reads (a copy), or an empty tensor where it has none:
# the wrappers' memo of these ops (aten_helpers.cpp, KilnFoldMemo) remembers two results.
_LIBRARY.define("pack_conv_weight(Tensor(a) weight, Tensor? bias, int[] padding, int[] stride, int[] dilation, "
                "int groups, int[] input_size) -> (Tensor(a), Tensor(a))")


def _folded(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
            bn_bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor, eps: float,
            channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        scale = torch.rsqrt(var + eps)
        if bn_weight is not None:
            scale = scale * bn_weight
        shift = -mean if bias is None else bias - mean
        new_bias = shift * scale if bn_bias is None else torch.addcmul(bn_bias, shift, scale)
        new_weight = weight * scale.reshape((-1,) + (1,) * (weight.dim() - 1))
        if channels_last:  # the strides of the meta impl's empty_like, also for 1x1 kernels
            new_weight = torch.empty_like(new_weight, memory_format=torch.channels_last).copy_(new_weight)
    return new_weight, new_bias


class FoldCache:
    """Folded (or packed) weights kept per convolution weight and per way of folding it (a weight
    read by two graphs at two input sizes keeps both), valid while every input is the same tensor data.

    An entry holds its inputs' (data pointer, version counter) and a detached alias of each input.
    The version counter moves on every in-place write that autograd would see (an optimizer step,
    `load_state_dict`, `copy_` under no_grad, a compiled train-mode step of the running statistics);
    a new tensor put in place (`module.weight = ...`, `.data = ...`) has another data pointer, which
    cannot be a reused address because the alias keeps the old storage alive. Eager BatchNorm's
    train-mode update of the running statistics moves no version counter (ATen writes them inside
    the kernel), so the statistics' values are kept too and compared (a few hundred bytes). Other
    writes through `.data`, which autograd does not see either, are not detected. Entries go with
    their weight (a weak key), so a freed model frees its folded copies. An inference tensor (made
    under inference_mode) has no version counter: what is computed from one is never kept.
    """

    def __init__(self) -> None:
        self.entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.folds = 0  # how many times weights were (re)computed, for tests

    @staticmethod
    def _stamp(tensors: tuple[torch.Tensor | None, ...]) -> tuple | None:
        if any(t is not None and t.is_inference() for t in tensors):
            return None
        return tuple(None if t is None else (t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device)
                     for t in tensors)

    def _lookup(self, weight: torch.Tensor, way: tuple, stamp: tuple | None) -> tuple | None:
        ways = self.entries.get(weight)
        entry = None if ways is None or stamp is None else ways.get(way)
        return entry if entry is not None and entry[0] == stamp else None

    def _keep(self, weight: torch.Tensor, way: tuple, stamp: tuple | None, inputs: tuple, result: tuple,
              extra: tuple = ()) -> None:
        self.folds += 1
        if stamp is None:
            return
        aliases = tuple(None if t is None else t.detach() for t in inputs)
        self.entries.setdefault(weight, {})[way] = (stamp, aliases, result, extra)

    def get(self, weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
            bn_bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor, eps: float,
            channels_last: bool, pack: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`pack`: (padding, stride, dilation, groups, input_size) to reorder the weight for oneDNN."""
        inputs = (weight, bias, bn_weight, bn_bias, mean, var)
        way = ("fold", eps, channels_last, pack)
        stamp = self._stamp(inputs)
        entry = self._lookup(weight, way, stamp)
        if entry is not None and torch.equal(entry[3][0], mean) and torch.equal(entry[3][1], var):
            return entry[2]
        result = _folded(weight, bias, bn_weight, bn_bias, mean, var, eps, channels_last)
        if pack is not None:
            padding, stride, dilation, groups, input_size = pack
            packed = torch.ops.mkldnn._reorder_convolution_weight(result[0], padding, stride, dilation, groups,
                                                                  input_size)
            result = (packed, result[1])
        self._keep(weight, way, stamp, inputs, result, (mean.clone(), var.clone()))
        return result

    def packed(self, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple, stride: tuple,
               dilation: tuple, groups: int, input_size: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """kiln::pack_conv_weight's results: the weight reordered for oneDNN and the bias (a copy, or an
        empty tensor), computed again when the weight or the bias changed."""
        way = ("pack", padding, stride, dilation, groups, input_size)
        stamp = self._stamp((weight, bias))
        entry = self._lookup(weight, way, stamp)
        if entry is not None:
            return entry[2]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_convolution_weight(weight.detach(), list(padding), list(stride),
                                                                  list(dilation), groups, list(input_size))
            new_bias = weight.new_empty(0) if bias is None else bias.detach().clone()
        result = (packed, new_bias)
        self._keep(weight, way, stamp, (weight, bias), result)
        return result


FOLD_CACHE = FoldCache()


def _fold_conv_bn(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                  bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
                  eps: float, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # outputs are the cached tensors themselves: they are read by the convolution only (the pass
    # never lets them reach a graph output), and the schema keeps the wrapper from reusing them
    return FOLD_CACHE.get(weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, channels_last)


def _fold_conv_bn_meta(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                       bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
                       eps: float, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return (torch.empty_like(weight, memory_format=fmt),
            torch.empty_like(running_mean, memory_format=torch.contiguous_format))


def _fold_conv_bn_packed(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                         bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
                         eps: float, padding: list[int], stride: list[int], dilation: list[int], groups: int,
                         input_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    pack = (tuple(padding), tuple(stride), tuple(dilation), groups, tuple(input_size))
    return FOLD_CACHE.get(weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, False, pack)


def _fold_conv_bn_packed_meta(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                              bn_bias: torch.Tensor | None, running_mean: torch.Tensor,
                              running_var: torch.Tensor, eps: float, padding: list[int], stride: list[int],
                              dilation: list[int], groups: int,
                              input_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    # oneDNN's blocked weight shows as a tensor of the weight's shape and strides (1, 0, 0, 0)
    return (torch.empty_strided(weight.shape, (1,) + (0,) * (weight.dim() - 1), dtype=weight.dtype,
                                device=weight.device),
            torch.empty_like(running_mean, memory_format=torch.contiguous_format))


def _pack_conv_weight(weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int], stride: list[int],
                      dilation: list[int], groups: int, input_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return FOLD_CACHE.packed(weight, bias, tuple(padding), tuple(stride), tuple(dilation), groups, tuple(input_size))


def _pack_conv_weight_meta(weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int], stride: list[int],
                           dilation: list[int], groups: int,
                           input_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    # the packed weight shows as fold_conv_bn_packed's does (the weight's shape, strides (1, 0, 0, 0))
    packed = torch.empty_strided(weight.shape, (1,) + (0,) * (weight.dim() - 1), dtype=weight.dtype,
                                 device=weight.device)
    if bias is None:
        return packed, weight.new_empty(0)
    return packed, torch.empty_like(bias, memory_format=torch.contiguous_format)


_LIBRARY.impl("fold_conv_bn", _fold_conv_bn, "CompositeExplicitAutograd")
_LIBRARY.impl("fold_conv_bn_packed", _fold_conv_bn_packed, "CompositeExplicitAutograd")
_LIBRARY.impl("fold_conv_bn_packed", _fold_conv_bn_packed_meta, "Meta")
_LIBRARY.impl("fold_conv_bn", _fold_conv_bn_meta, "Meta")
_LIBRARY.impl("pack_conv_weight", _pack_conv_weight, "CompositeExplicitAutograd")
_LIBRARY.impl("pack_conv_weight", _pack_conv_weight_meta, "Meta")
fold_conv_bn = torch.ops.kiln.fold_conv_bn.default
fold_conv_bn_packed = torch.ops.kiln.fold_conv_bn_packed.default
pack_conv_weight = torch.ops.kiln.pack_conv_weight.default

# How many leading arguments of each op are the tensors whose identity, storage and version (and,
# for a BatchNorm's statistics, values) decide whether its last results still hold: the wrappers'
# memo (native_wrapper.fold_memo_applies) checks these instead of calling the op.
MEMO_TENSOR_INPUTS = {fold_conv_bn: 6, fold_conv_bn_packed: 6, pack_conv_weight: 2}

__all__ = ["fold_conv_bn", "fold_conv_bn_packed", "pack_conv_weight", "FOLD_CACHE", "FoldCache", "MEMO_TENSOR_INPUTS"]
