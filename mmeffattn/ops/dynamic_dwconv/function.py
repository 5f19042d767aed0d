"""Launchers of the Triton dynamic depthwise-convolution kernels (autograd: ``library.py``).

Forward: one fused launch. Backward: dx plus per-group partial sums of the kernel and bias
gradients (deterministic, no atomics), then a per-sample reduction that also back-propagates
the normalization; static kernel and bias gradients are sums over the samples.
"""
from typing import Dict, Optional, Tuple

import torch

from .._common import sample_offsets_fit
from .._launch import (KernelConfig, device_guard as _device_guard, launch as _launch,
                       next_pow2 as _next_pow2)
from . import kernels

#: (channels, pixels) per program of the forward and the backward; warps of both
FWD_TILE = (32, 64)
BWD_TILE = (32, 64)
NUM_WARPS = 8
#: channels per program of the reduction kernel
REDUCE_BLOCK_C = 32
#: most pixel tiles per backward program; fewest programs (two per SM of an H100)
BWD_MAX_TILES_PER_PROG, BWD_MIN_PROGRAMS = 16, 264
#: the backward's register cap (without it ptxas spilled 8 bytes on sm_80)
BWD_MAXNREG = 128


def bwd_tiles_per_prog(n_tiles: int, other_programs: int) -> int:
    """Pixel tiles per backward program (a program writes one set of partial sums)."""
    return max(1, min(n_tiles, BWD_MAX_TILES_PER_PROG,
                      n_tiles * other_programs // BWD_MIN_PROGRAMS))


def dynamic_dwconv_kernel_configs(channels: int, kernel_size: int, normalize: bool,
                                  has_weight: bool, has_bias: bool,
                                  needs_dx: bool = True, needs_dk: bool = True
                                  ) -> Dict[str, KernelConfig]:
    """The launchers' configurations by role: ``'fwd'``, ``'bwd'``, ``'bwd_reduce'`` (only
    when a kernel, weight or bias gradient is needed); spill-free on sm_80 and sm_90."""
    bc = min(FWD_TILE[0], _next_pow2(channels))
    bkk = _next_pow2(kernel_size ** 2 + 1)
    common = dict(K=kernel_size, NORMALIZE=normalize, HAS_WEIGHT=has_weight)
    configs = {
        'fwd': KernelConfig(kernels.dynamic_dwconv_fwd_kernel,
                            dict(common, BC=bc, BP=FWD_TILE[1], HAS_BIAS=has_bias),
                            num_warps=NUM_WARPS, num_stages=1),
        'bwd': KernelConfig(kernels.dynamic_dwconv_bwd_kernel,
                            dict(common, BC=min(BWD_TILE[0], bc), BP=BWD_TILE[1], BKK=bkk,
                                 NEEDS_DX=needs_dx, NEEDS_DK=needs_dk),
                            num_warps=NUM_WARPS, num_stages=1, maxnreg=BWD_MAXNREG),
    }
    if needs_dk:
        configs['bwd_reduce'] = KernelConfig(
            kernels.dynamic_dwconv_bwd_reduce_kernel,
            dict(K=kernel_size, BC=min(REDUCE_BLOCK_C, bc), BKK=bkk, NORMALIZE=normalize),
            num_warps=4, num_stages=1)
    return configs


def _flat_kernel(kernel: torch.Tensor) -> torch.Tensor:
    """``[B, C, K, K]`` -> contiguous ``[B, C, K*K]``."""
    return kernel.reshape(kernel.shape[0], kernel.shape[1], -1).contiguous()


def dynamic_dwconv_fwd(x: torch.Tensor, kernel: torch.Tensor, bias: Optional[torch.Tensor],
                       weight: Optional[torch.Tensor], normalize: bool) -> torch.Tensor:
    """Forward: ``[B, C, H, W]`` in x's dtype and memory layout."""
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    cfg = dynamic_dwconv_kernel_configs(C, K, normalize, weight is not None,
                                        bias is not None)['fwd']
    out = torch.empty_like(x)
    k = _flat_kernel(kernel)
    w = k if weight is None else weight.reshape(C, K * K).contiguous()
    b = k if bias is None else bias.contiguous()
    grid = (-(-H * W // cfg.constexprs['BP']), -(-C // cfg.constexprs['BC']), B)
    with _device_guard(x):
        _launch('fwd', cfg, grid, x, k, w, b, out, *x.stride(), k.stride(0), *out.stride(),
                C, H, W)
    return out


def dynamic_dwconv_bwd(dy: torch.Tensor, x: torch.Tensor, kernel: torch.Tensor,
                       weight: Optional[torch.Tensor], normalize: bool, has_bias: bool,
                       needs: Tuple[bool, bool, bool, bool] = (True, True, True, True)
                       ) -> Tuple[Optional[torch.Tensor], ...]:
    """Backward launcher: ``(dx, dkernel, dbias, dweight)`` for the inputs ``needs`` flags (in
    that order), None for the others; each in its input's dtype and shape."""
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    needs = (needs[0], needs[1], needs[2] and has_bias, needs[3] and weight is not None)
    needs_dx = needs[0]
    needs_dk = any(needs[1:])
    cfgs = dynamic_dwconv_kernel_configs(C, K, normalize, weight is not None, has_bias,
                                         needs_dx, needs_dk)
    k = _flat_kernel(kernel)
    w = k if weight is None else weight.reshape(C, K * K).contiguous()
    if not sample_offsets_fit(dy):  # x was checked; an unusual upstream gradient is copied
        dy = dy.contiguous()
    cfg = cfgs['bwd']
    n_tiles = -(-H * W // cfg.constexprs['BP'])
    n_cb = -(-C // cfg.constexprs['BC'])
    per_prog = bwd_tiles_per_prog(n_tiles, n_cb * B)
    n_groups = -(-n_tiles // per_prog)
    dx = torch.empty_like(x) if needs_dx else None
    dx_arg = dx if needs_dx else x
    part = (torch.empty((B, n_groups, C, K * K + 1), dtype=torch.float32, device=x.device)
            if needs_dk else k)
    dkernel = dbias = dweight = None
    with _device_guard(x):
        _launch('bwd', cfg, (n_groups, n_cb, B),
                x, k, w, dy, dx_arg, part, *x.stride(), k.stride(0), *dy.stride(),
                *dx_arg.stride(), C, H, W, n_tiles, per_prog, n_groups)
        if needs_dk:
            red_cfg = cfgs['bwd_reduce']
            # dk [B, C, K*K] for the kernel, as a view of a new [B, C, K, K]: dkernel is then
            # that tensor, not a view
            dkernel_buf = torch.empty(kernel.shape, dtype=k.dtype, device=k.device)
            dk = dkernel_buf.view(k.shape)
            red = torch.empty((B, C, K * K + 1), dtype=torch.float32, device=x.device)
            _launch('bwd_reduce', red_cfg, (-(-C // red_cfg.constexprs['BC']), B),
                    k, part, dk, red, k.stride(0), C, n_groups)
            if needs[1]:
                dkernel = dkernel_buf
            if needs[2]:
                dbias = red[:, :, K * K].sum(dim=0)
            if needs[3]:  # (shaped before the sum, whose result is then new, not a view)
                dweight = red[:, :, :K * K].unflatten(2, weight.shape[1:]).sum(dim=0).to(
                    weight.dtype)
    return dx, dkernel, dbias, dweight
