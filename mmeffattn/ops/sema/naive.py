"""SEMA attention written as the formula, in plain tensor operations: the test oracle."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from .._common import autocast_off, plain_attention


def sema_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                         window_size: int, scale: Optional[float] = None,
                         with_mean: bool = True, out_layout: str = 'bhnd',
                         return_mean: bool = False
                         ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Softmax attention inside ``window_size x window_size`` windows tiled from the top-left
    corner of the ``H x W`` grid, plus ``mean_j v_j`` over all N tokens::

        out_i = sum_{j in window(i)} softmax_j(q_i . k_j * scale) v_j  (+ mean_j v_j)

    The grid is zero-padded to whole windows; padded keys are masked out. Unvalidated;
    arguments and result as ``sema_attention``.
    """
    B, nh, N, D = q.shape
    H, W = hw
    ws = window_size
    scale = D ** -0.5 if scale is None else scale
    Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws

    def windows(x: torch.Tensor) -> torch.Tensor:  # [B, nh, N, c] -> [B, nh, nW, ws*ws, c]
        x = F.pad(x.reshape(B, x.shape[1], H, W, -1), (0, 0, 0, Wp - W, 0, Hp - H))
        x = x.reshape(B, x.shape[1], Hp // ws, ws, Wp // ws, ws, -1).transpose(3, 4)
        return x.reshape(B, x.shape[1], -1, ws * ws, x.shape[-1])

    with autocast_off(q.device.type):
        real = windows(q.new_ones(B, 1, N, 1))[..., 0] > 0  # [B, 1, nW, ws*ws]
        out = plain_attention(windows(q), windows(k), windows(v), real[..., None, :], scale)
        out = out.reshape(B, nh, Hp // ws, Wp // ws, ws, ws, D).transpose(3, 4)
        out = out.reshape(B, nh, Hp, Wp, D)[:, :, :H, :W].reshape(B, nh, N, D)
        mean = v.mean(dim=2)  # [B, nh, D]
        if with_mean and not return_mean:
            out = out + mean[:, :, None]
        if out_layout == 'bnhd':
            out = out.transpose(1, 2).contiguous()
    return (out, mean) if return_mean else out


def unbind_qk(qk: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)`` ``[B, heads, N, D]`` views of a packed ``[B, N, 2, heads, D]`` qk. ``unbind``
    (not two ``select``s): its backward is one ``stack`` into qk's packed layout."""
    q, k = qk.unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2)


def sema_attention_qk_naive(qk: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                            window_size: int, scale: Optional[float] = None,
                            with_mean: bool = True, out_layout: str = 'bhnd',
                            return_mean: bool = False
                            ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sema_attention_naive` with q and k packed in ``qk`` ``[B, N, 2, heads, D]``."""
    return sema_attention_naive(*unbind_qk(qk), v, hw, window_size, scale=scale,
                                with_mean=with_mean, out_layout=out_layout,
                                return_mean=return_mean)
