"""Launchers of the Triton dynamic-weight kernels (autograd: ``library.py``).

Forward: one fused launch. Backward: ``dp = dL/d(v^T u)`` (recomputing ``R``), then
``du = v dp`` and ``dv = u dp^T`` with one batched-product kernel; the static weight's
gradient is ``sum_b g``.
"""
from typing import Dict, Optional, Tuple

import torch

from .._common import sample_offsets_fit
from .._launch import (KernelConfig, device_guard as _device_guard, launch as _launch,
                       next_pow2 as _next_pow2, unit_last_stride as _unit_last_stride)
from . import kernels

#: default ``tl.dot`` input precision for fp32: exact fp32 ('ieee'), not TF32.
DEFAULT_INPUT_PRECISION = 'ieee'
#: widest C_in tile held in one piece; wider inputs are swept (each tile computed twice)
MAX_BLOCK_I = 512
SWEEP_BLOCK_I = 128


def dynamic_weight_kernel_configs(c_in: int, c_out: int, dtype: torch.dtype,
                                  has_weight: bool = True,
                                  input_precision: str = DEFAULT_INPUT_PRECISION,
                                  max_block_i: Optional[int] = None) -> Dict[str, KernelConfig]:
    """The launchers' configurations by role: ``'fwd'``, ``'bwd_dp'``, ``'bwd_du'``,
    ``'bwd_dv'``; spill-free on sm_80 and sm_90. ``max_block_i``: widest column tile in one
    piece (default :data:`MAX_BLOCK_I`); wider inputs are swept."""
    max_block_i = MAX_BLOCK_I if max_block_i is None else max_block_i
    bi = max(16, _next_pow2(c_in))
    sweep = bi > max_block_i
    if sweep:
        bi = min(SWEEP_BLOCK_I, max_block_i)
    num_i_tiles = -(-c_in // bi)
    bm = 16 if dtype == torch.float32 else 32

    def rows(budget: int) -> int:
        return max(16, min(64, budget // bi, max(16, _next_pow2(c_out))))

    # The sweep (several column tiles, each computed twice) keeps smaller tiles and no software
    # pipelining: with both, ptxas spilled at some unaligned widths.
    bo_fwd, bo_bwd = (32, 16) if sweep else (rows(8192), rows(4096))
    stages = 1 if sweep else 2
    common = dict(BI=bi, BM=bm, NUM_I_TILES=num_i_tiles, INPUT_PRECISION=input_precision)
    warps = lambda bo: 8 if bo * bi >= 4096 or sweep else 4  # noqa: E731
    configs = {
        'fwd': KernelConfig(kernels.dynamic_weight_fwd_kernel,
                            dict(common, BO=bo_fwd, HAS_WEIGHT=has_weight),
                            num_warps=warps(bo_fwd), num_stages=stages),
        'bwd_dp': KernelConfig(kernels.dynamic_weight_bwd_dp_kernel, dict(common, BO=bo_bwd),
                               num_warps=warps(bo_bwd), num_stages=stages),
    }
    bmm = dict(BM=64, BN=64, BK=16 if dtype == torch.float32 else 32,
               INPUT_PRECISION=input_precision)
    bmm_cfg = KernelConfig(kernels.dynamic_weight_bmm_kernel, bmm, num_warps=4, num_stages=2)
    configs['bwd_du'] = configs['bwd_dv'] = bmm_cfg
    return configs


def dynamic_weight_fwd(u: torch.Tensor, v: torch.Tensor, s: float,
                       weight: Optional[torch.Tensor] = None,
                       input_precision: str = DEFAULT_INPUT_PRECISION) -> torch.Tensor:
    """Forward: ``[B, C_out, C_in]`` contiguous in u's dtype promoted with weight's;
    ``s = scale / n_tokens``."""
    B, M, C_in = u.shape
    C_out = v.shape[2]
    dtype = u.dtype if weight is None else torch.promote_types(u.dtype, weight.dtype)
    cfg = dynamic_weight_kernel_configs(C_in, C_out, u.dtype, weight is not None,
                                        input_precision)['fwd']
    out = torch.empty((B, C_out, C_in), dtype=dtype, device=u.device)
    w = out if weight is None else weight
    grid = (-(-C_out // cfg.constexprs['BO']), B)
    with _device_guard(u):
        _launch('fwd', cfg, grid, u, v, w, out,
                u.stride(0), u.stride(1), v.stride(0), v.stride(1), w.stride(-2),
                out.stride(0), out.stride(1), M, C_in, C_out, s)
    return out


def dynamic_weight_bwd(g: torch.Tensor, u: torch.Tensor, v: torch.Tensor, s: float,
                       needs_uv: Tuple[bool, bool] = (True, True),
                       input_precision: str = DEFAULT_INPUT_PRECISION
                       ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Backward: ``(du, dv)`` (None where not needed), contiguous, u's dtype."""
    B, M, C_in = u.shape
    C_out = v.shape[2]
    cfgs = dynamic_weight_kernel_configs(C_in, C_out, u.dtype, True, input_precision)
    g = _unit_last_stride(g)
    if not sample_offsets_fit(g):  # u and v were checked; an unusual upstream gradient is copied
        g = g.contiguous()
    dp = torch.empty((B, C_out, C_in), dtype=u.dtype, device=u.device)
    du = dv = None
    with _device_guard(u):
        cfg = cfgs['bwd_dp']
        _launch('bwd_dp', cfg, (-(-C_out // cfg.constexprs['BO']), B), u, v, g, dp,
                u.stride(0), u.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
                dp.stride(0), dp.stride(1), M, C_in, C_out, s)
        cfg = cfgs['bwd_du']
        bm, bn = cfg.constexprs['BM'], cfg.constexprs['BN']
        if needs_uv[0]:  # du [M, C_in] = v [M, C_out] @ dp [C_out, C_in]
            du = torch.empty((B, M, C_in), dtype=u.dtype, device=u.device)
            _launch('bwd_du', cfg, (-(-M // bm) * -(-C_in // bn), B), v, dp, du,
                    v.stride(0), v.stride(1), v.stride(2), dp.stride(0), dp.stride(1),
                    dp.stride(2), du.stride(0), du.stride(1), M, C_in, C_out)
        if needs_uv[1]:  # dv [M, C_out] = u [M, C_in] @ dp^T [C_in, C_out]
            dv = torch.empty((B, M, C_out), dtype=u.dtype, device=u.device)
            _launch('bwd_dv', cfgs['bwd_dv'], (-(-M // bm) * -(-C_out // bn), B), u, dp, dv,
                    u.stride(0), u.stride(1), u.stride(2), dp.stride(0), dp.stride(2),
                    dp.stride(1), dv.stride(0), dv.stride(1), M, C_out, C_in)
    return du, dv
