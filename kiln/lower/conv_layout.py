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


def channels_last_pays(pixels: int, nhwc_weight: bool) -> bool:
    """Whether NHWC is worth it for a convolution whose input images have `pixels` (H * W)."""
    return pixels >= (CHANNELS_LAST_MIN_PIXELS_NHWC_WEIGHT if nhwc_weight else CHANNELS_LAST_MIN_PIXELS)


def channels_last_eligible(dtype: torch.dtype, device: torch.device, ndim: int) -> bool:
    return (ndim == 4 and device.type == "cpu" and dtype in CHANNELS_LAST_DTYPES
            and torch.backends.mkldnn.is_available())


# Small convolutions: oneDNN spends ~25 us per call on one core whatever the size (measured at
# MobileNetV2's and ResNet's layers at 4x4 to 16x16 pixels: 27-41 us for 0.01-0.2 M multiply-adds),
# so below a size a convolution is computed without it. A dense one (groups == 1) becomes one GEMM
# over its input patches (im2col, free for a 1x1 kernel on NHWC input): 3-15 us at those layers; it
# loses to oneDNN from ~6 M multiply-adds (ResNet-50's 1x1 layers at 56x56: 9 ms vs 15 ms). A
# depthwise one (one input channel per group) becomes a loop with its taps unrolled, which fuses
# with what reads it (BatchNorm, ReLU6) and with a padding before it.
SMALL_CONV_GEMM_MACS = 1 << 20
SMALL_CONV_DEPTHWISE_MACS = 1 << 18
SMALL_CONV_DEPTHWISE_TAPS = 49  # up to 7x7 kernels (ConvNeXt's)
SMALL_CONV_DTYPES = (torch.float32, torch.float64)


def small_conv_kind(x_shape: tuple, w_shape: tuple, out_shape: tuple, groups: int, transposed: bool,
                    dtype: torch.dtype, device: torch.device) -> str | None:
    """"gemm", "depthwise" or None (oneDNN/ATen) for a convolution of these static sizes."""
    if (transposed or device.type != "cpu" or dtype not in SMALL_CONV_DTYPES or len(x_shape) != 4
            or not all(isinstance(s, int) for s in (*x_shape, *w_shape, *out_shape))):
        return None
    n, c_in, _h, _w = x_shape
    c_out, c_per_group, kh, kw = w_shape
    if 0 in (n, c_in, c_out, kh, kw, *out_shape):
        return None
    macs = n * c_out * out_shape[2] * out_shape[3] * c_per_group * kh * kw
    if groups == 1 and macs <= SMALL_CONV_GEMM_MACS:
        return "gemm"
    if (groups == c_in and c_per_group == 1 and c_out % c_in == 0 and kh * kw <= SMALL_CONV_DEPTHWISE_TAPS
            and macs <= SMALL_CONV_DEPTHWISE_MACS):
        return "depthwise"
    return None


def tunables() -> str:
    """The thresholds above as they are now (part of the compiled-graph cache key: a test or a user
    that changes one gets graphs compiled under it, not ones stored under the old value)."""
    return repr((CHANNELS_LAST_MIN_PIXELS, CHANNELS_LAST_MIN_PIXELS_NHWC_WEIGHT, SMALL_CONV_GEMM_MACS,
                 SMALL_CONV_DEPTHWISE_MACS, SMALL_CONV_DEPTHWISE_TAPS))
