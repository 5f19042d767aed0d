"""SEMA attention in fast PyTorch, the ``'torch'`` backend: the grid cut into rectangles of equal
windows (no padding, no mask), one copy into windows and one back per tensor, torch's fused
attention; index gathers for a symbolic grid. Layout choices: docs/design/sema.md."""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from .._common import (FUSED_MIN_KEYS, autocast_off, compute_dtype, is_symbolic,
                       window_attention)
from .naive import unbind_qk

#: one rectangle of equal windows: ``((row0, row1, win_h), (col0, col1, win_w))``
Region = Tuple[Tuple[int, int, int], Tuple[int, int, int]]


def window_regions(hw: Tuple[int, int], window_size: int) -> List[Region]:
    """SEMA's top-left window tiling of an ``H x W`` grid as at most four rectangles of equal
    windows: the full windows, then the short last column, row and corner of windows (a side
    smaller than the window is one window of that side)."""
    H, W = hw
    win_h, win_w = min(window_size, H), min(window_size, W)
    h_full, w_full = H - H % win_h, W - W % win_w
    rows = [(0, h_full, win_h)] + ([(h_full, H, H - h_full)] if h_full < H else [])
    cols = [(0, w_full, win_w)] + ([(w_full, W, W - w_full)] if w_full < W else [])
    return [(r, c) for r in rows for c in cols]


def _windows_view(x: torch.Tensor, region: Region) -> torch.Tensor:
    """The region of ``x [B, H, W, *rest]`` as ``[B, n_h, n_w, win_h, win_w, *rest]`` (a view)."""
    (r0, r1, win_h), (c0, c1, win_w) = region
    x = x[:, r0:r1, c0:c1]
    return x.unflatten(2, (-1, win_w)).unflatten(1, (-1, win_h)).transpose(2, 3)


def window_partition(x: torch.Tensor, region: Region) -> torch.Tensor:
    """``[B, H, W, *rest]`` -> the region's ``[B * n_windows, win_h * win_w, *rest]``: windows
    and the tokens in each row-major; one copy (a view when a window spans the region)."""
    x = _windows_view(x, region)
    return x.reshape(-1, x.shape[3] * x.shape[4], *x.shape[5:])


def window_reverse(windows: torch.Tensor, out: torch.Tensor, region: Region) -> None:
    """Write a region's windows (:func:`window_partition`'s layout) into ``out [B, H, W, *rest]``
    in place."""
    dst = _windows_view(out, region)
    dst.copy_(windows.view(dst.shape))


def _join(windows: Sequence[torch.Tensor], regions: Sequence[Region], shape: Sequence[int],
          stride: Optional[Sequence[int]]) -> torch.Tensor:
    out = windows[0].new_empty(shape) if stride is None else \
        windows[0].new_empty_strided(shape, stride)
    for w, region in zip(windows, regions):
        window_reverse(w, out, region)
    return out


def _regions(flat: Sequence[int]) -> List[Region]:
    """Regions from a flat int list (six per region), as the custom operators take them."""
    return [((flat[i], flat[i + 1], flat[i + 2]), (flat[i + 3], flat[i + 4], flat[i + 5]))
            for i in range(0, len(flat), 6)]


# With a gradient, the split and join run as custom operators whose backward writes each
# region's gradient once (sliced regions made autograd zero-fill and add the whole grid per
# region and tensor); without one, and under torch.compile (which fuses the slices' backward),
# as plain copies.
@torch.library.custom_op('mmeffattn::sema_window_split', mutates_args=())
def _split_op(x: torch.Tensor, regions: List[int]) -> List[torch.Tensor]:
    parts = [window_partition(x, r) for r in _regions(regions)]
    return [p.clone() if p.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            else p for p in parts]  # (an operator's outputs may not alias its input)


@torch.library.custom_op('mmeffattn::sema_window_join', mutates_args=())
def _join_op(windows: List[torch.Tensor], regions: List[int], shape: List[int],
             stride: Optional[List[int]]) -> torch.Tensor:
    return _join(windows, _regions(regions), shape, stride)


@_split_op.register_fake
def _(x, regions):
    return [window_partition(x, r).clone() for r in _regions(regions)]


@_join_op.register_fake
def _(windows, regions, shape, stride):
    return windows[0].new_empty(shape) if stride is None else \
        windows[0].new_empty_strided(shape, stride)


def _split_setup(ctx, inputs, output) -> None:
    ctx.shape, ctx.regions = inputs[0].shape, inputs[1]


def _split_backward(ctx, grads):
    return _join(grads, _regions(ctx.regions), ctx.shape, None), None  # (every part is used)


def _join_setup(ctx, inputs, output) -> None:
    ctx.regions = inputs[1]


def _join_backward(ctx, grad):
    return [window_partition(grad, r) for r in _regions(ctx.regions)], None, None, None


_split_op.register_autograd(_split_backward, setup_context=_split_setup)
_join_op.register_autograd(_join_backward, setup_context=_join_setup)


def _flat(regions: Sequence[Region]) -> List[int]:
    return [int(v) for (rows, cols) in regions for v in (*rows, *cols)]


def _needs_grad(tensors: Sequence[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def window_split(x: torch.Tensor, regions: Sequence[Region]) -> Tuple[torch.Tensor, ...]:
    """Each region's windows of ``x [B, H, W, *rest]`` (:func:`window_partition`), one copy
    per region and one gradient pass back."""
    if torch.compiler.is_compiling() or not _needs_grad([x]):
        return tuple(window_partition(x, r) for r in regions)
    return tuple(_split_op(x, _flat(regions)))


def window_join(windows: Sequence[torch.Tensor], regions: Sequence[Region],
                shape: Sequence[int], stride: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The regions' windows as one new ``shape`` ``[B, H, W, *rest]`` tensor, of ``stride``
    (default: contiguous); the inverse of :func:`window_split`."""
    if torch.compiler.is_compiling() or not _needs_grad(windows):
        return _join(windows, regions, shape, stride)
    return _join_op(list(windows), _flat(regions), [int(v) for v in shape],
                    None if stride is None else [int(v) for v in stride])


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


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            plain: bool = False) -> torch.Tensor:
    """Softmax attention of unpadded windows ``[BW, heads, L, D]`` (any strides): bf16 without a
    gradient takes torch's fused kernel too (1.3-1.9x faster than matmul + softmax at SEMA's
    windows; its backward is slower), else :func:`window_attention`. ``plain``: matmul + softmax
    whatever the key count (a compiled graph then does not depend on the grid's remainder)."""
    if plain:
        if q.dtype == torch.float16:  # (fp16 logits overflow past 65504)
            q, k = q.float(), k.float()
        logits = (q * scale) @ k.transpose(-1, -2)
        return torch.softmax(logits, dim=-1, dtype=compute_dtype(q.dtype)).to(v.dtype) @ v
    if (q.dtype == torch.bfloat16 and k.shape[-2] >= FUSED_MIN_KEYS and
            not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    return window_attention(q, k, v, None, scale)


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
    # [B, nh, D]; a 16-bit mean() copies v to fp32 first, while bf16's range holds the sum (its
    # reduction accumulates in fp32)
    mean = None if not with_mean else (v.sum(dim=2) / N if v.dtype == torch.bfloat16
                                       else v.mean(dim=2))
    add_mean = with_mean and not return_mean
    if is_symbolic(*hw):
        out = _sema_attention_symbolic(q, k, v, hw, window_size, scale)  # [BH, N, D]
        if add_mean:
            out = out + mean.reshape(B * nh, 1, D)
        out = out.reshape(B, nh, N, D)
        out = out.transpose(1, 2).contiguous() if out_layout == 'bnhd' else out
        return (out, mean) if return_mean else out
    H, W = hw
    regions = window_regions((H, W), window_size)
    # tokens-major [B, H, W, heads, D] views: the windows are copied in runs of heads * D;
    # per region [B*nW, heads, L, D] views of [B*nW, L, heads, D] copies, and the fused
    # kernel's output is tokens-major too, so the merge is a plain copy
    q_w, k_w, v_w = (window_split(x.transpose(1, 2).unflatten(1, (H, W)), regions)
                     for x in (q, k, v))
    # (compiled, the short last row and column of windows take the plain form: their key
    # counts are the grid's remainders)
    compiling = torch.compiler.is_compiling()
    outs = [_attend(*(t.transpose(1, 2) for t in qkv), scale, compiling and i > 0)
            for i, qkv in enumerate(zip(q_w, k_w, v_w))]
    outs = [o.transpose(1, 2) for o in outs]  # [B*nW, L, heads, D]
    # [B, H, W, nh, D] of a [B, N, nh, D] or [B, nh, N, D] tensor
    stride = None if out_layout == 'bnhd' else (nh * N * D, W * D, D, N * D, 1)
    out = window_join(outs, regions, (B, H, W, nh, D), stride)
    if add_mean:  # (in place: out is this function's own)
        out += mean.view(B, 1, 1, nh, D)
    out = out.flatten(1, 2) if out_layout == 'bnhd' else out.permute(0, 3, 1, 2, 4).flatten(2, 3)
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
