"""SEMA attention in fast PyTorch, the ``'torch'`` backend: windows as views, fused attention
(:func:`mmeffattn.ops._common.window_attention`), and index gathers for a symbolic grid."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from .._common import autocast_off, is_symbolic, window_attention
from .naive import unbind_qk


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


def window_gather_index(hw: Tuple[int, int], window_size: int,
                        device: Optional[torch.device] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The window partition as indices for a symbolic grid: ``idx [n_windows, ws**2]`` (N,
    a zero token, past the grid) and ``inv [N]``, each token's flat window position."""
    H, W = hw
    ws = window_size
    n_h, n_w = (H + ws - 1) // ws, (W + ws - 1) // ws
    # one flat arange: broadcasting two symbolic dims would make the exporter guard on them
    t = torch.arange(n_h * n_w * ws * ws, device=device)  # (window, row in it, col in it)
    # (and ``a - a // n * n`` for ``a % n`` with a symbolic n: ONNX export has no such remainder)
    win, row, col = t // (ws * ws), (t // ws) % ws, t % ws
    row, col = (win // n_w) * ws + row, (win - win // n_w * n_w) * ws + col  # grid position
    idx = torch.where((row < H) & (col < W), row * W + col, H * W)
    t = torch.arange(H * W, device=device)
    row = t // W
    col = t - row * W
    inv = ((row // ws) * n_w + col // ws) * (ws * ws) + (row % ws) * ws + col % ws
    return idx.view(n_h * n_w, ws * ws), inv


def _sema_attention_symbolic(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             hw: Tuple[int, int], window_size: int, scale: float) -> torch.Tensor:
    """The windowed softmax of :func:`sema_attention_torch` by gathering windows with
    :func:`window_gather_index` (no mean): ``[B, heads, N, D]`` -> ``[B*heads, N, D]``."""
    B, nh, N, D = q.shape
    idx, inv = window_gather_index(hw, window_size, q.device)
    nW, L = idx.shape  # (the -1 below is nW)

    def windows(x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x.reshape(B * nh, N, D), x.new_zeros(B * nh, 1, D)], dim=1)  # [BH, N+1, D]
        return x.index_select(1, idx.flatten()).view(B * nh, -1, L, D)

    mask = (idx < N).view(nW, 1, L)  # True = real key
    out = window_attention(windows(q), windows(k), windows(v), mask, scale)  # [BH, nW, L, D]
    # -1, not nW * L: onnxscript's optimizer turned that symbolic shape into the export size's
    return out.reshape(B * nh, -1, D).index_select(1, inv)  # [BH, N, D]


def _merge_tokens_major(x: torch.Tensor, B: int, nh: int, hw: Tuple[int, int],
                        window_size: int) -> torch.Tensor:
    """``[B*heads, n_windows, win_h*win_w, D]`` -> ``[B, H, W, heads, D]`` in one copy (the
    window merge and the heads-to-tokens transpose as one permute; possibly a sliced view)."""
    _, _, _, D = x.shape
    H, W = hw
    win_h, win_w, pad_h, pad_w = _window_layout(H, W, window_size)
    n_h, n_w = (H + pad_h) // win_h, (W + pad_w) // win_w
    x = x.view(B, nh, n_h, n_w, win_h, win_w, D).permute(0, 2, 4, 3, 5, 1, 6)
    x = x.reshape(B, H + pad_h, W + pad_w, nh, D)
    return x[:, :H, :W] if pad_h or pad_w else x


def sema_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                         window_size: int, scale: Optional[float] = None,
                         with_mean: bool = True, out_layout: str = 'bhnd',
                         return_mean: bool = False
                         ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Windowed softmax attention plus the mean of all values (unvalidated; arguments and
    result as ``sema_attention``; traceable with a symbolic grid; autocast off)."""
    with autocast_off(q.device.type):
        return _sema_attention_torch(q, k, v, hw, window_size, scale, with_mean, out_layout,
                                     return_mean)


def _sema_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          hw: Tuple[int, int], window_size: int, scale: Optional[float],
                          with_mean: bool, out_layout: str, return_mean: bool
                          ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sema_attention_torch` (same arguments), run as autocast leaves it."""
    B, nh, N, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    mean = v.mean(dim=2) if with_mean else None  # [B, nh, D]
    add_mean = with_mean and not return_mean
    if is_symbolic(*hw):
        out = _sema_attention_symbolic(q, k, v, hw, window_size, scale)  # [BH, N, D]
        if add_mean:
            out = out + mean.reshape(B * nh, 1, D)
        out = out.reshape(B, nh, N, D)
        out = out.transpose(1, 2).contiguous() if out_layout == 'bnhd' else out
        return (out, mean) if return_mean else out
    q_w, k_w, v_w = (window_partition(x, hw, window_size) for x in (q, k, v))  # [BH, nW, L, D]
    mask = window_key_mask(hw, window_size, q.device)  # [nW, 1, L] or None
    out = window_attention(q_w, k_w, v_w, mask, scale)  # [BH, nW, L, D]
    if out_layout == 'bnhd':
        out = _merge_tokens_major(out, B, nh, hw, window_size)  # [B, H, W, nh, D]
        if add_mean:
            out = out + mean.reshape(B, 1, 1, nh, D)
        out = out.reshape(B, N, nh, D)
    else:
        out = window_merge(out, hw, window_size)  # [BH, H, W, D]
        if add_mean:
            # the add also materialises the (maybe strided) merged view
            out = out + mean.reshape(B * nh, 1, 1, D)
        out = out.reshape(B, nh, N, D)
    return (out, mean) if return_mean else out


def sema_attention_qk_torch(qk: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                            window_size: int, scale: Optional[float] = None,
                            with_mean: bool = True, out_layout: str = 'bhnd',
                            return_mean: bool = False
                            ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sema_attention_torch` with q and k packed in ``qk`` ``[B, N, 2, heads, D]``."""
    return sema_attention_torch(*unbind_qk(qk), v, hw, window_size, scale=scale,
                                with_mean=with_mean, out_layout=out_layout,
                                return_mean=return_mean)
