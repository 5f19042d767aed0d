"""Pure PyTorch reference of SEMA attention: the test oracle and the production CPU path."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .._common import window_attention  # noqa: F401  (also this module's public helper)


def _window_layout(H: int, W: int, window_size: int) -> Tuple[int, int, int, int]:
    """``(win_h, win_w, pad_h, pad_w)``: a grid side smaller than the window is one window of
    that side (the same partition, without padding)."""
    win_h, win_w = min(window_size, H), min(window_size, W)
    return win_h, win_w, (-H) % win_h, (-W) % win_w


def window_partition(x: torch.Tensor, hw: Tuple[int, int], window_size: int) -> torch.Tensor:
    """``[B, heads, N, D]`` -> ``[B*heads, n_windows, win_h*win_w, D]``, zero-padded, windows
    in row-major order and tokens row-major inside each window."""
    B, nh, N, D = x.shape
    H, W = hw
    win_h, win_w, pad_h, pad_w = _window_layout(H, W, window_size)
    x = x.reshape(B * nh, H, W, D)
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    n_h, n_w = (H + pad_h) // win_h, (W + pad_w) // win_w
    x = x.view(B * nh, n_h, win_h, n_w, win_w, D).transpose(2, 3)
    return x.reshape(B * nh, n_h * n_w, win_h * win_w, D)  # a view when n_w == 1 and no padding


def window_merge(x: torch.Tensor, hw: Tuple[int, int], window_size: int) -> torch.Tensor:
    """Inverse of :func:`window_partition` without the final reshape: ``[B*heads, n_windows,
    win_h*win_w, D]`` -> ``[B*heads, H, W, D]`` (possibly a non-contiguous view)."""
    BH, _, _, D = x.shape
    H, W = hw
    win_h, win_w, pad_h, pad_w = _window_layout(H, W, window_size)
    n_h, n_w = (H + pad_h) // win_h, (W + pad_w) // win_w
    x = x.view(BH, n_h, n_w, win_h, win_w, D).transpose(2, 3).reshape(BH, H + pad_h, W + pad_w, D)
    return x[:, :H, :W] if pad_h or pad_w else x


def window_key_mask(hw: Tuple[int, int], window_size: int,
                    device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """``[n_windows, 1, win_h*win_w]`` bool, True for real tokens; None when nothing is padded."""
    H, W = hw
    win_h, win_w, pad_h, pad_w = _window_layout(H, W, window_size)
    if not (pad_h or pad_w):
        return None
    valid = torch.zeros(H + pad_h, W + pad_w, dtype=torch.bool, device=device)
    valid[:H, :W] = True
    n_h, n_w = (H + pad_h) // win_h, (W + pad_w) // win_w
    return valid.view(n_h, win_h, n_w, win_w).transpose(1, 2).reshape(n_h * n_w, 1, win_h * win_w)


def sema_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                         window_size: int, scale: Optional[float] = None,
                         with_mean: bool = True) -> torch.Tensor:
    """Windowed softmax attention plus the broadcast mean of all values.

    Does not validate its inputs (``sema_attention`` does); works for any float dtype and
    device and is differentiable.

    Args:
        q, k, v: ``[B, heads, N, D]`` with ``N = H * W`` tokens in row-major order.
        hw: the token grid ``(H, W)``.
        window_size: side of the non-overlapping windows tiled from the top-left corner; the last
            row/column of windows may be partial (padded keys get zero weight).
        scale: logit scale, ``D ** -0.5`` by default.
        with_mean: add ``mean_j v_j`` over the N real tokens to every output token.

    Returns:
        ``[B, heads, N, D]``.
    """
    B, nh, N, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    q_w, k_w, v_w = (window_partition(x, hw, window_size) for x in (q, k, v))  # [BH, nW, L, D]
    mask = window_key_mask(hw, window_size, q.device)  # [nW, 1, L] or None
    out = window_attention(q_w, k_w, v_w, mask, scale)  # [BH, nW, L, D]
    out = window_merge(out, hw, window_size)  # [BH, H, W, D]
    if with_mean:
        # the add also materialises the (maybe strided) merged view
        out = out + v.mean(dim=2).reshape(B * nh, 1, 1, D)
    return out.reshape(B, nh, N, D)
