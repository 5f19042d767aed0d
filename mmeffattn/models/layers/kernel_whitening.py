"""LaplacianFormer's injective feature map on the kernel-similarity vectors (arXiv 2604.20368).

``z_i = Sigma^{-1/2} (s_i - mu) + beta`` with a diagonal, batch-estimated ``Sigma``. Derivation:
docs/design/laplacian_whitening.md.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import compute_dtype

__all__ = ['KernelWhitening']


class KernelWhitening(nn.Module):
    """Diagonal whitening ``z = (s - mean) / sqrt(var + eps) + bias`` of ``s [B, heads, N, M]``.

    BatchNorm-style batch/running statistics (float32 for 16-bit inputs); not a ``_BatchNorm``,
    so ``convert_sync_batchnorm`` skips it; ``norm_eval`` uses :attr:`running_statistics`.

    Args:
        num_heads: heads (never shared).
        num_landmarks: slots ``M`` for per-slot statistics (the paper's), None for per-head.
        momentum, eps: as BatchNorm's.
    """

    #: batch statistics with running estimates: ``norm_eval`` keeps it in eval mode
    #: (:class:`~mmeffattn.models.utils.FreezeStagesMixin`), as a BatchNorm
    running_statistics = True

    def __init__(self, num_heads: int, num_landmarks: Optional[int] = None,
                 momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f'num_heads must be an int >= 1, got {num_heads!r}')
        if num_landmarks is not None and (isinstance(num_landmarks, bool) or not isinstance(
                num_landmarks, int) or num_landmarks < 1):
            raise ValueError(f'num_landmarks must be None (per-head statistics) or an int >= 1 '
                             f'(per-slot statistics), got {num_landmarks!r}')
        if not 0. <= momentum <= 1.:
            raise ValueError(f'momentum must be in [0, 1], got {momentum!r}')
        if not eps > 0.:
            raise ValueError(f'eps must be > 0 (it keeps the whitening invertible), got {eps!r}')
        self.num_heads = num_heads
        self.num_landmarks = num_landmarks
        self.momentum = momentum
        self.eps = eps
        width = 1 if num_landmarks is None else num_landmarks
        self.bias = nn.Parameter(torch.zeros(num_heads, width))
        self.register_buffer('running_mean', torch.zeros(num_heads, width))
        self.register_buffer('running_var', torch.ones(num_heads, width))

    def _check(self, s: torch.Tensor) -> None:
        if s.dim() != 4 or s.shape[1] != self.num_heads:
            raise ValueError(f'{self.__class__.__name__} expects kernel similarities '
                             f'[B, {self.num_heads}, N, M], got shape {tuple(s.shape)}')
        if not s.is_floating_point():
            raise ValueError(f'{self.__class__.__name__} expects a floating point input, got '
                             f'{s.dtype}')
        if self.num_landmarks is not None and s.shape[-1] != self.num_landmarks:
            raise ValueError(
                f'{self.__class__.__name__} has per-slot statistics for {self.num_landmarks} '
                f'landmarks but got {s.shape[-1]}; keep the landmark count fixed (e.g. a fixed '
                f'landmark grid) or build it with num_landmarks=None (per-head statistics)')

    def forward(self, s: torch.Tensor, update_stats: bool = True) -> torch.Tensor:
        """Whiten ``s [B, heads, N, M]``; ``update_stats=False`` (a checkpoint recomputation) leaves
        the running estimates alone. Float32 for 16-bit inputs.
        """
        self._check(s)
        B, nh, N, M = s.shape
        x = s.to(compute_dtype(s.dtype))
        per_slot = self.num_landmarks is not None
        # channels of the batch norm: (head, slot) or head; samples: everything else
        if per_slot:
            flat = x.permute(0, 2, 1, 3).reshape(B * N, nh * M)  # [B*N, nh*M]
        else:
            flat = x.permute(0, 2, 3, 1).reshape(B * N * M, nh)  # [B*N*M, nh]
        if self.training and flat.shape[0] < 2:
            raise ValueError(f'{self.__class__.__name__} needs at least 2 samples per statistic '
                             f'in training to estimate a variance, got {flat.shape[0]}; use a '
                             f'larger input or batch, or eval mode (running statistics)')
        mean, var = self.running_mean.view(-1), self.running_var.view(-1)
        if self.training and not update_stats:
            # throw-away copies: F.batch_norm updates the buffers it is given in place
            mean, var = mean.clone(), var.clone()
        z = F.batch_norm(flat, mean, var, None, self.bias.view(-1).to(flat.dtype), self.training,
                         self.momentum, self.eps)
        if per_slot:
            return z.reshape(B, N, nh, M).permute(0, 2, 1, 3)
        return z.reshape(B, N, M, nh).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, num_landmarks={self.num_landmarks}, '
                f'momentum={self.momentum}, eps={self.eps}')
