"""The dynamic depthwise convolution's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import OpSpec
from .op import dynamic_dwconv_triton_reasons


def macs(x: torch.Tensor, kernel: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """A ``K x K`` depthwise convolution per sample and channel (stride 1, same size)."""
    B, C, H, W = x.shape
    return B * C * H * W * kernel.shape[-1] * kernel.shape[-2]


SPEC = OpSpec(name='dynamic_dwconv', macs=macs, can_run=dynamic_dwconv_triton_reasons)
