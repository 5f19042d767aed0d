"""Public dynamic depthwise-convolution op: validates its inputs and dispatches to a backend."""
from typing import List, Optional

import torch

from .._backend import KERNEL_DTYPES, dispatch, triton_reasons
from .._common import import_kernels, offsets_reason, sample_offsets_fit
from .._validate import check_alike, check_not_empty, check_tensor
from .naive import dynamic_dwconv_naive
from .pytorch import dynamic_dwconv_torch

#: largest kernel side compiled without spills; larger kernels run the torch backend
MAX_KERNEL_SIZE = 9
dynamic_dwconv_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'dynamic_dwconv_triton', module='library')

_NAME = 'dynamic_dwconv'


def _check_inputs(x: torch.Tensor, kernel: torch.Tensor, bias: Optional[torch.Tensor],
                  weight: Optional[torch.Tensor], normalize: bool) -> None:
    """Raise ValueError naming the problem and the fix."""
    check_tensor(_NAME, 'x', x, '[B, C, H, W]', 'turn tokens [B, H*W, C] into a map with '
                 '.transpose(1, 2).reshape(B, C, H, W)')
    check_tensor(_NAME, 'kernel', kernel, '[B, C, K, K]')
    check_not_empty(_NAME, 'x', x, '[B, C, H, W]')
    B, C, H, W = x.shape
    if tuple(kernel.shape[:2]) != (B, C) or kernel.shape[2] != kernel.shape[3]:
        raise ValueError(f'{_NAME}: kernel must be [B, C, K, K] = [{B}, {C}, K, K] (one square '
                         f'kernel per sample and channel of x), got {tuple(kernel.shape)}; a '
                         f'[B*C, 1, K, K] grouped-conv weight reshapes with '
                         f'.reshape(B, C, K, K)')
    K = kernel.shape[-1]
    if K % 2 != 1:
        raise ValueError(f'{_NAME}: kernel size K={K} must be odd (zero padding K // 2 keeps '
                         f'the H x W size)')
    if not isinstance(normalize, bool):
        raise ValueError(f'{_NAME}: normalize must be a bool, got {normalize!r}')
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (C, )):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f'{_NAME}: bias must be [C] = [{C}] (shared by the samples), got {got}')
    if weight is not None and (not isinstance(weight, torch.Tensor)
                               or tuple(weight.shape) not in ((C, 1, K, K), (C, K, K))):
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f'{_NAME}: weight (the static kernel) must be [C, 1, K, K] = '
                         f'[{C}, 1, {K}, {K}] (a depthwise nn.Conv2d weight) or [C, K, K], '
                         f'got {got}')
    check_alike(_NAME, (('x', x), ('kernel', kernel), ('bias', bias), ('weight', weight)),
                same_dtype=False)


def dynamic_dwconv_triton_reasons(x: torch.Tensor, kernel: torch.Tensor,
                                  bias: Optional[torch.Tensor] = None,
                                  weight: Optional[torch.Tensor] = None,
                                  interpret: Optional[bool] = None) -> List[str]:
    """Reasons the kernels cannot run these validated inputs (``[]``: they can)."""
    tensors = [t for t in (x, kernel, bias, weight) if t is not None]
    reasons = triton_reasons('dynamic depthwise-convolution', _KERNELS_IMPORT_ERROR, tensors,
                             tensors, KERNEL_DTYPES, interpret=interpret, uses_dot=False)
    K = kernel.shape[-1]
    if K > MAX_KERNEL_SIZE:
        reasons.append(f'kernel size {K} > {MAX_KERNEL_SIZE} (the largest the kernels were '
                       f'checked to compile without register spills)')
    return reasons + offsets_reason(sample_offsets_fit(x),
                                    'one sample of x spans 2**31 elements or more')


def dynamic_dwconv(x: torch.Tensor, kernel: torch.Tensor, bias: Optional[torch.Tensor] = None,
                   weight: Optional[torch.Tensor] = None, *, normalize: bool = False,
                   backend: Optional[str] = None) -> torch.Tensor:
    """Depthwise convolution with its own ``K x K`` kernel per sample and channel.

    Stride 1, zero padding ``K // 2`` (the output keeps ``H x W``). The effective kernel of
    sample ``b`` and channel ``c`` is::

        kernel[b, c] / (||kernel[b, c]||_F + 1)   if normalize, else kernel[b, c]
          + weight[c]                             if weight is given

    (WeightFormer's ``DynamicDWConv``: ``normalize=True`` with its static kernel). Non-finite
    inputs: the NaN contract of :mod:`mmeffattn.ops` (a tap that meets only padding adds nothing).

    Args:
        x: ``[B, C, H, W]``, any strides (NCHW, channels-last, or a token tensor's
            ``transpose(1, 2).reshape(B, C, H, W)`` view).
        kernel: ``[B, C, K, K]``, ``K`` odd.
        bias: optional ``[C]``, shared by the samples.
        weight: optional static kernel ``[C, 1, K, K]`` or ``[C, K, K]``.
        normalize: divide each ``K x K`` kernel by its Frobenius norm plus one first.
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``[B, C, H, W]`` in x's dtype. Triton (fp32 math, no autocast) keeps x's memory
        layout, the torch backend too for one sample (several come back NCHW, from one grouped
        convolution).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    _check_inputs(x, kernel, bias, weight, normalize)
    tensors = [t for t in (x, kernel, bias, weight) if t is not None]
    return dispatch(_NAME, backend, lambda: dynamic_dwconv_triton_reasons(x, kernel, bias, weight),
                    tensors, dynamic_dwconv_triton, dynamic_dwconv_torch, dynamic_dwconv_naive,
                    x, kernel, bias, weight, normalize)
