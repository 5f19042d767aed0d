"""Core-periphery attention in fast PyTorch: the ``'torch'`` backend (the CPU default)."""
from typing import Optional, Tuple

import torch

from .._common import autocast_off, is_eager, window_attention


def _complex_rotation(cos: torch.Tensor, sin: torch.Tensor) -> Optional[torch.Tensor]:
    """``cos + i sin`` per channel pair, ``[B or 1, 1, L, D/2]``, where the tables are fp32 or
    fp64, need no gradient and hold one angle per pair (VECA's); else None."""
    if cos.dtype not in (torch.float32, torch.float64) or not is_eager(cos, sin) or (
            torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)):
        return None
    c, s = cos.unflatten(-1, (-1, 2)), sin.unflatten(-1, (-1, 2))
    if not (torch.equal(c[..., 0], c[..., 1]) and torch.equal(s[..., 0], s[..., 1])):
        return None
    return torch.view_as_complex(torch.stack((c[..., 0], s[..., 0]), dim=-1))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          rot: Optional[torch.Tensor]) -> torch.Tensor:
    """``x * cos + rotate_pairs(x) * sin``: with ``rot``, x's pairs times it as complex numbers
    (one pass over x); else one ``addcmul`` of ``x * cos`` with x's pairs swapped, ``(a, b) ->
    (b, a)``, and sin with its even channels negated."""
    if rot is not None and x.stride(-1) == 1 and x.storage_offset() % 2 == 0 \
            and all(s % 2 == 0 for s in x.stride()[:-1]):  # (what a complex view needs)
        return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rot
                                  ).flatten(-2)
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    signed_sin = (sin.unflatten(-1, (-1, 2)) * sin.new_tensor([-1., 1.])).flatten(-2)
    return torch.addcmul(x * cos, swapped, signed_sin)


def _fused_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether bf16 attention may take torch's fused kernel: faster for inference, but it
    returns finite rows where an infinite q or k entry makes IEEE arithmetic give NaN, so q and
    k are checked first (eagerly: one sum each, accumulated in fp32)."""
    if q.dtype != torch.bfloat16 or not is_eager(q, k) or (
            torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return False
    return bool(torch.isfinite(q.sum() + k.sum()))


def core_periphery_attention_torch(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        scale: Optional[float] = None) -> torch.Tensor:
    """:func:`.naive.core_periphery_attention_naive` with the rope tables prepared once and
    :func:`mmeffattn.ops._common.window_attention` (fused for enough keys); same arguments, in
    the inputs' dtype. Returns a ``[B, heads, C + N, D]`` view of a ``[B, C + N, heads, D]``
    tensor, so that merging the heads after it is a view."""
    C = num_cores
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with autocast_off(q.device.type):
        if rope is not None:
            cos, sin = (t.to(q.dtype).unsqueeze(1) for t in rope)  # [B or 1, 1, C + N, D]
            rot = _complex_rotation(cos, sin)
            q, k = _rope(q, cos, sin, rot), _rope(k, cos, sin, rot)
        fused_bf16 = _fused_bf16(q, k, v)
        cores = window_attention(q[:, :, :C], k, v, None, scale, fused_bf16)  # all keys
        patches = window_attention(q[:, :, C:], k[:, :, :C], v[:, :, :C], None, scale, fused_bf16)
        return torch.cat((cores.transpose(1, 2), patches.transpose(1, 2)), dim=1).transpose(1, 2)
