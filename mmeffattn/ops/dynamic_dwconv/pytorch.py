"""The dynamic depthwise convolution as one grouped ``F.conv2d``: the ``'torch'`` backend
(WeightFormer's ``DynamicDWConv`` arithmetic and order)."""
from typing import Optional

import torch
import torch.nn.functional as F

from .._common import autocast_enabled, is_eager
from .naive import conv_by_taps


def effective_kernel(kernel: torch.Tensor, weight: Optional[torch.Tensor] = None,
                     normalize: bool = False) -> torch.Tensor:
    """The grouped-conv weight ``[B*C, 1, K, K]``: kernel (normalized) plus weight. Flattened
    before the norm, as the model did, so the summation order (and result) is the same."""
    B, C, K = kernel.shape[0], kernel.shape[1], kernel.shape[-1]
    kernel = kernel.reshape(B * C, 1, K, K)
    if normalize:
        kernel = kernel / (kernel.norm(dim=(-2, -1), keepdim=True) + 1.0)
    if weight is not None:
        kernel = kernel + weight.reshape(C, 1, K, K).repeat(B, 1, 1, 1)
    return kernel


def dynamic_dwconv_torch(x: torch.Tensor, kernel: torch.Tensor,
                         bias: Optional[torch.Tensor] = None,
                         weight: Optional[torch.Tensor] = None,
                         normalize: bool = False) -> torch.Tensor:
    """Depthwise convolution with one ``K x K`` kernel per sample and channel (unvalidated;
    arguments as ``dynamic_dwconv``). Returns x's dtype, or autocast's."""
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    k = effective_kernel(kernel, weight, normalize)  # [B*C, 1, K, K]
    b = None if bias is None else bias.repeat(B)  # [B*C]
    if not autocast_enabled(x.device.type):  # (autocast casts them itself)
        k = k.to(x.dtype)
        b = None if b is None else b.to(x.dtype)
    # a non-finite tap times the padding zeros would give NaN where it does not reach: sum the
    # taps instead (eager only: a captured graph cannot branch on values)
    if is_eager(k) and not bool(torch.isfinite(k).all()):
        return conv_by_taps(x, k.reshape(B, C, K, K),
                            None if b is None else b.reshape(B, C, 1, 1))
    if B == 1:  # x as it is: a reshape would give a channels-last map batch stride C, and
        # oneDNN would then copy it to NCHW and return NCHW (a copy for the next token op too)
        return F.conv2d(x, k, b, padding=K // 2, groups=C)
    out = F.conv2d(x.reshape(1, B * C, H, W), k, b, padding=K // 2, groups=B * C)
    return out.reshape(B, C, H, W)
