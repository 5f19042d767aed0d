"""Nystrom kernel attention (SOFT, LaplacianFormer) and its landmark pooling, in one place for the
backbone, the op benchmark and the dispersion probe."""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from .pool import adaptive_avg_pool2d
from .tokens import tokens_to_map

__all__ = ['pool_landmarks', 'nystrom_attention']

Pairwise = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def pool_landmarks(x: torch.Tensor, hw: Tuple[int, int], cell: int = 1, grid: Optional[int] = None
                   ) -> torch.Tensor:
    """Landmarks: ``x [B, heads, H*W, D]`` average pooled over ``cell x cell`` cells (border cells
    average what they hold; ``cell=1`` returns ``x``), or with ``grid`` to a fixed ``grid x grid``
    (adaptive pooling: slot ``m`` is the same image region at every size); ``[B, heads, M, D]``.

    Heads split off ``[B, N, heads*D]`` tokens are pooled as one channels-last map, without a copy.
    """
    if grid is None and cell == 1:
        return x
    B, nh, N, D = x.shape
    fmap = tokens_to_map(x.transpose(1, 2).reshape(B, N, nh * D), hw)  # [B, nh*D, H, W]
    if grid is not None:
        pooled = adaptive_avg_pool2d(fmap, grid)  # [B, nh*D, grid, grid]
    else:
        pooled = F.avg_pool2d(fmap, cell, cell, ceil_mode=True)  # [B, nh*D, H', W']
    return pooled.reshape(B, nh, D, -1).transpose(-2, -1)


def nystrom_attention(q: torch.Tensor, landmarks: torch.Tensor, kernel: Pairwise,
                      solve: Pairwise, v: Optional[torch.Tensor] = None,
                      k: Optional[torch.Tensor] = None,
                      whiten: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                      ) -> torch.Tensor:
    """``K(q, L) K(L, L)^-1 K(L, k) v / N`` over ``N`` keys, right to left: nothing ``N x N``.

    Args:
        q, landmarks: ``[B, h, Nq, D]`` queries and ``[B, h, M, D]`` landmarks ``L``.
        kernel: ``kernel(x, y) -> [B, h, Nx, Ny]``, e.g. the Laplacian kernel.
        solve: ``solve(A, R) -> A^-1 R`` for ``A = K(L, L)`` (regularized as the caller needs).
        v: ``[B, h, Nk, Dv]`` values; None returns the ``[B, h, Nq, Nk]`` weights themselves.
        k: ``[B, h, Nk, D]`` keys; None: the queries (SOFT's), ``K(L, q) = K(q, L)^T``.
        whiten: a map on ``K(q, L)``, the query side only (LaplacianFormer's kernel whitening).
    """
    k_ql = kernel(q, landmarks)  # [B, h, Nq, M]
    k_lk = k_ql.transpose(-2, -1) if k is None else kernel(landmarks, k)  # [B, h, M, Nk]
    x = solve(kernel(landmarks, landmarks), k_lk if v is None else k_lk @ v)  # [B, h, M, Dv]
    if whiten is not None:
        k_ql = whiten(k_ql)
    return (k_ql @ x).div_(k_lk.shape[-1])  # [B, h, Nq, Dv]
