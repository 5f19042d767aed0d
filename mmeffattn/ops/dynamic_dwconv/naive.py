"""The per-sample dynamic depthwise convolution as the formula (the test oracle)."""
from typing import Optional

import torch

from .._common import autocast_off, compute_dtype


def conv_by_taps(x: torch.Tensor, k: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """``out[h, w] = b + sum_{i,j} x[h + i - K // 2, w + j - K // 2] k[i, j]`` over the taps
    that land on the map (a NaN tap reaches only the outputs that read it). x, k: ``[B, C, *]``."""
    B, C, H, W = x.shape
    K = k.shape[-1]
    out = x.new_zeros(x.shape) if b is None else b.expand_as(x).clone()
    for i in range(K):
        for j in range(K):
            dh, dw = i - K // 2, j - K // 2  # out[h, w] += x[h + dh, w + dw] * k[i, j]
            if abs(dh) >= H or abs(dw) >= W:  # the tap reaches no pixel
                continue
            out[:, :, max(0, -dh):H - max(0, dh), max(0, -dw):W - max(0, dw)] += (
                x[:, :, max(0, dh):H - max(0, -dh), max(0, dw):W - max(0, -dw)]
                * k[:, :, i, j, None, None])
    return out


def dynamic_dwconv_naive(x: torch.Tensor, kernel: torch.Tensor,
                         bias: Optional[torch.Tensor] = None,
                         weight: Optional[torch.Tensor] = None,
                         normalize: bool = False) -> torch.Tensor:
    """Depthwise convolution with one ``K x K`` kernel per sample and channel::

        k = kernel / (||kernel[b, c]||_F + 1)  (with normalize)  + weight[c]  (if given)
        out = conv_by_taps(x, k) + bias[c]     # stride 1, zero padding K // 2

    Unvalidated; arguments as ``dynamic_dwconv``. Computed in fp32, returned in x's dtype.
    """
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    ct = compute_dtype(x.dtype)
    with autocast_off(x.device.type):
        k = kernel.to(ct)
        if normalize:
            k = k / (k.norm(dim=(-2, -1), keepdim=True) + 1.0)
        if weight is not None:
            k = k + weight.to(ct).reshape(1, C, K, K)
        b = None if bias is None else bias.to(ct).reshape(1, C, 1, 1)
        return conv_by_taps(x.to(ct), k, b).to(x.dtype)
