"""Where a 2-d convolution runs on channels-last (NHWC) activations on CPU: shared by the
`fold_batch_norm` pass (which stores folded weights NHWC only for the convolutions that will run
NHWC, since ATen runs a convolution NHWC whenever its input or its weight is) and the convolution
lowering (kiln.lower.lowerings.convolution), which makes the same decision on the loop-IR values.
"""
from __future__ import annotations

import torch

CHANNELS_LAST_DTYPES = (torch.float32,)  # oneDNN's NHWC kernels; float64 takes ATen's reference path

# NHWC pays where a convolution is bound by its activations: measured on one core (ResNet-18's 3x3
# convolutions, batch 8), NHWC is 10-15% faster at 16x16 and above, forward and backward; at 8x8 only
# the forward wins, and only when the weight is NHWC already (a folded one: otherwise ATen copies the
# weight on every call); at 4x4 and below NCHW wins by 10-60%, the backward by 3x.
CHANNELS_LAST_MIN_PIXELS = 256
CHANNELS_LAST_MIN_PIXELS_NHWC_WEIGHT = 64

# An NHWC convolution is given its weight NHWC too, copied by a kernel of the graph: given an NCHW
# weight, ATen's oneDNN path makes that copy itself on every call (weight.contiguous(channels_last):
# a clone through the dispatcher) and was slower besides; measured at one thread, batch 2, 3x3,
# 32 -> 32 channels at 16x16: 275 us a call with the NCHW weight, 190 us with the NHWC one (32x32:
# equal). Inductor copies the weight in the kernel before the convolution the same way.
NHWC_WEIGHT_COPY = True

# A depthwise convolution's backward run by oneDNN (above the small-convolution limits) with a kernel
# of 5x5 or more takes x (and the gradient) NHWC: ATen runs it in x's layout, and its NCHW depthwise
# kernels are slow there. Measured at one thread, NCHW / NHWC time per call: 3x (48 channels 7x7 at
# 16x16, batch 4: ConvNeXt's), 2.1x (96 and 192 at 8x8, 7x7, batch 2), 1.75x (32 at 32x32, 5x5),
# 2.3x (64 at 16x16, 5x5, batch 4); 3x3 kernels gain nothing steady (0.55x to 1.13x).
DEPTHWISE_BACKWARD_CHANNELS_LAST = True
DEPTHWISE_BACKWARD_CHANNELS_LAST_MIN_TAPS = 25


def channels_last_pays(pixels: int, nhwc_weight: bool) -> bool:
    """Whether NHWC is worth it for a convolution whose input images have `pixels` (H * W)."""
    return pixels >= (CHANNELS_LAST_MIN_PIXELS_NHWC_WEIGHT if nhwc_weight else CHANNELS_LAST_MIN_PIXELS)


def channels_last_eligible(dtype: torch.dtype, device: torch.device, ndim: int) -> bool:
    return (ndim == 4 and device.type == "cpu" and dtype in CHANNELS_LAST_DTYPES
            and torch.backends.mkldnn.is_available())


# Small convolutions: oneDNN's time per call on one core hardly depends on the size (it varies by
# 1.5x over MobileNetV2's and ResNet's layers at 1x1 to 16x16 pixels, 0.01-0.2 M multiply-adds), so
# below a size a convolution is computed without it. A dense one (groups == 1) becomes one GEMM over its input
# patches (im2col; free for a 1x1 kernel on NHWC input). Measured on one core, compiled graph against
# compiled graph: 3.9x faster at 0.15 M multiply-adds, 2.2x at 0.6 M for a 3x3 kernel, but 0.76x at
# 0.5 M for a 1x1 kernel on NCHW input (the transposing copy) and 0.44x at 1.2 M for a 3x3 kernel at
# 16x16 (the patch copy and a GEMM only 16 columns wide), hence the limit at 0.26 M. A depthwise one
# (one input channel per group) becomes a loop with its taps unrolled over a zero-padded copy of its
# input (weights stored (kh, kw, C) on NHWC input), run along the channels, which fuses with what
# reads it (BatchNorm, ReLU6). Against oneDNN, 3x3, batch 2, one core, NHWC: 3.4x at 0.15 M (32
# channels at 16x16), 2.2x at 0.15 M (144 at 8x8), 1.6x at 0.44 M (96 at 16x16), 1.15x at 0.66 M (144
# at 16x16), 0.8x at 1.8 M (96 at 32x32) and 0.7x at 2.4 M; on NCHW input it wins at every size
# measured (oneDNN pays two layout conversions), hence 0.79 M.
SMALL_CONV_GEMM_MACS = 1 << 18
SMALL_CONV_DEPTHWISE_MACS = 3 << 18
# The backward (convolution_backward: the input's gradient gathered tap by tap, the weight's as a
# reduction) pays less: measured per training step of one convolution, a depthwise 3x3 at 0.03 M
# multiply-adds is faster than with oneDNN's backward and at 0.3 M slower; a dense 3x3 is faster at
# 0.07 M and slower at 0.15 M.
SMALL_CONV_BACKWARD_MACS = 1 << 16
# Whatever its size, a dense convolution's backward is one GEMM per gradient where its weight is large
# against the output pixels (rows = N * Ho * Wo at most this many per output channel): oneDNN's weight
# gradient is slow there (ResNet-18's last stage at batch 2, 2x2 pixels, 512 channels: 3.5-18 ms a call
# on one core against 1.75 ms for patches^T @ grad), slower than the extra patch copy the GEMMs pay.
# Measured per convolution_backward (both gradients), one core, oneDNN / GEMM: 1.4x (512 ch, 2x2,
# batch 2), 2.2x (256 -> 512, 3x3 stride 2), 1.2x (256 at 3x3), 5.8x (512 at 1x1), 3x (512 at 4x4),
# 1.9x (512 at 7x7), 2x (256 at 2x2, batch 8), 1.6x (512 at 2x2, batch 8); where rows per channel
# pass 0.25 oneDNN wins or ties: 0.8x (128 at 6x6, batch 2: 0.56 rows per channel), 0.96x (256 at 4x4,
# batch 8: 0.5), 0.4x (64 at 16x16, batch 8), 0.4x (64 -> 256 1x1 at 4x4, batch 8).
SMALL_CONV_BACKWARD_ROWS_PER_CHANNEL = 0.25
SMALL_CONV_DEPTHWISE_TAPS = 49  # up to 7x7 kernels (ConvNeXt's)
SMALL_CONV_DTYPES = (torch.float32, torch.float64)


def small_conv_kind(x_shape: tuple, w_shape: tuple, out_shape: tuple, groups: int, transposed: bool,
                    dtype: torch.dtype, device: torch.device, backward: bool = False) -> str | None:
    """"gemm", "depthwise" or None (oneDNN/ATen) for a convolution of these static sizes (or its
    backward)."""
    if (transposed or device.type != "cpu" or dtype not in SMALL_CONV_DTYPES or len(x_shape) != 4
            or not all(isinstance(s, int) for s in (*x_shape, *w_shape, *out_shape))):
        return None
    n, c_in, _h, _w = x_shape
    c_out, c_per_group, kh, kw = w_shape
    if 0 in (n, c_in, c_out, kh, kw, *out_shape):
        return None
    macs = n * c_out * out_shape[2] * out_shape[3] * c_per_group * kh * kw
    if groups == 1 and macs <= (SMALL_CONV_BACKWARD_MACS if backward else SMALL_CONV_GEMM_MACS):
        return "gemm"
    if backward and groups == 1 and n * out_shape[2] * out_shape[3] <= SMALL_CONV_BACKWARD_ROWS_PER_CHANNEL * c_out:
        return "gemm"
    if (groups == c_in and c_per_group == 1 and c_out % c_in == 0 and kh * kw <= SMALL_CONV_DEPTHWISE_TAPS
            and macs <= (SMALL_CONV_BACKWARD_MACS if backward else SMALL_CONV_DEPTHWISE_MACS)):
        return "depthwise"
    return None


def tunables() -> str:
    """The thresholds above as they are now (part of the compiled-graph cache key: a test or a user
    that changes one gets graphs compiled under it, not ones stored under the old value)."""
    return repr((CHANNELS_LAST_MIN_PIXELS, CHANNELS_LAST_MIN_PIXELS_NHWC_WEIGHT, SMALL_CONV_GEMM_MACS,
                 SMALL_CONV_DEPTHWISE_MACS, SMALL_CONV_DEPTHWISE_TAPS, SMALL_CONV_BACKWARD_MACS,
                 SMALL_CONV_BACKWARD_ROWS_PER_CHANNEL, NHWC_WEIGHT_COPY,
                 DEPTHWISE_BACKWARD_CHANNELS_LAST, DEPTHWISE_BACKWARD_CHANNELS_LAST_MIN_TAPS))


LOADED_TUNABLES = tunables()  # kiln.capture.persist puts changed limits in the frame key
