"""Adaptive average pooling that keeps a symbolic input size symbolic (torch.export / ONNX)."""
from typing import Tuple, Union

import torch
import torch.nn.functional as F

from .tokens import is_symbolic


def _pool_matrix(length, n: int, like: torch.Tensor) -> torch.Tensor:
    """``[n, length]``: row ``i`` averages bins ``floor(i L / n) .. ceil((i + 1) L / n) - 1``,
    the bins of ``adaptive_avg_pool``."""
    i = torch.arange(n, device=like.device).unsqueeze(1)  # [n, 1]
    start = (i * length) // n
    end = ((i + 1) * length + n - 1) // n
    pos = torch.arange(length, device=like.device).unsqueeze(0)  # [1, L]
    inside = ((pos >= start) & (pos < end)).to(like.dtype)  # [n, L]
    return inside / (end - start).to(like.dtype)


def adaptive_avg_pool2d(x: torch.Tensor, output_size: Union[int, Tuple[int, int]]
                        ) -> torch.Tensor:
    """``F.adaptive_avg_pool2d``, or for a symbolic ``H``/``W`` the same bins by two pooling
    matrices: torch's ONNX export of the op fixes its gather indices at the export size.
    """
    H, W = x.shape[-2:]
    if not is_symbolic(H, W):
        return F.adaptive_avg_pool2d(x, output_size)
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    x = x @ _pool_matrix(W, ow, x).transpose(0, 1)  # [B, C, H, ow]
    return _pool_matrix(H, oh, x) @ x  # [B, C, oh, ow]
