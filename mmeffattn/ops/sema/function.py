"""Launchers of the Triton SEMA kernels (autograd: the custom operators in ``library.py``).
Needs Triton; CPU tensors run under Triton's interpreter."""
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from .._common import bh_strides as _strides
from .._common import check_token_offsets as _check_int32_offsets
from .._common_kernels import delta_config, softmax_bwd_delta
from .._launch import (KernelConfig, device_guard as _device_guard, launch as _launch,
                       next_pow2 as _next_pow2, unit_last_stride as _unit_last_stride)
from . import kernels

#: default ``tl.dot`` input precision for fp32: exact fp32 ('ieee'), not TF32.
DEFAULT_INPUT_PRECISION = 'ieee'


class WindowGeometry(NamedTuple):
    """How an ``H x W`` grid is tiled by ``win_h x win_w`` windows, ``win_h = min(window_size,
    H)`` (likewise W): a grid smaller than the window is one window, the same partition."""
    H: int
    W: int
    win_h: int
    win_w: int
    n_win_h: int
    n_win_w: int

    @property
    def n_win(self) -> int:
        return self.n_win_h * self.n_win_w

    @property
    def window_tokens(self) -> int:
        return self.win_h * self.win_w


def window_geometry(hw: Tuple[int, int], window_size: int) -> WindowGeometry:
    H, W = hw
    win_h, win_w = min(window_size, H), min(window_size, W)
    return WindowGeometry(H, W, win_h, win_w, -(-H // win_h), -(-W // win_w))


class Tiles(NamedTuple):
    block: int  # tokens per block (query and key tiles are BLOCK x BD, logits BLOCK x BLOCK)
    fwd_warps: int
    bwd_warps: int
    fwd_stages: int = 2  # software-pipelining stages of the several-block kernels' loops
    bwd_stages: int = 2


def sema_tiles(bd: int, window_tokens: int, dtype: torch.dtype) -> Tiles:
    """Token block, warps and stages for padded head dim ``bd``: a window of at most 64 tokens
    (16 in fp32, whose ``'ieee'`` dots are FMA loops) is one block, larger ones loop over
    blocks. The numbers: the first spill-free candidate of an AOT search on sm_80/sm_90
    (docs/design/sema_kernels.md), re-checked by ``tests/ops/test_aot.py``."""
    one_block = max(16, _next_pow2(window_tokens))
    if dtype == torch.float32:
        return Tiles(16, 4, 4)
    if window_tokens <= 64:
        return Tiles(one_block, 8 if bd == 128 and one_block == 64 else 4,
                     4 if bd <= 32 or one_block == 32 else 8)
    if bd <= 32:
        return Tiles(64, 4, 4)
    return Tiles(32, 4 if bd == 64 else 8, 8)


def sema_kernel_configs(head_dim: int, window_tokens: int, dtype: torch.dtype, mean: bool,
                        input_precision: str = DEFAULT_INPUT_PRECISION,
                        mean_in_out: bool = False) -> Tuple[int, Dict[str, KernelConfig]]:
    """``(n_blocks, configs)`` by launch role: ``'fwd'``, ``'bwd'`` and, with several blocks per
    window, ``'bwd_preprocess'``. ``mean``: the forward writes the value partial sums
    (V_PARTIALS), the backward adds the mean's gradient to dv (MEAN_GRAD); ``mean_in_out``:
    the launcher added the mean to o, which the delta pre-pass subtracts again."""
    bd = max(16, _next_pow2(head_dim))
    tiles = sema_tiles(bd, window_tokens, dtype)
    n_blocks = -(-window_tokens // tiles.block)
    common = dict(BD=bd, EVEN_D=head_dim == bd, BLOCK=tiles.block)
    fwd = dict(common, V_PARTIALS=mean, INPUT_PRECISION=input_precision)
    bwd = dict(common, MEAN_GRAD=mean, INPUT_PRECISION=input_precision)
    if n_blocks == 1:
        return n_blocks, {
            'fwd': KernelConfig(kernels.sema_fwd_window_kernel, fwd, tiles.fwd_warps, 1),
            'bwd': KernelConfig(kernels.sema_bwd_window_kernel, bwd, tiles.bwd_warps, 1)}
    return n_blocks, {
        'fwd': KernelConfig(kernels.sema_fwd_kernel, fwd, tiles.fwd_warps, tiles.fwd_stages),
        'bwd_preprocess': delta_config(head_dim, mean_in_out),
        'bwd': KernelConfig(kernels.sema_bwd_kernel, bwd, tiles.bwd_warps, tiles.bwd_stages)}


def empty_out(q: torch.Tensor, out_layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, o)``: a new tensor in ``out_layout`` (``'bhnd'`` or ``'bnhd'``) and its
    ``[B, heads, N, D]`` view, through whose strides the kernels store (no transpose copy)."""
    B, nh, N, D = q.shape
    if out_layout == 'bnhd':
        out = torch.empty((B, N, nh, D), dtype=q.dtype, device=q.device)
        return out, out.transpose(1, 2)
    out = torch.empty((B, nh, N, D), dtype=q.dtype, device=q.device)
    return out, out


def as_bhnd(x: torch.Tensor, out_layout: str) -> torch.Tensor:
    """The ``[B, heads, N, D]`` view of a tensor in ``out_layout`` (the output, its gradient)."""
    return x.transpose(1, 2) if out_layout == 'bnhd' else x


def sema_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, geom: WindowGeometry,
             scale: float, with_mean: bool, input_precision: str = DEFAULT_INPUT_PRECISION,
             out_layout: str = 'bhnd', return_mean: bool = False
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Forward launcher on q, k, v ``[B, heads, N, D]`` (unit stride on D): ``(o, lse, mean)``,
    o contiguous in ``out_layout``; lse ``[B*heads, N]`` fp32 (several blocks per window, else
    None); mean None without ``with_mean``, ``[B, heads, D]`` in v's dtype with
    ``return_mean`` (o without it), else the contiguous fp32 mean added to o here."""
    B, nh, N, D = q.shape
    n_blocks, cfgs = sema_kernel_configs(D, geom.window_tokens, q.dtype, with_mean,
                                         input_precision)
    out, o = empty_out(q, out_layout)
    # the forward programs sum the value rows they load anyway (divided by N): no pass over v
    v_sum = (torch.empty((B * nh, geom.n_win * n_blocks, D), dtype=torch.float32,
                         device=q.device) if with_mean else o)  # (any pointer when unused)
    lse = (torch.empty((B * nh, N), dtype=torch.float32, device=q.device)
           if n_blocks > 1 else None)
    _check_int32_offsets(q, k, v, o)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(o))
    geometry = (nh, geom.H, geom.W, geom.win_h, geom.win_w, geom.n_win_w, geom.n_win)
    with _device_guard(q):
        if n_blocks == 1:
            _launch('fwd', cfgs['fwd'], (B * nh * geom.n_win,),
                    q, k, v, o, v_sum, *strides, *geometry, scale, D)
        else:
            _launch('fwd', cfgs['fwd'], (B * nh * geom.n_win * n_blocks,),
                    q, k, v, o, lse, v_sum, *strides, *geometry, n_blocks, scale, D)
    if not with_mean:
        return out, lse, None
    mean = v_sum.view(B, nh, -1, D).sum(dim=2)  # [B, heads, D] fp32
    if return_mean:
        return out, lse, mean.to(v.dtype)
    o.add_(mean[:, :, None])  # (computed in fp32: one rounding)
    return out, lse, mean


def qk_views(qk: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)``: the ``[B, heads, N, D]`` views of a packed ``[B, N, 2, heads, D]`` tensor (a
    fused qk projection's output, or its gradient)."""
    return qk.select(2, 0).transpose(1, 2), qk.select(2, 1).transpose(1, 2)


def sema_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: Optional[torch.Tensor], lse: Optional[torch.Tensor], mean: Optional[torch.Tensor],
             geom: WindowGeometry, scale: float, with_mean: bool,
             input_precision: str = DEFAULT_INPUT_PRECISION, out_layout: str = 'bhnd',
             dqk: Optional[torch.Tensor] = None, grad_mean: Optional[torch.Tensor] = None,
             return_mean: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launcher: ``(dq, dk, dv)``, ``[B, heads, N, D]``; dv in v's strides when v is
    dense (so a view's backward stays a view), dq and dk alike or, with ``dqk`` (an allocated
    ``[B, N, 2, heads, D]`` gradient of a packed qk), its two halves, which tile it (no fill,
    no ``stack``). ``do``, ``o`` in ``out_layout``; ``o``, ``lse``, ``mean``: the forward's
    (o and lse read only with several blocks per window). ``return_mean``: ``grad_mean``
    ``[B, heads, D]`` is the returned mean's gradient (None: unused), else ``sum_n dO`` is."""
    B, nh, N, D = q.shape
    if return_mean:
        with_mean = grad_mean is not None  # a dv term only when the mean has a gradient
    n_blocks, cfgs = sema_kernel_configs(D, geom.window_tokens, q.dtype, with_mean,
                                         input_precision, with_mean and not return_mean)
    do = _unit_last_stride(as_bhnd(do, out_layout))
    dv = torch.empty_like(v, dtype=q.dtype)
    # dq and dk share one set of strides in the kernels (views of one packed buffer have)
    dq, dk = qk_views(dqk) if dqk is not None else (torch.empty_like(v, dtype=q.dtype)
                                                    for _ in range(2))
    if not with_mean:
        g_mean = dv  # (any pointer)
    elif return_mean:
        g_mean = grad_mean.reshape(B * nh, D).contiguous()  # read in its dtype
    else:  # the mean was added to o: its gradient is sum_n dO (the kernels divide by N)
        g_mean = do.sum(dim=2, dtype=torch.float32).reshape(B * nh, D)
    _check_int32_offsets(q, k, v, do, dq, dv)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
               *_strides(dv))
    geometry = (nh, geom.H, geom.W, geom.win_h, geom.win_w, geom.n_win_w, geom.n_win)
    with _device_guard(q):
        if n_blocks == 1:
            _launch('bwd', cfgs['bwd'], (B * nh * geom.n_win,),
                    q, k, v, do, dq, dk, dv, g_mean, *strides, *geometry, scale, D)
        else:
            # delta = dO . (o - mean): the output as the softmax made it
            delta = softmax_bwd_delta(cfgs['bwd_preprocess'], as_bhnd(o, out_layout), do,
                                      None if return_mean else mean)
            _launch('bwd', cfgs['bwd'], (B * nh * geom.n_win * n_blocks,),
                    q, k, v, do, dq, dk, dv, lse, delta, g_mean, *strides, *geometry,
                    n_blocks, scale, D)
    return dq, dk, dv
