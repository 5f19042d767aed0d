"""VECA's core-periphery attention as the formula in plain tensor operations (the oracle)."""
from typing import Callable, Optional, Tuple

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
    """Core-periphery softmax attention (unvalidated): rows ``< C`` attend all keys, rows
    ``>= C`` the C core keys. Arguments and result as ``core_periphery_attention``."""
    return core_periphery(q, k, v, num_cores, rope, scale, plain_attention)


def core_periphery(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
                   rope: Optional[Tuple[torch.Tensor, torch.Tensor]], scale: Optional[float],
                   attention: Callable) -> torch.Tensor:
    """The two dense attentions (core rows over all keys, patch rows over the core keys) with
    ``attention(q, k, v, mask, scale)``: the reference's and the torch backend's."""
    C = num_cores
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with autocast_off(q.device.type):
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out_cores = attention(q[:, :, :C], k, v, None, scale)  # [B, heads, C, D]
        out_patches = attention(q[:, :, C:], k[:, :, :C], v[:, :, :C], None, scale)
        return torch.cat((out_cores, out_patches), dim=2)
