"""SEMA attention's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any, List, Sequence

import torch

from .._opspec import OpSpec
from .op import sema_triton_reasons


def window_sides(n: int, window: int) -> List[int]:
    """Sides of the windows tiled from the start of a grid side ``n`` (the last may be short);
    a side smaller than the window is one window of that side."""
    w = min(window, n)
    return [w] * (n // w) + ([n % w] if n % w else [])


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
         window_size: int, **kwargs: Any) -> int:
    """Softmax attention among the real tokens of each window (padded keys are no work of the
    op; the reference computes them, the kernels mask them) plus the mean of the values."""
    B, nh, N, D = q.shape
    H, W = hw
    pairs = sum((a * b) ** 2 for a in window_sides(H, window_size)
                for b in window_sides(W, window_size))  # sum over windows of L_w^2
    return B * nh * pairs * 2 * D + B * nh * N * D * int(kwargs.get('with_mean', True))


def macs_qk(qk: torch.Tensor, v: torch.Tensor, hw: Sequence[int], window_size: int,
            **kwargs: Any) -> int:
    """:func:`macs` of ``sema_attention_qk`` (q, k packed in ``qk``; v has q's shape)."""
    return macs(v, v, v, hw, window_size, **kwargs)


SPEC = OpSpec(name='sema_attention', macs=macs, can_run=sema_triton_reasons,
              entry_points={'sema_attention_qk': macs_qk})
