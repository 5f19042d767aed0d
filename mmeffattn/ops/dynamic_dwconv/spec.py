"""The dynamic depthwise convolution's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import Example, OpSpec, as_dtype, randn
from .op import dynamic_dwconv, dynamic_dwconv_triton_reasons

#: WeightFormer's dynamic kernel side
SETTINGS = dict(kernel_size=3)


def macs(x: torch.Tensor, kernel: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """A ``K x K`` depthwise convolution per sample and channel (stride 1, same size)."""
    B, C, H, W = x.shape
    return B * C * H * W * kernel.shape[-1] * kernel.shape[-2]


def _x(B: int, C: int, H: int, W: int, layout: str, make) -> torch.Tensor:
    """``[B, C, H, W]``; ``'tokens'``: the channels-last view of a ``[B, H*W, C]`` token
    tensor, as WeightFormer passes it."""
    if layout == 'tokens':
        return make(B, H * W, C).transpose(1, 2).reshape(B, C, H, W)
    return make(B, C, H, W)


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 2, C: int = 192,
            H: int = 14, W: int = 14, K: int = SETTINGS['kernel_size'], layout: str = 'nchw',
            **_: Any) -> Example:
    """Input, per-sample kernels, bias and static kernel, normalized as WeightFormer's
    ``DynamicDWConv``."""
    def make(*shape):
        return randn(*shape, device=device, dtype=dtype)
    inputs = [_x(B, C, H, W, layout, make), make(B, C, K, K), make(C), make(C, 1, K, K)]

    def fn(backend, x, kernel, bias, weight):
        return dynamic_dwconv(x, kernel, bias, weight, normalize=True, backend=backend)
    return Example(fn, inputs, macs(*inputs[:2]))


def record(C: int = 40, H: int = 13, W: int = 17, K: int = SETTINGS['kernel_size'],
           dtype: str = 'fp32', layout: str = 'tokens', normalize: bool = True,
           weight: bool = True, bias: bool = True, B: int = 2) -> None:
    """The static kernel and bias (if any) fp32, as a bf16 model's parameters under autocast."""
    from . import function
    dtype = as_dtype(dtype)
    x = _x(B, C, H, W, layout, lambda *s: torch.empty(*s, dtype=dtype))
    kernel = torch.empty(B, C, K, K, dtype=dtype)
    weight = torch.empty(C, 1, K, K) if weight else None
    bias = torch.empty(C) if bias else None
    out = function.dynamic_dwconv_fwd(x, kernel, bias, weight, normalize)
    function.dynamic_dwconv_bwd(torch.empty_like(out), x, kernel, weight, normalize,
                                bias is not None)


SPEC = OpSpec(name='dynamic_dwconv', macs=macs, can_run=dynamic_dwconv_triton_reasons,
              settings=SETTINGS, example=example, record=record,
              gpu_sizes=(dict(B=8, C=768, H=14, W=14, layout='nchw'),
                         dict(B=2, C=384, H=64, W=64, layout='nchw')))
