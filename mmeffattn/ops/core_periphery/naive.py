"""VECA's core-periphery attention as the formula in plain tensor operations (the oracle)."""
from typing import Optional, Tuple

import torch

from .._common import autocast_off, plain_attention


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs by 90 degrees, ``(a, b) -> (-b, a)`` (VECA's
    ``Rotary2D`` pairs neighbouring channels, not halves)."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., D/2, 2]
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_pairs(x) * sin`` for ``x`` ``[B, heads, L, D]`` and ``cos``/``sin``
    ``[B or 1, L, D]`` (shared by the heads; cast to x's dtype first, as VECA does)."""
    cos = cos.to(x.dtype).unsqueeze(1)  # [B or 1, 1, L, D]
    sin = sin.to(x.dtype).unsqueeze(1)
    return x * cos + rotate_pairs(x) * sin


def core_periphery_attention_naive(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        scale: Optional[float] = None) -> torch.Tensor:
    """Core-periphery softmax attention (unvalidated)::

        q, k = apply_rope(q), apply_rope(k)              # if rope is given
        out[:C] = softmax(q[:C] k^T * scale) v           # the C cores attend to every token
        out[C:] = softmax(q[C:] k[:C]^T * scale) v[:C]   # the patches attend to the cores

    Arguments and result as ``core_periphery_attention`` (fp32 for 16-bit inputs).
    """
    C = num_cores
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with autocast_off(q.device.type):
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        cores = plain_attention(q[:, :, :C], k, v, None, scale)  # [B, heads, C, D]
        patches = plain_attention(q[:, :, C:], k[:, :, :C], v[:, :, :C], None, scale)
        return torch.cat((cores, patches), dim=2)
