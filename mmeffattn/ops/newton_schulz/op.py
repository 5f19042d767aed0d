"""Public Newton-Schulz inverse op: validates its inputs and dispatches to a backend."""
from typing import List, Optional

import torch

from .._backend import KERNEL_DTYPES, dispatch, triton_reasons
from .._common import import_kernels, is_eager
from .._validate import check_alike, check_int, check_not_empty, check_real, check_tensor
from .naive import newton_schulz_pinv_naive
from .pytorch import newton_schulz_pinv_torch

newton_schulz_pinv_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'newton_schulz_pinv_triton', module='library')
#: largest matrix side the kernels take (a block of rows of each matrix in registers)
MAX_TRITON_M = 256
#: ``'unrolled'``: through every step; ``'implicit'``: ``-V^T G V^T`` at the result
BACKWARDS = ('unrolled', 'implicit')

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


def newton_schulz_residual(a: torch.Tensor, inv: torch.Tensor, eps: float) -> torch.Tensor:
    """``||P inv - I||_F / sqrt(M)`` per matrix in fp64, no gradient (``[...]`` for
    ``[..., M, M]`` inputs). The iteration converges iff this drops below 1.

    Args:
        a: the matrix given to ``newton_schulz_pinv``.
        inv: its result.
        eps: the ``eps`` given to ``newton_schulz_pinv``.
    """
    with torch.no_grad():
        eye = torch.eye(a.shape[-1], dtype=torch.float64, device=a.device)
        r = (a.double() + eps * eye) @ inv.double() - eye
        return torch.linalg.matrix_norm(r) / a.shape[-1] ** 0.5


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
    reasons = triton_reasons('Newton-Schulz', _KERNELS_IMPORT_ERROR, (a,), (a,), KERNEL_DTYPES,
                             interpret=interpret, uses_dot=False)
    if a.shape[-1] > MAX_TRITON_M:
        reasons.append(f'matrix side {a.shape[-1]} > {MAX_TRITON_M} (the kernels keep a block of '
                       f'rows of each matrix in registers)')
    return reasons


def newton_schulz_pinv(a: torch.Tensor, iters: int, eps: float, *,
                       backward: str = 'unrolled',
                       check: Optional[bool] = None,
                       backend: Optional[str] = None) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer, SOFT)::

        P = a + eps * I
        s = max_i sum_j P_ij                     # per matrix, row sums of P (official CUDA op)
        V = (1.8 / s^2) * P                      # torch, Triton: (P / s) (1.8 / s), in range
                                                 # where s^2 is not (the reference as written)
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
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``[B, heads, M, M]`` in a's dtype, computed in fp32 for fp16/bf16 inputs (each step
        squares the previous one's error, rounding included: 16-bit iterates stall far from the
        inverse).

    Raises:
        ValueError: malformed inputs (the message says what to change), or ``check`` found a
            matrix it could not invert.
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    iters = _check_inputs(a, iters, eps, backward)
    out = dispatch(_NAME, backend, lambda: newton_schulz_triton_reasons(a), (a, ),
                   newton_schulz_pinv_triton, newton_schulz_pinv_torch, newton_schulz_pinv_naive,
                   a, iters, float(eps), backward == 'implicit')
    if check or (check is None and a.device.type == 'cpu' and is_eager(a)):
        check_converged(a, out.detach(), iters, eps)
    return out
