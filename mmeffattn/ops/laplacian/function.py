"""Launchers and the autograd Function of the Triton Laplacian-kernel kernels.

Importing this module needs Triton (``op.py`` guards it). The kernels run compiled on CUDA
tensors and interpreted on CPU tensors when Triton's interpreter is on.

Forward: one launch of ``laplacian_fwd_kernel``; the output is saved for the backward (it is the
``out_ij`` factor of the gradient, so nothing is recomputed). Backward: two launches of
``laplacian_bwd_kernel``, for dx and, with the roles swapped, for dy.
"""
import math
from typing import Dict, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._common import INT32_LIMIT, bh_strides as _bh_strides, token_offsets_fit
from .._launch import (KernelConfig, Launch, device_guard as _device_guard,  # noqa: F401
                       launch as _launch, next_pow2 as _next_pow2, record_launches,
                       unit_last_stride as _unit_last_stride)
from . import kernels


def laplacian_kernel_configs(D: int) -> Dict[str, KernelConfig]:
    """The configurations the launchers use, by role: ``'fwd'``, ``'bwd_dx'``, ``'bwd_dy'``
    (the last two are the same kernel).

    A 3-D difference block of ``BN x BM x BD`` fp32 values is live in registers: 8192 of them,
    over 4 warps in the forward (64 per thread) and 8 warps in the backward (32 per thread: it
    also holds the ``g * out`` weights and the sign block; at 4 warps ptxas spilled some
    specialisations on sm_90), compiled without spills for sm_80 and sm_90
    (tests/ops/test_laplacian_aot.py). The forward sweeps D in chunks of at most 8 so that the
    token tile stays 32 x 32; the backward's D tile (a grid axis) is up to 16 wide.

    Args:
        D: the head dim.
    """
    bd_fwd = min(8, _next_pow2(D))
    bd_bwd = min(16, _next_pow2(D))
    fwd = KernelConfig(kernels.laplacian_fwd_kernel, dict(BN=32, BM=32, BD=bd_fwd),
                       num_warps=4, num_stages=2)
    bwd = KernelConfig(kernels.laplacian_bwd_kernel, dict(BN=32, BM=16, BD=bd_bwd),
                       num_warps=8, num_stages=2)
    return {'fwd': fwd, 'bwd_dx': bwd, 'bwd_dy': bwd}


def int32_offsets_fit(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether the offsets inside one ``(sample, head)`` of x, y and the ``[N, M]`` output fit
    the kernels' int32 arithmetic (the sample/head offset is int64)."""
    return token_offsets_fit(x, y) and x.shape[2] * y.shape[2] < INT32_LIMIT


def laplacian_fwd(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Forward launcher.

    Args:
        x: ``[B, heads, N, D]``, y: ``[B, heads, M, D]``, unit stride on D, one dtype.
        lam: kernel width.
    Returns:
        ``[B, heads, N, M]`` contiguous, x's dtype.
    """
    B, heads, N, D = x.shape
    M = y.shape[2]
    cfg = laplacian_kernel_configs(D)['fwd']
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
    """Backward launcher: ``(dx, dy)`` (None where not needed), contiguous, x's dtype.

    Args:
        g: gradient of the output ``[B, heads, N, M]`` (any strides).
        out: the forward's output.
    """
    B, heads, N, D = x.shape
    M = y.shape[2]
    cfgs = laplacian_kernel_configs(D)
    dx = dy = None
    gs, os_ = g.stride(), out.stride()
    with _device_guard(x):
        if needs_xy[0]:
            cfg = cfgs['bwd_dx']
            dx = torch.empty((B, heads, N, D), dtype=x.dtype, device=x.device)
            grid = (-(-N // cfg.constexprs['BN']) * -(-D // cfg.constexprs['BD']), B * heads)
            _launch('bwd_dx', cfg, grid, x, y, g, out, dx, *_bh_strides(x), *_bh_strides(y),
                    *gs, *os_, *_bh_strides(dx), heads, N, M, D, -1.0 / lam)
        if needs_xy[1]:  # the same kernel with x <-> y and g, out transposed (strides swapped)
            cfg = cfgs['bwd_dy']
            dy = torch.empty((B, heads, M, D), dtype=y.dtype, device=y.device)
            grid = (-(-M // cfg.constexprs['BN']) * -(-D // cfg.constexprs['BD']), B * heads)
            _launch('bwd_dy', cfg, grid, y, x, g, out, dy, *_bh_strides(y), *_bh_strides(x),
                    gs[0], gs[1], gs[3], gs[2], os_[0], os_[1], os_[3], os_[2],
                    *_bh_strides(dy), heads, M, N, D, -1.0 / lam)
    return dx, dy


class LaplacianKernelFunction(torch.autograd.Function):
    """Autograd wrapper of the Triton kernels (first-order gradients for x and y)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
        x, y = _unit_last_stride(x), _unit_last_stride(y)
        out = laplacian_fwd(x, y, lam)
        if any(ctx.needs_input_grad[:2]):
            ctx.save_for_backward(x, y, out)
        ctx.lam = lam
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, y, out = ctx.saved_tensors
        N, M = out.shape[2:]
        if (N - 1) * abs(g.stride(2)) + (M - 1) * abs(g.stride(3)) >= INT32_LIMIT:
            g = g.contiguous()  # an unusual upstream gradient is copied (int32 offsets)
        dx, dy = laplacian_bwd(g, x, y, out, ctx.lam, ctx.needs_input_grad[:2])
        return dx, dy, None


def laplacian_kernel_triton(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """The Laplacian kernel with the Triton kernels, no input validation (see
    ``op.laplacian_kernel``). Returns ``[B, heads, N, M]`` contiguous."""
    return LaplacianKernelFunction.apply(x, y, float(lam))
