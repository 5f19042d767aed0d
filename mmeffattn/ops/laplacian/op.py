"""Public Laplacian-kernel op: validates its inputs and dispatches to a backend."""
from typing import List, Optional

import torch

from .._backend import KERNEL_DTYPES, dispatch, triton_reasons
from .._common import INT32_LIMIT, import_kernels, offsets_reason, token_offsets_fit
from .._validate import check_alike, check_real, check_tensor
from .naive import laplacian_kernel_naive
from .pytorch import laplacian_kernel_torch

laplacian_kernel_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'laplacian_kernel_triton', module='library')

_NAME = 'laplacian_kernel'


def _check_inputs(x: torch.Tensor, y: torch.Tensor, lam: float) -> None:
    """Raise ValueError naming the problem and the fix."""
    for name, t in (('x', x), ('y', y)):
        check_tensor(_NAME, name, t, '[B, heads, tokens, D]', 'reshape tokens [B, N, heads*D] '
                     'with .reshape(B, N, heads, D).transpose(1, 2)')
    if x.shape[:2] != y.shape[:2] or x.shape[3] != y.shape[3]:
        raise ValueError(f'{_NAME}: x [B, heads, N, D] and y [B, heads, M, D] must agree on B, '
                         f'heads and D, got x {tuple(x.shape)}, y {tuple(y.shape)}; project both '
                         f'with the same number of heads and head dim')
    if min(x.shape) < 1 or y.shape[2] < 1:
        raise ValueError(f'{_NAME}: x and y need at least one element along every dim, got '
                         f'x {tuple(x.shape)}, y {tuple(y.shape)}')
    check_alike(_NAME, (('x', x), ('y', y)))
    check_real(_NAME, 'lam', lam, 'the kernel width in exp(-|x - y|_1 / lam)', positive=True)


def laplacian_triton_reasons(x: torch.Tensor, y: torch.Tensor,
                             interpret: Optional[bool] = None) -> List[str]:
    """Reasons the kernels cannot run these validated inputs (``[]``: they can)."""
    # elementwise arithmetic only (no tl.dot): bf16 is fine under the interpreter too
    reasons = triton_reasons('Laplacian-kernel', _KERNELS_IMPORT_ERROR, (x, y), (x, y),
                             KERNEL_DTYPES, interpret=interpret, uses_dot=False)
    fits = token_offsets_fit(x, y) and x.shape[2] * y.shape[2] < INT32_LIMIT
    return reasons + offsets_reason(fits, 'one (sample, head) of x or y, or of the [N, M] '
                                    'output, spans 2**31 elements or more')


def laplacian_kernel(x: torch.Tensor, y: torch.Tensor, lam: float, *,
                     backend: Optional[str] = None) -> torch.Tensor:
    """LaplacianFormer's Laplacian kernel between two token sets::

        out[b, h, i, j] = exp(-sum_d |x[b, h, i, d] - y[b, h, j, d]| / lam)

    Differentiable w.r.t. ``x`` and ``y`` (through ``sign(x - y)``, zero on ties). Non-finite
    inputs: the NaN contract of :mod:`mmeffattn.ops`; ``lam`` must be positive and finite.

    Args:
        x: ``[B, heads, N, D]``.
        y: ``[B, heads, M, D]``, x's dtype and device; any strides.
        lam: kernel width, a positive float.
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``[B, heads, N, M]`` in the inputs' dtype; the distances are summed in fp32 (the
        kernels in registers; the torch backend casts 16-bit inputs for ``torch.cdist``, which
        has no bf16 CPU kernel).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    _check_inputs(x, y, lam)
    lam = float(lam)
    return dispatch(_NAME, backend, lambda: laplacian_triton_reasons(x, y), (x, y),
                    laplacian_kernel_triton, laplacian_kernel_torch, laplacian_kernel_naive,
                    x, y, lam)
