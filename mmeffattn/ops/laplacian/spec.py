"""The Laplacian kernel's declarations for the cross-op tools (see :mod:`mmeffattn.ops._spec`).

Its benchmark and attention kind are LaplacianFormer's whole Nystrom attention
(``laplacian_nystrom``): the kernel matrices of this op and the inverse of ``newton_schulz``,
both through the public ops.
"""
import math
from typing import Any, Dict, Tuple

import torch

from .._spec import DTYPES, AotSpec, Cost, OpSpec, Roofline, randn, square_grid
from .naive import laplacian_kernel_naive
from .op import laplacian_kernel, laplacian_triton_reasons

#: LaplacianFormer's first stage: landmark cell, kernel width, Newton-Schulz steps and eps, and
#: the landmark cap (larger grids pool larger cells)
LANDMARK_CELL, LAMBDA, NS_ITERS, NS_EPS = 8, 4., 20, 0.01
MAX_LANDMARKS = 128


def macs(x: torch.Tensor, y: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """An L1 distance (D differences and sums) for every (x_i, y_j) pair."""
    B, nh, N, D = x.shape
    return B * nh * N * y.shape[2] * D


def _cell(hw: Tuple[int, int]) -> int:
    from mmeffattn.models.backbones.laplacianformer import landmark_cell
    return landmark_cell(hw, LANDMARK_CELL, MAX_LANDMARKS)


def laplacian_nystrom(q: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                      backend: Any) -> torch.Tensor:
    """LaplacianFormer's attention: ``K(q, L) pinv(K(L, L)) K(L, q) v / N`` with landmarks
    ``L`` pooled as the backbone pools them, right to left (nothing ``N x N``)."""
    from mmeffattn.models.backbones.laplacianformer import pool_landmarks
    from mmeffattn.ops import newton_schulz_pinv
    lm = pool_landmarks(q, hw, _cell(hw))  # [B, h, M, D]
    k_ql = laplacian_kernel(q, lm, LAMBDA, backend=backend)  # [B, h, N, M]
    k_ll = laplacian_kernel(lm, lm, LAMBDA, backend=backend)  # [B, h, M, M]
    pinv = newton_schulz_pinv(k_ll, NS_ITERS, NS_EPS, backend=backend)
    return k_ql @ (pinv @ (k_ql.transpose(-2, -1) @ v)) / q.shape[-2]


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """``laplacian_nystrom`` on ``[B, heads, N, D]`` q, v (its keys are its queries)."""
    from mmeffattn.analysis.flops import op_macs
    hw = square_grid(n)
    N = hw[0] * hw[1]
    B, h, D = s.batch, s.heads, s.head_dim
    q, v = (torch.randn(B, h, N, D, device=device, dtype=dtype) for _ in range(2))
    M = math.ceil(hw[0] / _cell(hw)) * math.ceil(hw[1] / _cell(hw))
    lm = torch.empty(B, h, M, D)
    total = (macs(q, lm) + macs(lm, lm)
             + op_macs('newton_schulz_pinv', torch.empty(B, h, M, M), NS_ITERS, NS_EPS)
             + B * h * (2 * N * M * D + M * M * D))  # K^T v, pinv @ (.), K @ (.)
    return (lambda b: laplacian_nystrom(q, v, hw, b), total, 3 * q.numel() * q.element_size(),
            dict(N=N, grid=list(hw), tokens=N, landmarks=M))


def gpu_check(B: int, h: int, N: int, M: int, D: int):
    def make(device, dtype):
        x = [randn(B, h, N, D, device=device, dtype=dtype, scale=0.3),
             randn(B, h, M, D, device=device, dtype=dtype, scale=0.3)]
        return lambda b, x, y: laplacian_kernel(x, y, LAMBDA, backend=b), x
    return make


def implied_weights(q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int], rows: torch.Tensor,
                    landmark_cell: int = LANDMARK_CELL, lam: float = LAMBDA,
                    ns_iters: int = NS_ITERS, ns_eps: float = NS_EPS,
                    **_: Any) -> torch.Tensor:
    """``K(q, L) pinv(K(L, L)) K(L, k) / N`` with landmarks ``L`` pooled over cells of the
    queries; the Nystrom weights may be negative and need not sum to 1, so the distribution is
    ``|w_ij| / sum_j |w_ij|``."""
    from mmeffattn.analysis.dispersion import pool_grid
    from mmeffattn.ops import newton_schulz_pinv_naive
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    lm = pool_grid(q, hw, landmark_cell)  # landmarks from the queries, as LaplacianFormer
    k_ql = laplacian_kernel_naive(qs, lm, lam)  # [B, h, R, M]
    k_lk = laplacian_kernel_naive(lm, k, lam)  # [B, h, M, N]
    pinv = newton_schulz_pinv_naive(laplacian_kernel_naive(lm, lm, lam), ns_iters, ns_eps)
    w = (k_ql @ pinv @ k_lk).abs()
    return w / w.sum(-1, keepdim=True).clamp_min(1e-30)


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation
# ---------------------------------------------------------------------------------------------
def aot_case(N, M, D, dtype, layout='contiguous') -> Dict[str, Any]:
    """``layout``: ``'contiguous'`` or ``'tokens'`` (views of a ``[B, tokens, heads, D]``
    projection)."""
    return dict(op='laplacian_kernel', N=N, M=M, D=D, dtype=dtype, layout=layout)


def aot_record(case: Dict[str, Any]) -> list:
    """Forward + backward launches (dx and dy) of one case."""
    from . import function
    dtype = DTYPES[case['dtype']]
    N, M, D = case['N'], case['M'], case['D']
    B, H = case.get('B', 1), case.get('H', 2)  # the launch grid depends on them
    if case.get('layout', 'contiguous') == 'tokens':
        x = torch.empty(B, N, H, D, dtype=dtype).transpose(1, 2)
        y = torch.empty(B, M, H, D, dtype=dtype).transpose(1, 2)
    else:
        x, y = torch.empty(B, H, N, D, dtype=dtype), torch.empty(B, H, M, D, dtype=dtype)
    with function.record_launches() as launches:
        out = function.laplacian_fwd(x, y, 1.0)
        function.laplacian_bwd(torch.empty_like(out), x, y, out, 1.0)
    return launches


# The compiled code depends on the dtype, the D tiles (BD 8 / 16, or D < 8), and Triton's
# alignment specialisation of D and the strides (the token layout's strides are heads * D); N
# and M are runtime arguments. The subset: the token layout in fp16 with an odd D, a contiguous
# bf16 case at the model's sizes (49 landmarks), a tiny D.
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(37, 13, 24, 'fp16', 'tokens'), aot_case(3136, 49, 64, 'bf16'),
            aot_case(37, 13, 5, 'fp32')],
    full=[aot_case(N, M, D, dtype, layout)
          for D in (5, 8, 24, 32, 40, 64)
          for dtype in ('fp16', 'bf16', 'fp32')
          for N, M in ((37, 13), (3136, 49))
          for layout in ('contiguous', 'tokens')],
    kernels=frozenset({'laplacian_fwd_kernel', 'laplacian_bwd_kernel'}))


# ---------------------------------------------------------------------------------------------
# roofline
# ---------------------------------------------------------------------------------------------
def roofline_costs(B: int, h: int, N: int, M: int, D: int, previous: bool = False):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one call on ``[B, h, N, D]`` x and
    ``[B, h, M, D]`` y (fp32 lane instructions: forward 2 per (i, j, d), a difference and an
    absolute-value add; backward 6 per (i, j, d) per gradient: difference, two compares, their
    difference, a multiply-add).

    ``previous``: the design before issue 14 (two backward launches, each reading ``g`` and
    ``out``, writing dx / dy in the input dtype)."""
    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        bh, nm = B * h, N * M
        fwd = Cost(bh * e * (N * D + M * D + nm), fp32=bh * nm * (2 * D + 2))
        if previous:
            return dict(fwd=fwd, bwd=Cost(bh * e * (2 * (2 * nm + N * D + M * D) + N * D + M * D),
                                          fp32=bh * nm * D * 14, launches=2))
        from .function import BWD_MAX_D, bwd_row_split
        n_d = -(-D // min(BWD_MAX_D, D))
        n_split = -(-N // bwd_row_split(N, n_d * bh))
        glue, launches = 0, 1
        if n_split > 1:  # dy's partial sums written, summed (read, fp32 written)
            glue += 4 * bh * M * D * (2 * n_split + 1)
            launches += 1
        if e < 4:  # dy cast to the input dtype
            glue += bh * M * D * (4 + e)
            launches += 1
        bwd = Cost(bh * e * (2 * nm + 2 * N * D + M * D) + glue, fp32=bh * nm * D * 12,
                   launches=launches)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def roofline(B: int, h: int, N: int, M: int, D: int) -> Roofline:
    return Roofline(check=f'laplacian_kernel B{B}-H{h}-N{N}-M{M}-D{D}',
                    costs=roofline_costs(B, h, N, M, D),
                    aot_case=dict(aot_case(N, M, D, 'bf16'), B=B, H=h),
                    previous=roofline_costs(B, h, N, M, D, previous=True))


SPEC = OpSpec(
    name='laplacian_kernel', macs=macs, can_run=laplacian_triton_reasons,
    # LaplacianFormer-T stage 1 (landmarks in 8x8 cells) at 224 and 512
    gpu_checks=[('laplacian_kernel B8-H1-N3136-M49-D64', gpu_check(8, 1, 3136, 49, 64)),
                ('laplacian_kernel B2-H1-N16384-M256-D64', gpu_check(2, 1, 16384, 256, 64))],
    benchmarks={'laplacian_nystrom': benchmark},
    benchmark_settings=dict(landmark_cell=LANDMARK_CELL, max_landmarks=MAX_LANDMARKS,
                            ns_iters=NS_ITERS),
    attention_kinds={'laplacian_nystrom': implied_weights}, aot=AOT,
    rooflines=[roofline(8, 1, 3136, 49, 64), roofline(2, 1, 16384, 256, 64)])
