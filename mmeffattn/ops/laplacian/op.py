"""Public Laplacian-kernel op: validates its inputs and dispatches to Triton or the reference."""
import math
import numbers
from typing import List, Optional

import torch

from .._backend import select_backend, triton_reasons
from .._common import INT32_LIMIT, import_kernels, offsets_reason, token_offsets_fit
from .naive import laplacian_kernel_naive

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # of the Triton kernels
laplacian_kernel_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'laplacian_kernel_triton')

_NAME = 'laplacian_kernel'


def _check_inputs(x: torch.Tensor, y: torch.Tensor, lam: float) -> None:
    """Raise ValueError naming the problem and the fix."""
    for name, t in (('x', x), ('y', y)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f'{_NAME}: {name} must be a torch.Tensor, got {type(t).__name__}')
        if t.dim() != 4:
            raise ValueError(f'{_NAME}: {name} must be [B, heads, tokens, D] (4 dims), got shape '
                             f'{tuple(t.shape)}; reshape tokens [B, N, heads*D] with '
                             f'.reshape(B, N, heads, D).transpose(1, 2)')
    if x.shape[:2] != y.shape[:2] or x.shape[3] != y.shape[3]:
        raise ValueError(f'{_NAME}: x [B, heads, N, D] and y [B, heads, M, D] must agree on B, '
                         f'heads and D, got x {tuple(x.shape)}, y {tuple(y.shape)}; project both '
                         f'with the same number of heads and head dim')
    if min(x.shape) < 1 or y.shape[2] < 1:
        raise ValueError(f'{_NAME}: x and y need at least one element along every dim, got '
                         f'x {tuple(x.shape)}, y {tuple(y.shape)}')
    if not (x.is_floating_point() and y.is_floating_point()):
        raise ValueError(f'{_NAME}: x and y must be floating point, got {x.dtype}, {y.dtype}')
    if x.dtype != y.dtype:
        raise ValueError(f'{_NAME}: x and y must have the same dtype, got x {x.dtype}, '
                         f'y {y.dtype}; cast them to one dtype')
    if x.device != y.device:
        raise ValueError(f'{_NAME}: x and y must be on one device, got x {x.device}, '
                         f'y {y.device}')
    if (isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not math.isfinite(lam)
            or not lam > 0):
        raise ValueError(f'{_NAME}: lam must be a positive finite float (the kernel width in '
                         f'exp(-|x - y|_1 / lam)), got {lam!r}')


def laplacian_triton_reasons(x: torch.Tensor, y: torch.Tensor,
                             interpret: Optional[bool] = None) -> List[str]:
    """Reasons the Triton kernels cannot run these (validated) inputs (``[]``: they can);
    ``interpret`` as in :func:`mmeffattn.ops._backend.triton_reasons`."""
    # elementwise arithmetic only (no tl.dot): bf16 is fine under the interpreter too
    reasons = triton_reasons('Laplacian-kernel', _KERNELS_IMPORT_ERROR, (x, y), (x, y),
                             SUPPORTED_DTYPES, interpret=interpret, uses_dot=False)
    fits = token_offsets_fit(x, y) and x.shape[2] * y.shape[2] < INT32_LIMIT
    return reasons + offsets_reason(fits, 'one (sample, head) of x or y, or of the [N, M] '
                                    'output, spans 2**31 elements or more')


def laplacian_kernel(x: torch.Tensor, y: torch.Tensor, lam: float, *,
                     backend: Optional[str] = None) -> torch.Tensor:
    """LaplacianFormer's Laplacian kernel between two token sets::

        out[b, h, i, j] = exp(-sum_d |x[b, h, i, d] - y[b, h, j, d]| / lam)

    Differentiable w.r.t. ``x`` and ``y`` (through ``sign(x - y)``, zero on ties). The Triton
    backend never materialises ``[N, M, D]``: it accumulates the L1 distance of an output tile
    over chunks of D in fp32 and applies the exponential once; its backward reuses the output.

    Args:
        x: ``[B, heads, N, D]``.
        y: ``[B, heads, M, D]``, x's dtype and device; any strides.
        lam: kernel width, a positive float.
        backend: ``None`` (automatic), ``'triton'`` or ``'reference'``; see
            :mod:`mmeffattn.ops._backend` (``$MMEFFATTN_OPS_BACKEND`` applies when None).

    Returns:
        ``[B, heads, N, M]`` in the inputs' dtype, computed in fp32 for fp16/bf16 inputs
        (contiguous from the Triton backend).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists the reasons).
    """
    _check_inputs(x, y, lam)
    lam = float(lam)
    chosen = select_backend(_NAME, backend, lambda: laplacian_triton_reasons(x, y), (x, y))
    if chosen == 'triton':
        return laplacian_kernel_triton(x, y, lam)
    return laplacian_kernel_naive(x, y, lam)
