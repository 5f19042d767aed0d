"""The dynamic depthwise convolution's declarations for the cross-op tools (see
:mod:`mmeffattn.ops._spec`)."""
from typing import Any, Dict

import torch

from .._spec import DTYPES, AotSpec, Cost, OpSpec, Roofline, randn, square_grid
from .op import MAX_KERNEL_SIZE, dynamic_dwconv, dynamic_dwconv_triton_reasons

#: WeightFormer's dynamic convolution kernel side
KERNEL = 3


def macs(x: torch.Tensor, kernel: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """A ``K x K`` depthwise convolution per sample and channel (stride 1, same size)."""
    B, C, H, W = x.shape
    return B * C * H * W * kernel.shape[-1] * kernel.shape[-2]


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """DynamicDWConv: a :data:`KERNEL` x :data:`KERNEL` kernel per sample and channel on
    ``heads * D`` channels, normalized and added to a static kernel."""
    hw = square_grid(n)
    C = s.heads * s.head_dim
    x = torch.randn(s.batch, C, *hw, device=device, dtype=dtype)
    kern = torch.randn(s.batch, C, KERNEL, KERNEL, device=device, dtype=dtype)
    bias = torch.zeros(C, device=device, dtype=dtype)
    static = torch.randn(C, 1, KERNEL, KERNEL, device=device, dtype=dtype)
    return (lambda b: dynamic_dwconv(x, kern, bias, static, normalize=True, backend=b),
            macs(x, kern), 2 * x.numel() * x.element_size(),
            dict(N=hw[0] * hw[1], grid=list(hw), tokens=hw[0] * hw[1], channels=C))


def gpu_check(B: int, C: int, side: int):
    def make(device, dtype):
        x = [randn(B, C, side, side, device=device, dtype=dtype),
             randn(B, C, KERNEL, KERNEL, device=device, dtype=dtype),
             randn(C, device=device, dtype=dtype),
             randn(C, 1, KERNEL, KERNEL, device=device, dtype=dtype)]
        return (lambda b, x, k, bias, w: dynamic_dwconv(x, k, bias, w, normalize=True,
                                                        backend=b), x)
    return make


def aot_case(C, H, W, K, dtype, layout='tokens', normalize=True, weight=True, bias=True,
             B=2) -> Dict[str, Any]:
    return dict(op='dynamic_dwconv', B=B, C=C, H=H, W=W, K=K, dtype=dtype, normalize=normalize,
                weight=weight, bias=bias, layout=layout)


def aot_record(case: Dict[str, Any]) -> list:
    """Forward + backward launches on the layout the model passes (``'tokens'``: the
    channels-last view of a ``[B, H*W, C]`` token tensor) or plain NCHW (``'nchw'``)."""
    from . import function
    dtype = DTYPES[case['dtype']]
    B, C, H, W, K = case['B'], case['C'], case['H'], case['W'], case['K']
    if case['layout'] == 'tokens':
        x = torch.empty(B, H * W, C, dtype=dtype).transpose(1, 2).reshape(B, C, H, W)
    else:
        x = torch.empty(B, C, H, W, dtype=dtype)
    kernel = torch.empty(B, C, K, K, dtype=dtype)
    weight = torch.empty(C, 1, K, K) if case['weight'] else None
    bias = torch.empty(C) if case['bias'] else None
    with function.record_launches() as launches:
        out = function.dynamic_dwconv_fwd(x, kernel, bias, weight, case['normalize'])
        function.dynamic_dwconv_bwd(torch.empty_like(out), x, kernel, weight, case['normalize'],
                                    bias is not None)
    return launches


# WeightFormer-T/S (C 192/384, K 3, token layout) fp32/bf16; odd channels, NCHW, K 5/7/9 (the
# largest the op sends to the kernels) and the variants without normalization, static kernel
# or bias.
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(192, 14, 14, 3, 'fp32'), aot_case(384, 64, 64, 3, 'bf16'),
            aot_case(40, 13, 17, 5, 'fp16', layout='nchw'),
            aot_case(72, 13, 17, MAX_KERNEL_SIZE, 'fp32', layout='nchw', normalize=False,
                     weight=False, bias=False),
            aot_case(6, 7, 5, 7, 'bf16')],
    full=[aot_case(C, 13, 17, K, dtype, layout, normalize, normalize, bias)
          for C in (6, 40, 192, 384)
          for K in (1, 3, 5, 7, 9)
          for dtype in ('fp32', 'fp16', 'bf16')
          for layout in ('tokens', 'nchw')
          for normalize in (True, False)
          for bias in (True, False)],
    kernels=frozenset({'dynamic_dwconv_fwd_kernel', 'dynamic_dwconv_bwd_kernel',
                       'dynamic_dwconv_bwd_reduce_kernel'}))

def roofline_costs(B: int, C: int, side: int, K: int = KERNEL, previous: bool = False):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one normalized call with static kernel
    and bias (the GPU check): x, dy, out, dx once each through HBM (the shifted re-reads hit
    L1/L2), the kernel-gradient partial sums written and re-read, the per-sample sums summed
    by torch. fp32 lane instructions: 3 per tap and output (multiply, select, add) forward,
    5 backward (dx's 3, the dk product and its sum).

    ``previous``: one partial sum per 64-pixel tile (before issue 14)."""
    def costs(dtype: str) -> Dict[str, Cost]:
        from .function import BWD_TILE, bwd_tiles_per_prog
        e = DTYPES[dtype].itemsize
        P, KK = side * side, K * K
        bcp = B * C * P
        n_tiles = -(-P // BWD_TILE[1])
        n_cb = -(-C // BWD_TILE[0])
        groups = n_tiles if previous else -(-n_tiles // bwd_tiles_per_prog(n_tiles, n_cb * B))
        small = B * C * KK * e + C * KK * 4 + C * 4  # kernel, static kernel, bias
        fwd = Cost(2 * bcp * e + small, fp32=3 * KK * bcp)
        part = B * groups * C * (KK + 1) * 4
        red = B * C * (KK + 1) * 4
        bwd = Cost(3 * bcp * e + small + 2 * part + 2 * red + B * C * KK * e + C * (KK + 1) * 4,
                   fp32=5 * KK * bcp, launches=4)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def roofline(B: int, C: int, side: int) -> Roofline:
    return Roofline(check=f'dynamic_dwconv B{B}-C{C}-{side}x{side}',
                    costs=roofline_costs(B, C, side),
                    aot_case=aot_case(C, side, side, KERNEL, 'bf16', layout='nchw', B=B),
                    previous=roofline_costs(B, C, side, previous=True))


SPEC = OpSpec(
    name='dynamic_dwconv', macs=macs, can_run=dynamic_dwconv_triton_reasons,
    gpu_checks=[('dynamic_dwconv B8-C768-14x14', gpu_check(8, 768, 14)),
                ('dynamic_dwconv B2-C384-64x64', gpu_check(2, 384, 64))],
    benchmarks={'dynamic_dwconv': benchmark}, benchmark_settings=dict(weightformer_kernel=KERNEL),
    aot=AOT, rooflines=[roofline(8, 768, 14), roofline(2, 384, 64)])
