"""The dynamic weight's declarations for the cross-op tools (see :mod:`mmeffattn.ops._spec`).
Its benchmark kind is WeightFormer's whole ``dynamic_linear`` layer."""
import math
from typing import Any, Dict

import torch

from .._spec import DTYPES, AotSpec, Cost, OpSpec, Roofline, randn, square_grid
from .op import dynamic_weight, dynamic_weight_triton_reasons

#: WeightFormer pools the tokens 2x2 for the dynamic weight
POOL = 2


def macs(u: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """``v^T u`` over the M pooled tokens, plus the row norms (one MAC per weight entry)."""
    B, M, c_in = u.shape
    return B * v.shape[2] * c_in * (M + 1)


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """DynamicLinear: ``x (W + dW(x))`` on ``heads * D`` channels (WeightFormer mixes all
    channels at once), dW from :data:`POOL` x :data:`POOL`-pooled tokens."""
    hw = square_grid(n)
    N, C = hw[0] * hw[1], s.heads * s.head_dim
    M = math.ceil(hw[0] / POOL) ** 2
    x = torch.randn(s.batch, N, C, device=device, dtype=dtype)
    u, vv = (torch.randn(s.batch, M, C, device=device, dtype=dtype) for _ in range(2))
    w = torch.randn(C, C, device=device, dtype=dtype) * C ** -0.5

    def run(b):
        return x @ dynamic_weight(u, vv, N, weight=w, backend=b).transpose(1, 2)

    return (run, macs(u, vv) + s.batch * N * C * C,
            (2 * x.numel() + 2 * u.numel() + w.numel()) * x.element_size(),
            dict(N=N, grid=list(hw), tokens=N, channels=C, pooled=M))


def gpu_check(B: int, M: int, c_in: int, c_out: int):
    def make(device, dtype):
        x = [randn(B, M, c_in, device=device, dtype=dtype),
             randn(B, M, c_out, device=device, dtype=dtype),
             randn(c_out, c_in, device=device, dtype=dtype, scale=0.02)]
        return (lambda b, u, v, w: dynamic_weight(u, v, 196, weight=w, backend=b), x)
    return make


def aot_case(M, C_in, C_out, dtype, weight='fp32', B=2) -> Dict[str, Any]:
    return dict(op='dynamic_weight', B=B, M=M, C_in=C_in, C_out=C_out, dtype=dtype,
                weight=weight)


def aot_record(case: Dict[str, Any]) -> list:
    """Forward + backward launches on contiguous u, v (the model's ``SiLU(A) @ basis``)."""
    from . import function
    dtype = DTYPES[case['dtype']]
    B, M, C_in, C_out = case['B'], case['M'], case['C_in'], case['C_out']
    u, v = torch.empty(B, M, C_in, dtype=dtype), torch.empty(B, M, C_out, dtype=dtype)
    weight = (torch.empty(C_out, C_in, dtype=DTYPES[case['weight']]) if case['weight']
              else None)
    s = C_in ** -0.5 / (4 * M)
    with function.record_launches() as launches:
        out = function.dynamic_weight_fwd(u, v, s, weight)
        function.dynamic_weight_bwd(torch.empty_like(out), u, v, s)
    return launches


# WeightFormer-T/S/B fc1 (C_in 192 -> one 256-wide tile; 384 -> one 512-wide tile) at 224 px
# (M 49) and 1024 px (M 1024), fp32 (FMA dots) and bf16/fp16 (tensor cores); the sweep (C_in
# 1000, unaligned, and 1536); small unaligned widths as in the interpreted tests.
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(49, 192, 768, 'fp32'), aot_case(49, 192, 768, 'bf16'),
            aot_case(1024, 384, 1536, 'fp32'), aot_case(1024, 384, 1536, 'bf16'),
            aot_case(49, 1000, 40, 'fp32'), aot_case(49, 1000, 40, 'bf16', weight=None),
            aot_case(37, 40, 72, 'fp32'), aot_case(37, 72, 40, 'fp16', weight=None),
            aot_case(49, 300, 40, 'fp32')],
    full=[aot_case(M, C_in, C_out, dtype, weight)
          for M in (49, 1024)
          for C_in, C_out in ((192, 768), (384, 1536), (768, 192), (40, 72), (200, 72),
                              (300, 40), (1000, 40), (1536, 384))
          for dtype in ('fp32', 'fp16', 'bf16')
          for weight in ('fp32', None)],
    kernels=frozenset({'dynamic_weight_fwd_kernel', 'dynamic_weight_bwd_dp_kernel',
                       'dynamic_weight_bmm_kernel'}))


def roofline_costs(B: int, M: int, c_in: int, c_out: int):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one call with an fp32 static weight
    (the GPU check): forward u, v and the weight read, the ``[B, c_out, c_in]`` weight written;
    backward its gradient read (twice: the row-norm term, then du and dv), u and v read,
    du, dv written. Tensor-core FLOPs: 2 per MAC (``v^T u`` forward; ``dp``, du, dv backward);
    fp32 lane instructions: about 3 per output weight each way (norm, scale, add)."""
    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        uv = B * M * (c_in + c_out) * e
        w_out = B * c_out * c_in * e
        mac = B * M * c_in * c_out
        fwd = Cost(uv + 4 * c_out * c_in + w_out, fp32=3 * B * c_out * c_in, tc=2 * mac)
        bwd = Cost(2 * w_out + 2 * uv + 8 * B * c_out, fp32=3 * B * c_out * c_in,
                   tc=2 * 2 * mac + 2 * B * c_out * c_in, launches=3)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def roofline(B: int, M: int, c_in: int, c_out: int) -> Roofline:
    return Roofline(check=f'dynamic_weight B{B}-M{M}-{c_in}x{c_out}',
                    costs=roofline_costs(B, M, c_in, c_out),
                    aot_case=aot_case(M, c_in, c_out, 'bf16', B=B))


SPEC = OpSpec(
    name='dynamic_weight', macs=macs, can_run=dynamic_weight_triton_reasons,
    # WeightFormer-T's dynamic layers at 224
    gpu_checks=[('dynamic_weight B8-M49-192x768', gpu_check(8, 49, 192, 768))],
    benchmarks={'dynamic_linear': benchmark}, benchmark_settings=dict(weightformer_pool=POOL),
    aot=AOT, rooflines=[roofline(8, 49, 192, 768)])
