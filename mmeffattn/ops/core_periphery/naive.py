"""VECA's core-periphery attention written as the formula, in plain tensor operations: the test
oracle."""
from typing import Callable, Optional, Tuple

import torch

from .._common import autocast_off, plain_attention


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of the last dim by 90 degrees: ``(a, b) -> (-b, a)``.

    ``out[..., 2i] = -x[..., 2i+1]`` and ``out[..., 2i+1] = x[..., 2i]`` (VECA's ``Rotary2D``
    pairs neighbouring channels, not the two halves).
    """
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
    """Core-periphery softmax attention: cores see every token, patches see only the cores.

    Does not validate its inputs (``core_periphery_attention`` does); any float dtype and
    device, differentiable in q, k, v and the rope tables.

    Args:
        q, k, v: ``[B, heads, C + N, D]``, the ``C = num_cores`` core tokens first.
        num_cores: C, ``1 <= C < C + N``.
        rope: optional ``(cos, sin)``, each ``[B or 1, C + N, D]``, applied to q and k.
        scale: logit scale, ``D ** -0.5`` by default.

    Returns:
        ``[B, heads, C + N, D]`` in q's dtype (autocast is turned off, as in the kernels): rows
        ``< C`` attend over all keys, rows ``>= C`` over the C core keys.
    """
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
