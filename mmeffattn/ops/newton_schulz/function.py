"""Launchers of the Triton Newton-Schulz kernels (autograd: ``library.py``).

Up to ``op.MAX_TRITON_M`` the kernels run in fp32: small matrices one program each, in
registers; larger ones over row blocks, one launch per step (larger matrices run the torch
backend). Plan and memory: docs/design/ops_kernels.md.
"""
from typing import Dict, Optional, Tuple

import torch

from .._launch import KernelConfig, device_guard as _device_guard, launch as _launch
from .._launch import next_pow2 as _next_pow2
from . import kernels
from .naive import ALPHA_NUM

#: three TF32 products per fp32 product, about fp32 accuracy (docs/design/ops_kernels.md)
DEFAULT_INPUT_PRECISION = 'tf32x3'
#: largest padded size MP kept whole in registers (one program per matrix)
MAX_REGISTER_MP = {'fwd': 32, 'bwd': 32}
REGISTER_WARPS = {'fwd': {16: 4, 32: 4}, 'bwd': {16: 2, 32: 8}}
#: warps of the multi-program kernels by MP (at MP = 256, 4 warps needed over 230 registers)
TILED_WARPS = {16: 4, 32: 4, 64: 4, 128: 4, 256: 8}
#: the kernels' only dtype: launchers copy into zero-padded fp32 ``[B*heads, MP, MP]`` buffers
KERNEL_DTYPE = torch.float32
ROW_BLOCK = 16  # BR: rows per program of the multi-program kernels
CHUNK = 32  # BK: width of the chunks their products accumulate over


def padded_size(M: int) -> int:
    """M padded to a power of two >= 16 (the smallest tl.dot tile)."""
    return max(16, _next_pow2(M))


def newton_schulz_kernel_configs(M: int, store_iterates: bool = True,
                                 input_precision: str = DEFAULT_INPUT_PRECISION
                                 ) -> Dict[str, KernelConfig]:
    """The launchers' configurations by role: ``'fwd'``, ``'bwd'``
    (whole-matrix up to :data:`MAX_REGISTER_MP`, else per-step kernels with ``'fwd_init'``,
    ``'bwd_q'`` and ``'bwd_alpha'``)."""
    mp = padded_size(M)
    common = dict(MP=mp, INPUT_PRECISION=input_precision)
    tiled = dict(common, BR=min(ROW_BLOCK, mp), BK=min(CHUNK, mp))
    small = dict(MP=mp, BR=min(ROW_BLOCK, mp))
    def config(kernel, constexprs: dict, num_warps: int) -> KernelConfig:
        return KernelConfig(kernel, constexprs, num_warps=num_warps, num_stages=1)

    configs = {}
    if mp <= MAX_REGISTER_MP['fwd']:  # one program per matrix, the iteration in registers
        configs['fwd'] = config(kernels.newton_schulz_fwd_kernel,
                                dict(common, STORE_ITERATES=store_iterates),
                                REGISTER_WARPS['fwd'][mp])
    else:  # row blocks of each matrix over several programs, one launch per step
        configs['fwd_init'] = config(kernels.newton_schulz_init_kernel, small, TILED_WARPS[mp])
        configs['fwd'] = config(kernels.newton_schulz_step_kernel, tiled, TILED_WARPS[mp])
    if mp <= MAX_REGISTER_MP['bwd']:
        configs['bwd'] = config(kernels.newton_schulz_bwd_kernel, common,
                                REGISTER_WARPS['bwd'][mp])
    else:
        for role, kernel, constexprs in (('bwd_q', kernels.newton_schulz_bwd_q_kernel, tiled),
                                         ('bwd', kernels.newton_schulz_bwd_step_kernel, tiled),
                                         ('bwd_alpha', kernels.newton_schulz_bwd_alpha_kernel,
                                          small)):
            configs[role] = config(kernel, constexprs, TILED_WARPS[mp])
    return configs


def _is_tiled(cfg: KernelConfig) -> bool:
    return 'BR' in cfg.constexprs


def _padded(x: torch.Tensor, mp: int) -> torch.Tensor:
    """``[B, heads, M, M]`` -> contiguous fp32 ``[B*heads, MP, MP]``, zero outside the real
    block (a view when x already is that)."""
    B, heads, M, _ = x.shape
    if M == mp and x.dtype == KERNEL_DTYPE and x.is_contiguous():
        return x.view(B * heads, mp, mp)
    out = x.new_zeros((B * heads, mp, mp), dtype=KERNEL_DTYPE)
    out.view(B, heads, mp, mp)[:, :, :M, :M] = x
    return out


def _new_result(a: torch.Tensor, mp: int, zero: bool = False) -> torch.Tensor:
    """A new fp32 ``[B, heads, MP, MP]`` result buffer, shaped so that for ``M == MP`` in fp32
    :func:`_unpadded` returns it as is (no copy, no view)."""
    B, heads = a.shape[:2]
    new = a.new_zeros if zero else a.new_empty
    return new((B, heads, mp, mp), dtype=KERNEL_DTYPE)


def _unpadded(x: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`_padded`: a new contiguous tensor, never a view of ``x``."""
    M = shape[-1]
    if M == x.shape[-1] and x.dtype == dtype:
        return x
    # copy=True: ``to`` returns the strided block as is when the dtype does not change
    return x[:, :, :M, :M].to(dtype, memory_format=torch.contiguous_format, copy=True)


def newton_schulz_fwd(a: torch.Tensor, iters: int, eps: float, store_iterates: bool,
                      input_precision: str = DEFAULT_INPUT_PRECISION
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Forward: ``(out, ws)``; out contiguous in a's dtype, ws fp32 ``[B*heads, iters, MP,
    MP]`` with ``V_k`` in slot k (None unless ``store_iterates``)."""
    B, heads, M, _ = a.shape
    BH = B * heads
    cfgs = newton_schulz_kernel_configs(M, store_iterates, input_precision)
    cfg = cfgs['fwd']
    mp = cfg.constexprs['MP']
    a_pad = _padded(a, mp)
    result = _new_result(a, mp)
    out = result.view(BH, mp, mp)
    with _device_guard(a):
        if _is_tiled(cfg):
            # V_k in slot k (kept) or ping-pong slots; the last step writes straight to out
            ws = a_pad.new_empty((BH, iters if store_iterates else min(iters, 2), mp, mp))
            grid = (mp // cfg.constexprs['BR'], BH)
            slot = (lambda k: ws[:, k]) if store_iterates else (lambda k: ws[:, k % 2])
            dst = out if iters == 0 else slot(0)
            _launch('fwd_init', cfgs['fwd_init'], grid, a_pad, dst, dst.stride(0), M, eps,
                    ALPHA_NUM)
            for k in range(iters):
                src, dst = dst, (out if k == iters - 1 else slot(k + 1))
                _launch('fwd', cfg, grid, a_pad, src, dst, src.stride(0), dst.stride(0), M, eps)
        else:
            ws = a_pad.new_empty((BH, iters if store_iterates else 0, mp, mp))
            _launch('fwd', cfg, (BH,), a_pad, out, ws, M, iters, eps, ALPHA_NUM)
    return _unpadded(result, a.shape, a.dtype), (ws if store_iterates else None)


def newton_schulz_bwd(g: torch.Tensor, a: torch.Tensor, ws: Optional[torch.Tensor], iters: int,
                      eps: float, input_precision: str = DEFAULT_INPUT_PRECISION
                      ) -> torch.Tensor:
    """Backward: dL/da contiguous in a's dtype; ws: the forward's iterates (None if no iters)."""
    B, heads, M, _ = a.shape
    BH = B * heads
    cfgs = newton_schulz_kernel_configs(M, True, input_precision)
    cfg = cfgs['bwd']
    mp = cfg.constexprs['MP']
    a_pad, g_pad = _padded(a, mp), _padded(g, mp)
    if ws is None:  # iters == 0: nothing stored, nothing read
        ws = a_pad.new_empty((BH, 0, mp, mp))
    result = _new_result(a, mp, zero=_is_tiled(cfg))
    da = result.view(BH, mp, mp)
    with _device_guard(a):
        if _is_tiled(cfg):
            # G ping-pongs between two buffers (g_pad is G at the start), Q = V^T G of the
            # current step, dP accumulated in place in the zeroed da (then turned into da in place)
            scratch = a_pad.new_empty((3, BH, mp, mp))
            s_q = scratch[2]
            grid = (mp // cfg.constexprs['BR'], BH)
            s_g = g_pad
            for kk in range(iters):
                s_v = ws[:, iters - 1 - kk]
                s_gn = scratch[kk % 2]
                _launch('bwd_q', cfgs['bwd_q'], grid, s_v, s_g, s_q, s_v.stride(0),
                        s_g.stride(0))
                _launch('bwd', cfg, grid, a_pad, s_v, s_g, s_q, s_gn, da, s_v.stride(0),
                        s_g.stride(0), M, eps)
                s_g = s_gn
            _launch('bwd_alpha', cfgs['bwd_alpha'], grid, a_pad, s_g, da, da, s_g.stride(0), M,
                    eps, ALPHA_NUM)
        else:
            _launch('bwd', cfg, (BH,), a_pad, g_pad, ws, da, M, iters, ws.shape[1], eps,
                    ALPHA_NUM)
    return _unpadded(result, a.shape, a.dtype)
