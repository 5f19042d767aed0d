"""The per-sample dynamic depthwise convolution in fast PyTorch (one grouped ``F.conv2d``): the
``'torch'`` backend (the CPU default). With ``normalize`` and ``weight`` it is the arithmetic (and
its order) of WeightFormer's ``DynamicDWConv`` before the op existed."""
from typing import Optional

import torch
import torch.nn.functional as F

from .._common import autocast_enabled, is_eager
from .naive import conv_by_taps


def effective_kernel(kernel: torch.Tensor, weight: Optional[torch.Tensor] = None,
                     normalize: bool = False) -> torch.Tensor:
    """``[B*C, 1, K, K]`` kernels the convolution applies (a grouped-conv weight): ``kernel``
    ``[B, C, K, K]`` divided by its Frobenius norm plus one (with ``normalize``), plus the static
    ``weight`` ``[C, 1, K, K]`` if given.

    The kernel is flattened to ``[B*C, 1, K, K]`` *before* the norm, as the model always did:
    the copy this makes of a channels-last kernel fixes the summation order, so the results are
    bit-identical to the model's original code."""
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
    """Depthwise convolution with one ``K x K`` kernel per sample and channel.

    Stride 1, zero padding ``K // 2`` (output size = input size). Does not validate its inputs
    (``dynamic_dwconv`` does); works for any float dtype and device and is differentiable.

    Args:
        x: ``[B, C, H, W]``.
        kernel: ``[B, C, K, K]``, ``K`` odd.
        bias: optional ``[C]``, shared by all samples.
        weight: optional static kernel ``[C, 1, K, K]`` (or ``[C, K, K]``) added to every
            sample's kernel.
        normalize: divide each sample's ``K x K`` kernel by its Frobenius norm plus one before
            adding ``weight`` (WeightFormer's rule).

    Returns:
        ``[B, C, H, W]`` in x's dtype (the kernel and bias are cast to it), or under autocast
        the dtype autocast gives the convolution.
    """
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    k = effective_kernel(kernel, weight, normalize)  # [B*C, 1, K, K]
    b = None if bias is None else bias.repeat(B)  # [B*C]
    if not autocast_enabled(x.device.type):  # (autocast casts them itself)
        k = k.to(x.dtype)
        b = None if b is None else b.to(x.dtype)
    # a NaN or inf tap: a padded convolution may multiply it with the padding zeros (0 * NaN =
    # NaN; torch's CPU kernel did for bf16), reaching outputs that do not depend on it, so the
    # taps are summed where they reach the map (rare). A captured graph cannot branch on values
    # (nor have fake or meta tensors any): there F.conv2d runs (its fp32 CPU kernel keeps the rule)
    if is_eager(k) and not bool(torch.isfinite(k).all()):
        return conv_by_taps(x, k.reshape(B, C, K, K),
                            None if b is None else b.reshape(B, C, 1, 1))
    out = F.conv2d(x.reshape(1, B * C, H, W), k, b, padding=K // 2, groups=B * C)
    return out.reshape(B, C, H, W)
