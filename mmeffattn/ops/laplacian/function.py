"""Launchers of the Triton Laplacian-kernel kernels (autograd: ``library.py``).

Forward: one launch; its output is saved (it is the gradient's ``out_ij`` factor). Backward:
one launch writes dx and per-split partial sums of dy, summed by torch.
"""
import math
from typing import Dict, Optional, Tuple

import torch

from .._common import bh_strides as _bh_strides
from .._launch import (KernelConfig, device_guard as _device_guard, launch as _launch,
                       next_pow2 as _next_pow2)
from . import kernels


#: x rows per backward chunk, y rows per backward tile (at most), D columns per program (at most)
BWD_ROWS, BWD_MAX_COLS, BWD_MAX_D = 32, 64, 64
#: backward programs to aim for when splitting the x rows (two per SM of an H100)
BWD_TARGET_PROGRAMS = 264


def laplacian_kernel_configs(D: int, M: int = 64) -> Dict[str, KernelConfig]:
    """The launchers' configurations, ``'fwd'`` and ``'bwd'``, for head dim D and M y rows;
    spill-free on sm_80 and sm_90 (docs/design/ops_kernels.md)."""
    bm = min(BWD_MAX_COLS, max(16, _next_pow2(M)))
    fwd = KernelConfig(kernels.laplacian_fwd_kernel, dict(BN=64, BM=bm), num_warps=8,
                       num_stages=1)
    bwd = KernelConfig(kernels.laplacian_bwd_kernel,
                       dict(BR=BWD_ROWS, BM=bm, BD=min(BWD_MAX_D, max(16, _next_pow2(D))),
                            NEEDS_DX=True, NEEDS_DY=True),
                       num_warps=4, num_stages=1)
    return {'fwd': fwd, 'bwd': bwd}


def bwd_row_split(N: int, other_programs: int) -> int:
    """x rows per backward program: a multiple of ``BWD_ROWS``, as many as keeps at least
    :data:`BWD_TARGET_PROGRAMS` programs (fewer rows means more dy partial sums)."""
    splits = max(1, min(-(-N // BWD_ROWS), -(-BWD_TARGET_PROGRAMS // max(1, other_programs))))
    rows = -(-N // splits)
    return -(-rows // BWD_ROWS) * BWD_ROWS


def laplacian_fwd(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Forward: ``[B, heads, N, M]`` contiguous in x's dtype."""
    B, heads, N, D = x.shape
    M = y.shape[2]
    cfg = laplacian_kernel_configs(D, M)['fwd']
    out = torch.empty((B, heads, N, M), dtype=x.dtype, device=x.device)
    bn, bm = cfg.constexprs['BN'], cfg.constexprs['BM']
    grid = (-(-N // bn) * -(-M // bm), B * heads)
    with _device_guard(x):
        _launch('fwd', cfg, grid, x, y, out, *_bh_strides(x), *_bh_strides(y),
                *_bh_strides(out), heads, N, M, D, -math.log2(math.e) / lam)
    return out


def laplacian_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor,
                  lam: float, needs_xy: Tuple[bool, bool] = (True, True)
                  ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Backward: ``(dx, dy)`` (None where not needed), contiguous, x's dtype; ``out`` is the
    forward's output."""
    B, heads, N, D = x.shape
    M = y.shape[2]
    base = laplacian_kernel_configs(D, M)['bwd']
    cfg = KernelConfig(base.kernel, dict(base.constexprs, NEEDS_DX=needs_xy[0],
                                         NEEDS_DY=needs_xy[1]), base.num_warps, base.num_stages)
    n_d = -(-D // cfg.constexprs['BD'])
    rows = bwd_row_split(N, n_d * B * heads)
    n_split = -(-N // rows)
    dx = torch.empty((B, heads, N, D), dtype=x.dtype, device=x.device) if needs_xy[0] else None
    # the kernel writes contiguous [n_split, B*heads, M, D] fp32 partial sums; a single one is
    # allocated as [B, heads, M, D], so that it is dy itself for fp32 (not a view of a buffer)
    part_shape = (B, heads, M, D) if n_split == 1 else (n_split, B, heads, M, D)
    dy_part = (torch.empty(part_shape, dtype=torch.float32, device=x.device)
               if needs_xy[1] else out)
    with _device_guard(x):
        _launch('bwd', cfg, (n_split * n_d, B * heads), x, y, g, out,
                out if dx is None else dx, dy_part, *_bh_strides(x), *_bh_strides(y),
                *g.stride(), *out.stride(), heads, N, M, D, -1.0 / lam, rows, n_d)
    dy = None
    if needs_xy[1]:
        dy = (dy_part if n_split == 1 else dy_part.sum(0)).to(y.dtype)
    return dx, dy
