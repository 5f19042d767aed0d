"""Core-periphery attention's declarations for the cross-op tools (see
:mod:`mmeffattn.ops._spec`)."""
import math
from typing import Any, Dict, Optional, Tuple

import torch

from .._spec import DTYPES, AotSpec, OpSpec, randn, sdpa_macs, square_grid
from .op import core_periphery_attention, core_periphery_triton_reasons

#: VECA's largest core budget (benchmarks)
NUM_CORES = 64


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
         **kwargs: Any) -> int:
    """The C cores attend over all ``C + N`` keys, the N patches over the C cores only."""
    B, nh, T, D = q.shape
    C = int(num_cores)
    return sdpa_macs(B * nh, C, T, D, v.shape[-1]) + sdpa_macs(B * nh, T - C, C, D, v.shape[-1])


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """``[B, heads, C + N, D]`` q, k, v with :data:`NUM_CORES` cores before the N patches."""
    hw = square_grid(n)
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(s.batch, s.heads, N + NUM_CORES, s.head_dim, device=device,
                           dtype=dtype) for _ in range(3))
    return (lambda b: core_periphery_attention(q, k, v, NUM_CORES, backend=b),
            macs(q, k, v, NUM_CORES), 4 * q.numel() * q.element_size(),
            dict(N=N, grid=list(hw), tokens=N + NUM_CORES, num_cores=NUM_CORES))


def gpu_check(B: int, h: int, C: int, N: int, D: int):
    def make(device, dtype):
        x = [randn(B, h, C + N, D, device=device, dtype=dtype) for _ in range(3)]
        ang = torch.rand(1, C + N, D // 2, device=device).repeat_interleave(2, -1) * 6.28
        rope = (ang.cos(), ang.sin())
        return (lambda b, q, k, v: core_periphery_attention(q, k, v, C, rope=rope, backend=b),
                x)
    return make


def implied_weights(q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int], rows: torch.Tensor,
                    num_cores: int = 16,
                    cores: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                    **_: Any) -> torch.Tensor:
    """A patch reads the C cores only; the cores read every token. The implied weight of patch
    ``j`` for patch ``i`` is the two-hop ``sum_c A[i, c] B[c, j]`` (patch -> core -> patch), with
    ``A`` the patch-to-core and ``B`` the core-to-patch softmax. Without a VECA model
    (``cores`` None) the cores are the tokens average pooled to a ``sqrt(C) x sqrt(C)`` grid."""
    from mmeffattn.analysis.dispersion import pool_grid
    scale = q.shape[-1] ** -0.5
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    if cores is None:
        side = max(1, round(math.sqrt(num_cores)))
        cell = max(1, math.ceil(max(hw) / side))
        q_c, k_c = pool_grid(q, hw, cell), pool_grid(k, hw, cell)
    else:
        q_c, k_c = cores
    to_cores = ((qs @ k_c.transpose(-2, -1)) * scale).softmax(-1)  # [B, h, R, C]
    # a core reads cores and patches; keep its weights on the patches (renormalised) so the
    # two hops give a distribution over the N patches
    keys = torch.cat([k_c, k], dim=2)  # [B, h, C + N, D]
    from_cores = ((q_c @ keys.transpose(-2, -1)) * scale).softmax(-1)[..., k_c.shape[2]:]
    from_cores = from_cores / from_cores.sum(-1, keepdim=True)  # [B, h, C, N]
    return to_cores @ from_cores


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation
# ---------------------------------------------------------------------------------------------
def aot_case(D, C, dtype, rope='batch', splits=None, N=196) -> Dict[str, Any]:
    """``rope``: None, ``'batch'`` for ``[B, C + N, D]`` tables or ``'shared'`` for
    ``[1, C + N, D]``; ``splits``: None for the launchers' default, or a count forced to compile
    the split path."""
    return dict(op='core_periphery_attention', D=D, C=C, N=N, dtype=dtype, rope=rope,
                splits=splits)


def aot_record(case: Dict[str, Any]) -> list:
    """The launches of one forward + backward on views of ``[B, C + N, heads, D]``
    projections, as the VECA backbone passes them."""
    from . import function
    dtype = DTYPES[case['dtype']]
    B, heads, C, D = 2, 2, case['C'], case['D']
    L = C + case['N']
    q, k, v = (torch.empty(B, L, heads, D, dtype=dtype).transpose(1, 2) for _ in range(3))
    cos = sin = None
    if case['rope']:
        cos, sin = (torch.empty(B if case['rope'] == 'batch' else 1, L, D, dtype=dtype)
                    for _ in range(2))
    scale = D ** -0.5
    with function.record_launches() as launches:
        o, lse = function.core_periphery_fwd(q, k, v, cos, sin, C, scale, splits=case['splits'])
        function.core_periphery_bwd(torch.empty_like(o), q, k, v, cos, sin, o, lse, C, scale,
                                    splits=case['splits'])
    return launches


# Only the tile class changes the compiled code: dtype, padded head dim BD and whether D == BD,
# the core block (next_pow2(C), 16 at least, capped at the long block), rope or not, and for the
# core rows' long loops whether they write the final tensors or fp32 partials (a split), plus
# Triton's alignment specialisation of pointers and strides. C in {8, 20, 64} reaches every core
# block (16, 32, 64; fp32 caps at 32, so 64 cores are two blocks there). The subset: VECA-S and
# VECA-B (head dim 64) with 8 and 64 cores and per-sample tables in every dtype, plus a
# broadcast table, the split path and no rope.
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(64, 8, 'fp16'), aot_case(64, 64, 'fp16'), aot_case(64, 64, 'bf16'),
            aot_case(64, 8, 'bf16'), aot_case(64, 8, 'fp32'), aot_case(64, 64, 'fp32', 'shared'),
            aot_case(64, 64, 'fp16', None, splits=2), aot_case(64, 64, 'bf16', 'batch', splits=2)],
    full=[aot_case(D, C, dtype, rope, splits=splits)
          for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
          for dtype in ('fp16', 'bf16', 'fp32')
          for C in (8, 20, 64)
          for rope in (None, 'batch', 'shared')
          for splits in (None, 2)],
    kernels=frozenset({'core_periphery_fwd_kernel', 'core_periphery_bwd_dq_kernel',
                       'core_periphery_bwd_dkdv_kernel', 'softmax_bwd_delta_kernel'}))

SPEC = OpSpec(
    name='core_periphery_attention', macs=macs, can_run=core_periphery_triton_reasons,
    # VECA-S (C=64) at 224 and 512
    gpu_checks=[('core_periphery B8-H6-C64-N196-D64', gpu_check(8, 6, 64, 196, 64)),
                ('core_periphery B2-H6-C64-N1024-D64', gpu_check(2, 6, 64, 1024, 64))],
    benchmarks={'core_periphery': benchmark}, benchmark_settings=dict(num_cores=NUM_CORES),
    attention_kinds={'core_periphery': implied_weights}, aot=AOT)
