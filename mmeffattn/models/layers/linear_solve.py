"""Conjugate-gradient solve of ``(A + eps I) X = B``: LaplacianFormer's solver ablation.

In the Nystrom product ``K(Q, L) (A + eps I)^{-1} [K(L, K) V]`` CG solves against the ``M x Dv``
right-hand side instead of forming the inverse. ``A = K(L, L)`` is symmetric positive definite for
distinct landmarks (Bochner), and ``eps > 0`` keeps it so; CG does not check it. Plain PyTorch: the
systems are small (``M <= 128``). Why CG applies: docs/design/laplacianformer.md.
"""
from typing import Tuple

import torch

from mmeffattn.ops import compute_dtype

__all__ = ['conjugate_gradient_solve', 'cg_iterations']

BACKWARDS = ('implicit', 'unrolled')


def _cg(a: torch.Tensor, b: torch.Tensor, eps: float, iters: int, tol: float
        ) -> Tuple[torch.Tensor, int]:
    """Batched CG on ``(a + eps I) x = b``, one recurrence per column, differentiable (unrolled);
    returns ``x`` and the iterations run.
    """
    def matvec(p: torch.Tensor) -> torch.Tensor:
        return a @ p + eps * p

    x = torch.zeros_like(b)
    r = b.clone()  # residual b - (A + eps I) x for x = 0
    p = r.clone()
    rs = (r * r).sum(dim=-2, keepdim=True)  # [..., 1, K]
    # a zero right-hand side column is solved by x = 0: its threshold 0 is met at once
    threshold = (tol ** 2) * rs.detach()
    tiny = torch.finfo(b.dtype).tiny
    done = 0
    for done in range(1, iters + 1):
        ap = matvec(p)
        pap = (p * ap).sum(dim=-2, keepdim=True)
        # converged columns have p = 0; keep their step 0 instead of 0 / 0
        alpha = rs / pap.clamp_min(tiny)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = (r * r).sum(dim=-2, keepdim=True)
        if bool((rs_new.detach() <= threshold).all()):
            break
        beta = rs_new / rs.clamp_min(tiny)
        p = r + beta * p
        rs = rs_new
    return x, done


def _validate(a: torch.Tensor, b: torch.Tensor, eps: float, iters: int, tol: float,
              backward: str) -> None:
    """Raise ValueError naming the problem and the fix."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise ValueError('conjugate_gradient_solve: a and b must be torch.Tensors')
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f'conjugate_gradient_solve: a must be [..., M, M] (square matrices), '
                         f'got shape {tuple(a.shape)}')
    if b.dim() != a.dim() or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != a.shape[-1]:
        raise ValueError(f'conjugate_gradient_solve: b must be [..., M, K] with the leading dims '
                         f'and M of a {tuple(a.shape)}, got {tuple(b.shape)}; for one '
                         f'right-hand side vector use b[..., None]')
    if not (a.is_floating_point() and b.is_floating_point()):
        raise ValueError(f'conjugate_gradient_solve: a and b must be floating point, got '
                         f'{a.dtype} and {b.dtype}')
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f'conjugate_gradient_solve: iters must be an int >= 1, got {iters!r}')
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f'conjugate_gradient_solve: eps must be a number >= 0, got {eps!r}')
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
        raise ValueError(f'conjugate_gradient_solve: tol must be a number >= 0, got {tol!r}')
    if backward not in BACKWARDS:
        raise ValueError(f'conjugate_gradient_solve: backward must be one of {BACKWARDS}, '
                         f'got {backward!r}')


class _ImplicitCG(torch.autograd.Function):
    """Forward: CG. Backward: the implicit-function gradient of ``X = (A + eps I)^{-1} B`` with one
    more CG solve (``A`` symmetric): ``dB = (A + eps I)^{-1} dX``, ``dA = -dB X^T``."""

    @staticmethod
    def forward(ctx, a, b, eps, iters, tol):
        with torch.no_grad():
            x, _ = _cg(a, b, eps, iters, tol)
        ctx.save_for_backward(a, x)
        ctx.eps, ctx.iters, ctx.tol = eps, iters, tol
        return x

    @staticmethod
    def backward(ctx, grad_x):
        a, x = ctx.saved_tensors
        with torch.no_grad():
            grad_b, _ = _cg(a, grad_x, ctx.eps, ctx.iters, ctx.tol)
        grad_a = -grad_b @ x.transpose(-2, -1) if ctx.needs_input_grad[0] else None
        return grad_a, grad_b, None, None, None


def conjugate_gradient_solve(a: torch.Tensor, b: torch.Tensor, eps: float = 0., *,
                             iters: int = 20, tol: float = 1e-6,
                             backward: str = 'implicit') -> torch.Tensor:
    """Solve ``(a + eps I) x = b`` by conjugate gradients from ``x = 0``, batched over leading dims.

    Args:
        a: ``[..., M, M]`` symmetric positive (semi-)definite; not checked.
        b: ``[..., M, K]`` right-hand sides.
        eps, iters, tol: ridge, iteration cap, relative residual (0 runs all ``iters``).
        backward: ``'implicit'`` (one more CG solve, memory independent of ``iters``) or
            ``'unrolled'`` (autograd through the iterations).

    Returns:
        ``x [..., M, K]`` in b's dtype (float32 inside for 16-bit inputs).
    """
    _validate(a, b, eps, iters, tol, backward)
    dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
    a_c, b_c = a.to(dtype), b.to(dtype)
    if backward == 'unrolled':
        x, _ = _cg(a_c, b_c, float(eps), iters, float(tol))
    else:
        x = _ImplicitCG.apply(a_c, b_c, float(eps), iters, float(tol))
    return x.to(b.dtype)


def cg_iterations(a: torch.Tensor, b: torch.Tensor, eps: float = 0., iters: int = 20,
                  tol: float = 1e-6) -> int:
    """How many iterations :func:`conjugate_gradient_solve` runs on this system (no gradient);
    for the solver ablation's cost column."""
    _validate(a, b, eps, iters, tol, 'implicit')
    with torch.no_grad():
        dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
        return _cg(a.to(dtype), b.to(dtype), float(eps), iters, float(tol))[1]

