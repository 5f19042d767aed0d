"""Launchers of the Triton SEMA attention kernels (their autograd is registered with the custom
operators in ``library.py``).

Importing this module needs Triton (``op.py`` guards it). The kernels run compiled on CUDA
tensors and interpreted on CPU tensors when Triton's interpreter is on.
"""
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from .._common import bh_strides as _strides
from .._common import check_token_offsets as _check_int32_offsets
from .._common_kernels import delta_config, softmax_bwd_delta
from .._launch import (KernelConfig, Launch, device_guard as _device_guard,  # noqa: F401
                       launch as _launch, next_pow2 as _next_pow2, record_launches,
                       unit_last_stride as _unit_last_stride)
from . import kernels

#: default ``tl.dot`` input precision for fp32: exact fp32 ('ieee'), not TF32.
DEFAULT_INPUT_PRECISION = 'ieee'


class WindowGeometry(NamedTuple):
    """How an ``H x W`` grid is tiled by windows of side ``window_size``.

    Windows are ``win_h x win_w`` with ``win_h = min(window_size, H)`` (likewise for W): a grid
    smaller than the window is one window of the grid's own size, which is the same partition.
    """
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
    """Token block, warps and pipelining stages for padded head dim ``bd``.

    A window that fits one block (at most 64 tokens; 16 in fp32) is processed whole: one
    program per window, and the backward recomputes the softmax in one pass. Larger windows loop
    over blocks (online softmax forward; backward with saved log-sum-exp). fp32 ``tl.dot`` with
    ``'ieee'`` precision is an FMA loop that holds its operands in registers, so fp32 uses
    16-token blocks; fp16/bf16 run on tensor cores.

    The numbers come from an ahead-of-time search over warps/stages for sm_80 and sm_90 (ptxas
    of Triton 3.8): the first candidate in (4 warps, 8 warps) x (2, 1 stages) with no register
    spill for D == BD and D < BD, fp16 and bf16, with and without the mean. The full matrix is
    re-checked by ``tests/ops/test_sema_aot.py --run-slow``; the default run checks a subset.
    """
    one_block = max(16, _next_pow2(window_tokens))
    if dtype == torch.float32:
        # (the backward took 1 stage at BD == 32 until its gradients got two stride sets: with
        # them 1 stage spills on sm_90 at D < BD and 2 stages spill nowhere)
        return Tiles(16, 4, 4)
    if window_tokens <= 64:
        return Tiles(one_block, 8 if bd == 128 and one_block == 64 else 4,
                     4 if bd <= 32 or one_block == 32 else 8)
    if bd <= 32:
        return Tiles(64, 4, 4)
    return Tiles(32, 4 if bd == 64 else 8, 8)


def sema_kernel_configs(head_dim: int, window_tokens: int, dtype: torch.dtype, with_mean: bool,
                        input_precision: str = DEFAULT_INPUT_PRECISION,
                        return_mean: bool = False) -> Tuple[int, Dict[str, KernelConfig]]:
    """``(n_blocks, configs)``: blocks per window and the configurations the launchers use, by
    role: ``'fwd'``; ``'bwd'`` (``sema_bwd_window_kernel`` when a window is one block, else
    ``sema_bwd_kernel``); ``'bwd_preprocess'`` (only with several blocks per window).

    ``with_mean``: the op has the mean term (the backward adds its gradient to dv);
    ``return_mean``: the mean is returned rather than added (the forward writes the value
    partial sums instead of reading the mean, and the output, as stored, needs no correction in
    the backward's delta).
    """
    bd = max(16, _next_pow2(head_dim))
    tiles = sema_tiles(bd, window_tokens, dtype)
    n_blocks = -(-window_tokens // tiles.block)
    common = dict(BD=bd, EVEN_D=head_dim == bd, BLOCK=tiles.block, WITH_MEAN=with_mean,
                  INPUT_PRECISION=input_precision)
    fwd = dict(common, WITH_MEAN=with_mean and not return_mean, V_PARTIALS=return_mean)
    if n_blocks == 1:
        return n_blocks, {
            'fwd': KernelConfig(kernels.sema_fwd_window_kernel, fwd, tiles.fwd_warps, 1),
            'bwd': KernelConfig(kernels.sema_bwd_window_kernel, common, tiles.bwd_warps, 1)}
    return n_blocks, {
        'fwd': KernelConfig(kernels.sema_fwd_kernel, fwd, tiles.fwd_warps, tiles.fwd_stages),
        'bwd_preprocess': delta_config(head_dim, with_mean and not return_mean),
        'bwd': KernelConfig(kernels.sema_bwd_kernel, common, tiles.bwd_warps, tiles.bwd_stages)}


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def empty_out(q: torch.Tensor, out_layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, o)``: a new output tensor in ``out_layout`` (``'bhnd'`` ``[B, heads, N, D]`` or
    ``'bnhd'`` ``[B, N, heads, D]``, whose ``reshape(B, N, heads * D)`` for a following
    projection is a view) and its ``[B, heads, N, D]`` view, through whose strides the kernels
    store (so no transpose copy follows)."""
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
    """Forward launcher.

    Args:
        q, k, v: ``[B, heads, N, D]``, unit stride on D.
        out_layout: ``'bhnd'`` or ``'bnhd'``, the layout of ``o`` (:func:`empty_out`).
        return_mean: (with ``with_mean``) return the value mean instead of adding it to o.
    Returns:
        o (contiguous in ``out_layout``, q's dtype); lse ``[B*heads, N]`` fp32 log2-sum-exp
        (only when a window spans several blocks, else None); the value mean: None without
        ``with_mean``; ``[B*heads, D]`` fp32, added to every token inside the kernels; with
        ``return_mean``, ``[B, heads, D]`` in v's dtype, not added to o.
    """
    B, nh, N, D = q.shape
    n_blocks, cfgs = sema_kernel_configs(D, geom.window_tokens, q.dtype, with_mean,
                                         input_precision, return_mean)
    out, o = empty_out(q, out_layout)
    mean = v_sum = None
    if return_mean:
        # every forward program sums the value rows of its block (divided by N), which it
        # loads anyway: no pass over v; one sum of these n_win * n_blocks rows gives the mean
        v_sum = torch.empty((B * nh, geom.n_win * n_blocks, D), dtype=torch.float32,
                            device=q.device)
    elif with_mean:
        # every window's output adds the mean, so it must exist before any window is stored
        # (per-window partial sums would need a second pass over the output); written through
        # a view, as a reshape of mean's result would make this operator output a view
        mean = torch.empty((B * nh, D), dtype=torch.float32, device=q.device)
        torch.mean(v, dim=2, dtype=torch.float32, out=mean.view(B, nh, D))
    lse = (torch.empty((B * nh, N), dtype=torch.float32, device=q.device)
           if n_blocks > 1 else None)
    _check_int32_offsets(q, k, v, o)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(o))
    geometry = (nh, geom.H, geom.W, geom.win_h, geom.win_w, geom.n_win_w, geom.n_win)
    # any pointer where unused
    mean_arg = mean if mean is not None else o
    v_sum_arg = v_sum if v_sum is not None else o
    with _device_guard(q):
        if n_blocks == 1:
            _launch('fwd', cfgs['fwd'], (B * nh * geom.n_win,),
                    q, k, v, o, mean_arg, v_sum_arg, *strides, *geometry, scale, D)
        else:
            _launch('fwd', cfgs['fwd'], (B * nh * geom.n_win * n_blocks,),
                    q, k, v, o, mean_arg, lse, v_sum_arg, *strides, *geometry, n_blocks,
                    scale, D)
    if return_mean:
        mean = v_sum.view(B, nh, -1, D).sum(dim=2).to(v.dtype)  # [B, heads, D]
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
    """Backward launcher: ``(dq, dk, dv)``, each ``[B, heads, N, D]``. dv has v's strides when v
    is dense (``torch.empty_like``; e.g. the transposed ``[B, N, heads, D]`` view a backbone
    passes, so that the views' backward is a view again), else is contiguous; dq and dk are
    alike in v's layout, or, with ``dqk``, its two halves (:func:`qk_views`).

    ``do`` and ``o`` are in ``out_layout``; ``o``, ``lse`` (and ``mean`` with ``with_mean``) are
    the forward's outputs; ``o`` and ``lse`` are only read when a window spans several blocks.
    ``dqk``: an allocated ``[B, N, 2, heads, D]`` buffer with unit stride on D, the gradient of
    a packed qk (``sema_attention_qk``); the kernels store dq and dk straight into it, and since
    the two halves tile it exactly it needs no fill (nor autograd a ``stack`` of dq and dk).
    ``return_mean``: the forward returned the mean (o holds no mean); ``grad_mean``
    ``[B, heads, D]`` is its gradient (None: the mean did not reach the loss), which every dv
    gets divided by N instead of ``sum_n dO / N``.
    """
    B, nh, N, D = q.shape
    if return_mean:
        with_mean = grad_mean is not None  # a dv term only when the mean has a gradient
    n_blocks, cfgs = sema_kernel_configs(D, geom.window_tokens, q.dtype, with_mean,
                                         input_precision, return_mean)
    do = _unit_last_stride(as_bhnd(do, out_layout))
    dv = torch.empty_like(v, dtype=q.dtype)
    # dq and dk share one set of strides in the kernels (views of one packed buffer have)
    dq, dk = qk_views(dqk) if dqk is not None else (torch.empty_like(v, dtype=q.dtype)
                                                    for _ in range(2))
    if return_mean:
        # the mean's gradient as given (the kernels read it in its dtype, rows of D)
        g_mean = grad_mean.reshape(B * nh, D).contiguous() if with_mean else dv
    else:
        # the mean's gradient sum_n dO / N reaches every dv: the one reduction of the backward
        # (the kernels divide by N)
        g_mean = do.sum(dim=2, dtype=torch.float32).reshape(B * nh, D) if with_mean else dv
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
