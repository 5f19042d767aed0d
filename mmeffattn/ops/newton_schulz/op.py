"""Public Newton-Schulz inverse op: validates its inputs and dispatches to Triton or the
reference."""
import math
import numbers
import operator
from typing import List, Optional

import torch

from .._backend import select_backend, triton_reasons
from .._common import import_kernels
from .naive import newton_schulz_pinv_naive

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # of the Triton kernels
newton_schulz_pinv_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'newton_schulz_pinv_triton')

_NAME = 'newton_schulz_pinv'


def _check_inputs(a: torch.Tensor, iters: int, eps: float) -> int:
    """Raise ValueError naming the problem and the fix; return ``iters`` as an int."""
    if not isinstance(a, torch.Tensor):
        raise ValueError(f'{_NAME}: a must be a torch.Tensor, got {type(a).__name__}')
    if a.dim() != 4:
        raise ValueError(f'{_NAME}: a must be [B, heads, M, M] (4 dims), got shape '
                         f'{tuple(a.shape)}; add the missing dims with a[None] or reshape')
    if a.shape[2] != a.shape[3]:
        raise ValueError(f'{_NAME}: a must hold square matrices [B, heads, M, M], got shape '
                         f'{tuple(a.shape)}; pass the landmark-landmark kernel matrix')
    if a.shape[2] < 1:
        raise ValueError(f'{_NAME}: a must hold at least 1x1 matrices, got {tuple(a.shape)}')
    if not a.is_floating_point():
        raise ValueError(f'{_NAME}: a must be floating point, got {a.dtype}')
    try:
        if isinstance(iters, bool):
            raise TypeError
        iters = operator.index(iters)
    except TypeError:
        raise ValueError(f'{_NAME}: iters must be an int >= 0 (the number of Newton-Schulz '
                         f'steps), got {iters!r}') from None
    if iters < 0:
        raise ValueError(f'{_NAME}: iters must be an int >= 0 (the number of Newton-Schulz '
                         f'steps), got {iters}')
    if (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
            or eps < 0):
        raise ValueError(f'{_NAME}: eps must be a finite float >= 0 (the diagonal added to a), '
                         f'got {eps!r}')
    return iters


def newton_schulz_triton_reasons(a: torch.Tensor, interpret: Optional[bool] = None) -> List[str]:
    """Reasons the Triton backend cannot run this (validated) input; empty if it can.

    Args:
        interpret: whether Triton's interpreter is on (default: the mode recorded at import,
            ``mmeffattn.ops._backend.TRITON_INTERPRET``).
    """
    # the kernels convert to fp32 before every tl.dot, so bf16 is fine under the interpreter
    return triton_reasons('Newton-Schulz', _KERNELS_IMPORT_ERROR, (a,), (a,), SUPPORTED_DTYPES,
                          interpret=interpret, uses_dot=False)


def newton_schulz_pinv(a: torch.Tensor, iters: int, eps: float, *,
                       backend: Optional[str] = None) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer, SOFT)::

        P = a + eps * I
        alpha = 1.8 / (max_i sum_j P_ij)^2       # per matrix, row sums of P (official CUDA op)
        V = alpha * P
        repeat iters times:  V = 2 V - (V P) V

    Converges to ``P^{-1}`` when ``||I - alpha P^2|| < 1`` (e.g. ``P`` symmetric positive
    definite, as a Laplacian kernel matrix plus ``eps I``); the number of steps it needs grows
    with ``log(cond(P))``. :func:`newton_schulz_residual` reports how far a result is from the
    inverse, so a caller can detect non-convergence.

    Differentiable w.r.t. ``a``: the gradient is the exact derivative of the returned iterate
    (``alpha`` included, not detached), not the gradient of the true inverse.

    The Triton backend keeps the whole iteration of one matrix on chip (one program per matrix,
    ``M`` padded to a power of two with the identity, fp32 accumulation) for ``M <= 128``;
    larger matrices run the same iteration with batched matmuls in PyTorch (fp32), with the same
    hand-written backward. Either way the forward stores the ``iters`` iterates when a gradient
    is needed (``iters * B * heads * M * M`` fp32) and the backward reverses the iteration.

    Args:
        a: ``[B, heads, M, M]``; any strides.
        iters: number of iterations, ``>= 0``.
        eps: diagonal regularization, ``>= 0`` (LaplacianFormer: 0.01).
        backend: ``None`` (automatic), ``'triton'`` or ``'reference'``; see
            :mod:`mmeffattn.ops._backend` (``$MMEFFATTN_OPS_BACKEND`` applies when None).

    Returns:
        ``[B, heads, M, M]`` in a's dtype, computed in fp32 for fp16/bf16 inputs.

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists the reasons).
    """
    iters = _check_inputs(a, iters, eps)
    eps = float(eps)
    chosen = select_backend(_NAME, backend, lambda: newton_schulz_triton_reasons(a), (a,))
    if chosen == 'triton':
        return newton_schulz_pinv_triton(a, iters, eps)
    return newton_schulz_pinv_naive(a, iters, eps)
