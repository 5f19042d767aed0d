"""Core-periphery attention in fast PyTorch: the ``'torch'`` backend (the CPU default)."""
from typing import Optional, Tuple

import torch

from .._common import autocast_off, window_attention


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_pairs(x) * sin`` as one ``addcmul`` of x with its channel pairs
    swapped, ``(a, b) -> (b, a)``, and ``signed_sin`` (sin, its even channels negated)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return torch.addcmul(x * cos, swapped, signed_sin)


def core_periphery_attention_torch(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        scale: Optional[float] = None) -> torch.Tensor:
    """:func:`.naive.core_periphery_attention_naive` with the rope tables prepared once for q
    and k, and torch's fused attention for fp32 and 16 keys or more
    (:func:`mmeffattn.ops._common.window_attention`); same arguments. In the inputs' dtype (a
    16-bit softmax accumulates in fp32)."""
    C = num_cores
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with autocast_off(q.device.type):
        if rope is not None:
            cos, sin = (t.to(q.dtype).unsqueeze(1) for t in rope)  # [B or 1, 1, C + N, D]
            signed_sin = (sin.unflatten(-1, (-1, 2)) * sin.new_tensor([-1., 1.])).flatten(-2)
            q, k = _rope(q, cos, signed_sin), _rope(k, cos, signed_sin)
        cores = window_attention(q[:, :, :C], k, v, None, scale)  # all keys
        patches = window_attention(q[:, :, C:], k[:, :, :C], v[:, :, :C], None, scale)
        return torch.cat((cores, patches), dim=2)
