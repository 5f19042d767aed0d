"""The Newton-Schulz inverse's declarations for the cross-op tools (see
:mod:`mmeffattn.ops._spec`). It is benchmarked inside ``laplacian_nystrom`` (the Laplacian
kernel's spec), so it declares no benchmark of its own."""
import math
from typing import Any, Dict

import torch

from .._spec import DTYPES, PEAKS, AotSpec, Cost, OpSpec, Roofline, randn
from .op import newton_schulz_pinv, newton_schulz_triton_reasons


def macs(a: torch.Tensor, iters: int, *args: Any, **kwargs: Any) -> int:
    """``V <- 2V - V P V``: two ``M x M`` matmuls per iteration."""
    M = a.shape[-1]
    return math.prod(a.shape[:-2]) * int(iters) * 2 * M ** 3


def gpu_check(B: int, h: int, M: int, D: int):
    def make(device, dtype):
        from mmeffattn.ops import laplacian_kernel_naive
        z = randn(B, h, M, D, device=device, dtype=torch.float32, scale=0.3)
        a = laplacian_kernel_naive(z, z, 4.0).to(dtype)  # a real landmark kernel matrix
        return lambda b, a: newton_schulz_pinv(a, 20, 0.01, backend=b), [a]
    return make


def aot_case(M, iters=3, dtype='fp32') -> Dict[str, Any]:
    return dict(op='newton_schulz_pinv', M=M, iters=iters, dtype=dtype)


def aot_record(case: Dict[str, Any]) -> list:
    """Kernel forward (keeping its iterates, and for inference) + backward launches."""
    from . import function
    M, iters = case['M'], case['iters']
    assert M <= function.MAX_ONCHIP_M, 'larger matrices run batched matmuls, no kernel'
    a = torch.empty(case.get('B', 1), case.get('heads', 2), M, M, dtype=DTYPES[case['dtype']])
    with function.record_launches() as launches:
        out, ws = function.newton_schulz_fwd(a, iters, 0.01, True)
        function.newton_schulz_fwd(a, iters, 0.01, False)  # inference: nothing stored
        function.newton_schulz_bwd(torch.empty_like(out), a, ws, iters, 0.01)
    return launches


# The kernels only ever see fp32 padded buffers, so the code depends on the padded size MP (16,
# 32: whole-matrix kernels; 64, 128: multi-program kernels), whether the forward keeps its
# iterates, and Triton's specialisation of M and iters (== 1, divisible by 16) and of the
# workspace strides. The subset: MP 16 (whole-matrix both ways), 64 and 128 (multi-program).
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(13), aot_case(40), aot_case(100)],
    full=[aot_case(M, iters) for M in (1, 13, 16, 17, 32, 33, 49, 64, 100, 128)
          for iters in (1, 3)],
    kernels=frozenset({'newton_schulz_fwd_kernel', 'newton_schulz_bwd_kernel',
                       'newton_schulz_init_kernel', 'newton_schulz_step_kernel',
                       'newton_schulz_bwd_q_kernel', 'newton_schulz_bwd_step_kernel',
                       'newton_schulz_bwd_alpha_kernel'}))

# ---------------------------------------------------------------------------------------------
# roofline
# ---------------------------------------------------------------------------------------------
def roofline_costs(B: int, h: int, M: int, iters: int):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one call on ``[B, h, M, M]`` with
    ``iters`` steps, as the multi-program kernels (``MP = padded_size(M) > MAX_REGISTER_MP``)
    and their glue run now.

    Bytes: each launch reads / writes each fp32 ``MP x MP`` matrix it touches once (the row-block
    programs re-read the whole V, P from L2, not counted again). Forward: the input padded to
    fp32 (zero fill + copy), ``fwd_init`` (P read, V_0 written), per step P and V_k read and
    V_k+1 written (kept for the backward), the output cast back. Backward: g and a padded again,
    dP zeroed, per step ``bwd_q`` (V, G read; Q written) and ``bwd`` (P, V, G, Q, dP read; G_new,
    dP written), ``bwd_alpha`` (P, G, dP read; dP written), da cast back. Tensor-core FLOPs:
    'tf32x3' is three TF32 products per fp32 product, 2 FLOP per MAC, on the padded size: 2 MP^3
    MACs per forward step, 5 backward (Q, R = G V^T, R P^T, P^T Q, Q V^T). The kernels always
    compute in fp32, so the tensor-core FLOPs are declared at tf32 speed for every input dtype
    (for 16-bit inputs scaled by the ratio of the 16-bit to the tf32 peak, since
    ``predicted_seconds`` divides 16-bit work by the 16-bit peak). fp32 lane instructions:
    about 3 per element per step (2 V - ..., the split of each operand into high and low)."""
    from .function import padded_size

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        bh, mp = B * h, padded_size(M)
        mat, small = 4 * bh * mp * mp, bh * M * M  # one fp32 padded matrix; elements unpadded
        tc_scale = 1.0 if dtype == 'fp32' else PEAKS['H100']['tc16'] / PEAKS['H100']['tf32']

        def tc(macs: int) -> int:  # tf32x3: three products of 2 FLOP per MAC, per matrix
            return int(3 * 2 * macs * bh * tc_scale)

        pad = mat + small * (e + 4)  # zero fill, copy in
        unpad = small * (4 + e)
        fwd = Cost(pad + 2 * mat + iters * 3 * mat + unpad, fp32=3 * iters * bh * mp * mp,
                   tc=tc(2 * iters * mp ** 3), launches=2 + 1 + iters + 1)
        bwd = Cost(2 * pad + mat + iters * (3 * mat + 7 * mat) + 4 * mat + unpad,
                   fp32=6 * iters * bh * mp * mp, tc=tc(5 * iters * mp ** 3),
                   launches=4 + 1 + 2 * iters + 1 + 1)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def roofline(B: int, h: int, M: int, iters: int = 20) -> Roofline:
    """At the GPU check's shapes (its 20 steps; the kernels run M <= 128 only, so the M = 256
    check, the batched-matmul path, has no roofline)."""
    return Roofline(check=f'newton_schulz_pinv B{B}-H{h}-M{M}',
                    costs=roofline_costs(B, h, M, iters),
                    aot_case=dict(aot_case(M, iters), B=B, heads=h))


SPEC = OpSpec(
    name='newton_schulz_pinv', macs=macs, can_run=newton_schulz_triton_reasons,
    gpu_checks=[('newton_schulz_pinv B8-H1-M49', gpu_check(8, 1, 49, 64)),
                ('newton_schulz_pinv B2-H1-M256', gpu_check(2, 1, 256, 64))],
    aot=AOT, rooflines=[roofline(8, 1, 49)])
