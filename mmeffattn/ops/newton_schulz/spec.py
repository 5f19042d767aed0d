"""The Newton-Schulz inverse's declarations for the cross-op tools (see
:mod:`mmeffattn.ops._spec`). It is benchmarked inside ``laplacian_nystrom`` (the Laplacian
kernel's spec), so it declares no benchmark of its own."""
import math
from typing import Any, Dict

import torch

from .._spec import DTYPES, AotSpec, OpSpec, randn
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
    a = torch.empty(1, 2, M, M, dtype=DTYPES[case['dtype']])
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

SPEC = OpSpec(
    name='newton_schulz_pinv', macs=macs, can_run=newton_schulz_triton_reasons,
    gpu_checks=[('newton_schulz_pinv B8-H1-M49', gpu_check(8, 1, 49, 64)),
                ('newton_schulz_pinv B2-H1-M256', gpu_check(2, 1, 256, 64))],
    aot=AOT)
