"""Windowed linear attention: SEMA's ``A_Phi`` ablation, ``phi = ELU + 1`` inside SEMA's windows::

    out_i = phi(q_i) [mean_{j in w(i)} phi(k_j)^T v_j]
            / (phi(q_i) . mean_{j in w(i)} phi(k_j) + eps)

Windows as in ``sema_attention`` (its torch backend's partition); ``with_mean`` adds ``mean_j
v_j``. Cost ``O(N D Dv)``.
"""
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

from mmeffattn.ops import compute_dtype
from mmeffattn.ops.sema.pytorch import window_join, window_regions, window_split

__all__ = ['window_linear_attention', 'FEATURE_MAPS']

FEATURE_MAPS = ('elu', 'relu')


def _feature_map(x: torch.Tensor, kind: str) -> torch.Tensor:
    return F.elu(x) + 1.0 if kind == 'elu' else F.relu(x)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
           window_size: int, feature_map: str, eps: float) -> Tuple[int, int]:
    name = 'window_linear_attention'
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise ValueError(f'{name}: q, k, v must be torch.Tensors')
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f'{name}: expected q, k [B, heads, N, D] and v [B, heads, N, Dv] with '
                         f'the same B, heads, N; got {tuple(q.shape)}, {tuple(k.shape)}, '
                         f'{tuple(v.shape)} (transpose [B, N, heads, D] inputs with '
                         f'.transpose(1, 2))')
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise ValueError(f'{name}: q, k, v must be floating point')
    if len(hw) != 2 or any(isinstance(s, bool) or int(s) != s or s < 1 for s in hw):
        raise ValueError(f'{name}: hw must be (H, W) with positive ints, got {hw!r}')
    H, W = int(hw[0]), int(hw[1])
    if H * W != q.shape[2]:
        raise ValueError(f'{name}: hw {H}x{W} = {H * W} tokens, but q has N = {q.shape[2]}; '
                         f'pass the token grid of these features')
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f'{name}: window_size must be an int >= 1, got {window_size!r}')
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f'{name}: feature_map must be one of {FEATURE_MAPS}, got '
                         f'{feature_map!r}')
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f'{name}: eps must be a number > 0 (keeps the normalizer nonzero), '
                         f'got {eps!r}')
    return H, W


def window_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            hw: Tuple[int, int], window_size: int, *, with_mean: bool = True,
                            feature_map: str = 'elu', eps: float = 1e-6) -> torch.Tensor:
    """Linear attention inside SEMA's windows, plus the mean of all values (``with_mean``).

    Args:
        q, k: ``[B, heads, N, D]`` before the feature map, ``N = H * W`` tokens in row-major order.
        v: ``[B, heads, N, Dv]``.
        hw, window_size: the token grid and the window side, tiled as ``sema_attention``.
        feature_map: ``'elu'`` (``ELU + 1``, MLLA's) or ``'relu'``.
        eps: added to the normalizer.

    Returns:
        ``[B, heads, N, Dv]`` in v's dtype (float32 inside for 16-bit inputs).
    """
    H, W = _check(q, k, v, hw, window_size, feature_map, eps)
    B, nh, N, _ = q.shape
    dtype = compute_dtype(v.dtype)
    fq = _feature_map(q.to(dtype), feature_map)
    fk = _feature_map(k.to(dtype), feature_map)
    vv = v.to(dtype)
    # each rectangle of equal windows apart: no padded token enters a sum
    regions = window_regions((H, W), window_size)
    # [B*nW, heads, L, *] windows of the tokens-major [B, H, W, heads, *] views
    windows = zip(*(window_split(t.transpose(1, 2).unflatten(1, (H, W)), regions)
                    for t in (fq, fk, vv)))
    outs = []
    for fq_w, fk_w, v_w in ((t.transpose(1, 2) for t in w) for w in windows):
        kv = fk_w.transpose(-2, -1) @ v_w / fk_w.shape[-2]  # [B*nW, h, D, Dv]
        k_mean = fk_w.mean(dim=-2, keepdim=True)  # [B*nW, h, 1, D]
        z = 1.0 / ((fq_w * k_mean).sum(dim=-1, keepdim=True) + eps)  # [B*nW, h, L, 1]
        outs.append(((fq_w @ kv) * z).transpose(1, 2))
    out = window_join(outs, regions, (B, H, W, nh, vv.shape[-1]))
    out = out.flatten(1, 2).transpose(1, 2)  # [B, h, N, Dv]
    if with_mean:
        out = out + vv.mean(dim=2, keepdim=True)
    return out.to(v.dtype)
