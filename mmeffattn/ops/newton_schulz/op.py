"""Public Newton-Schulz inverse op: validates its inputs and dispatches to a backend."""
import contextlib
from typing import List, Optional

import torch

from .._backend import KERNEL_DTYPES as SUPPORTED_DTYPES  # noqa: F401 (public)
from .._backend import dispatch, triton_reasons
from .._common import import_kernels, is_eager
from .._validate import check_alike, check_int, check_not_empty, check_real, check_tensor
from .naive import (BACKWARDS, newton_schulz_pinv_naive, newton_schulz_residual,
                    with_implicit_backward)

newton_schulz_pinv_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'newton_schulz_pinv_triton', module='library')

#: the ``'torch'`` backend: the reference (batched matmuls) has no faster form
newton_schulz_pinv_torch = newton_schulz_pinv_naive

_NAME = 'newton_schulz_pinv'


#: a residual ``||P inv - I||_F / sqrt(M)`` at or above this has not converged
MAX_RESIDUAL = 1.0


def _check_inputs(a: torch.Tensor, iters: int, eps: float, backward: str) -> int:
    """Raise ValueError naming the problem and the fix; return ``iters`` as an int."""
    if backward not in BACKWARDS:
        raise ValueError(f'{_NAME}: backward must be one of {BACKWARDS}, got {backward!r}')
    check_tensor(_NAME, 'a', a, '[B, heads, M, M]', 'add the missing dims with a[None] or '
                 'reshape')
    if a.shape[2] != a.shape[3]:
        raise ValueError(f'{_NAME}: a must hold square matrices [B, heads, M, M], got shape '
                         f'{tuple(a.shape)}; pass the landmark-landmark kernel matrix')
    check_not_empty(_NAME, 'a', a, '[B, heads, M, M]')
    check_alike(_NAME, (('a', a), ))
    check_real(_NAME, 'eps', eps, 'the diagonal added to a', nonnegative=True)
    return check_int(_NAME, 'iters', iters, 0, 'the number of Newton-Schulz steps')


def check_converged(a: torch.Tensor, inv: torch.Tensor, iters: int, eps: float) -> None:
    """Raise ValueError if a matrix of ``a`` without NaN or inf entries got a result whose
    residual (:func:`newton_schulz_residual`) is NaN, inf or ``>= MAX_RESIDUAL``: ``a + eps I``
    is not invertible by the iteration (e.g. zero) or did not converge in ``iters`` steps.
    Matrices with a non-finite entry are left to the NaN contract (their result is NaN)."""
    res = newton_schulz_residual(a, inv, eps)  # [B, heads] fp64
    finite = torch.isfinite(a.detach()).flatten(-2).all(-1)
    bad = (finite & ~(res < MAX_RESIDUAL)).nonzero().tolist()
    if bad:
        shown = ', '.join(f'[{b}, {h}] {res[b, h].item():.3g}' for b, h in bad[:4])
        raise ValueError(f'{_NAME}: {len(bad)} of the {finite.numel()} matrices did not converge '
                         f'to an inverse of a + eps I (residual ||P inv - I||_F / sqrt(M) >= '
                         f'{MAX_RESIDUAL:g}; [batch, head] residual: {shown}'
                         f'{", ..." if len(bad) > 4 else ""}) after iters={iters}: the matrix is '
                         f'singular (e.g. all zero), too ill-conditioned for that many steps (add '
                         f'eps > 0, eps={eps:g} now, or iterations), or outside what the '
                         f'iteration inverts (not symmetric enough, or negative entries that make '
                         f'its largest row sum smaller than its largest eigenvalue: more steps '
                         f'cannot help; it is meant for kernel matrices with nonnegative '
                         f'entries). Pass check=False to get the iterate anyway')


def newton_schulz_triton_reasons(a: torch.Tensor, interpret: Optional[bool] = None) -> List[str]:
    """Reasons the Triton backend cannot run this (validated) input; empty if it can."""
    # the kernels convert to fp32 before every tl.dot, so bf16 is fine under the interpreter
    return triton_reasons('Newton-Schulz', _KERNELS_IMPORT_ERROR, (a,), (a,), SUPPORTED_DTYPES,
                          interpret=interpret, uses_dot=False)


def newton_schulz_pinv(a: torch.Tensor, iters: int, eps: float, *,
                       backward: str = 'unrolled',
                       check: Optional[bool] = None,
                       backend: Optional[str] = None) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer, SOFT)::

        P = a + eps * I
        s = max_i sum_j P_ij                     # per matrix, row sums of P (official CUDA op)
        V = (1.8 / s^2) * P                      # as (P / s) * (1.8 / s) when s^2 would leave
                                                 # the float range (|s| outside 1e-18..1e18)
        repeat iters times:  V = 2 V - (V P) V

    Converges to ``P^{-1}`` for symmetric positive definite ``P`` with nonnegative entries
    (a Laplacian kernel matrix plus ``eps I``) in about ``log(cond(P))`` steps. Non-finite
    inputs: the NaN contract of :mod:`mmeffattn.ops` (a NaN or inf makes its whole matrix NaN,
    not reported by ``check``).

    Args:
        a: ``[B, heads, M, M]``; any strides.
        iters: number of iterations, ``>= 0``.
        eps: diagonal regularization, ``>= 0`` (LaplacianFormer: 0.01).
        backward: ``'unrolled'`` (exact derivative of the returned iterate) or
            ``'implicit'`` (``-V^T G V^T``, the exact inverse's, as the official CUDA op; it
            stores only the result). They agree once converged.
        check: raise ``ValueError`` naming the matrices whose residual is NaN or ``>= 1``.
            None: only for eager CPU inputs (on a GPU the check syncs the host; a captured
            graph cannot branch on it).
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``
            (:mod:`mmeffattn.ops._backend`).

    Returns:
        ``[B, heads, M, M]`` in a's dtype, computed in fp32 for fp16/bf16 inputs.

    Raises:
        ValueError: malformed inputs (the message says what to change), or ``check`` found a
            matrix it could not invert.
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    iters = _check_inputs(a, iters, eps, backward)
    eps = float(eps)
    implicit = backward == 'implicit' and torch.is_grad_enabled() and a.requires_grad
    with torch.no_grad() if implicit else contextlib.nullcontext():
        out = dispatch(_NAME, backend, lambda: newton_schulz_triton_reasons(a), (a, ),
                       newton_schulz_pinv_triton, newton_schulz_pinv_torch,
                       newton_schulz_pinv_naive, a, iters, eps)
    if implicit:
        out = with_implicit_backward(a, out)
    if check or (check is None and a.device.type == 'cpu' and is_eager(a)):
        check_converged(a, out.detach(), iters, eps)
    return out
