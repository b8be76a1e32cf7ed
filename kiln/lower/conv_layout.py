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
