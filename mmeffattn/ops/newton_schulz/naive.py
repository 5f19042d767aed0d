"""Pure PyTorch reference of the Newton-Schulz inverse used by LaplacianFormer (and SOFT): the
test oracle and the CPU path."""
import torch

from .._common import autocast_off, compute_dtype

#: numerator of the initial scale ``alpha = ALPHA_NUM / (max_i sum_j P_ij)^2`` (official value)
ALPHA_NUM = 1.8
#: row sums ``s`` whose square stays well inside the fp32 range: ``alpha P`` is computed as
#: ``P * (ALPHA_NUM / s^2)`` inside (the official arithmetic), as ``(P / s) * (ALPHA_NUM / s)``
#: outside, where ``s^2`` would overflow to inf (1e20 I gave zeros) or ``1 / s^2`` would (1e-20 I
#: gave NaN)
SQUARE_SAFE = (1e-18, 1e18)


def regularized(a: torch.Tensor, eps: float) -> torch.Tensor:
    """``P = a + eps * I`` for ``a [..., M, M]``."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return a + eps * eye


def initial_scale(p: torch.Tensor) -> torch.Tensor:
    """``alpha = 1.8 / (max_i sum_j P_ij)^2`` per matrix, ``[..., 1, 1]``; differentiable (on a
    tie of the largest row sums the gradient is shared evenly, as ``amax``'s)."""
    s = p.sum(dim=-1).amax(dim=-1)  # [...]
    return (ALPHA_NUM / (s * s))[..., None, None]


def initial_iterate(p: torch.Tensor) -> torch.Tensor:
    """``V_0 = alpha P`` with ``alpha = 1.8 / s^2``, ``s = max_i sum_j P_ij`` per matrix, scaled
    so that it neither overflows nor underflows for ``|s|`` from 1e-20 to 1e20 (see
    :data:`SQUARE_SAFE`; bit-identical to ``initial_scale(p) * p`` inside that range).
    Differentiable; a zero ``s`` gives NaN (the caller's check reports it)."""
    s = p.sum(dim=-1).amax(dim=-1)[..., None, None]  # [..., 1, 1]
    inside = (s.abs() > SQUARE_SAFE[0]) & (s.abs() < SQUARE_SAFE[1])
    s_in = torch.where(inside, s, torch.ones_like(s))  # the other branch's s is a harmless 1,
    s_out = torch.where(inside, torch.ones_like(s), s)  # so neither branch's gradient is NaN
    r1 = torch.where(inside, ALPHA_NUM / (s_in * s_in), 1 / s_out)
    r2 = torch.where(inside, torch.ones_like(s), ALPHA_NUM / s_out)
    return p * r1 * r2


def newton_schulz_pinv_naive(a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}``, differentiable w.r.t. ``a``.

    Does not validate its inputs (``newton_schulz_pinv`` does)::

        P = a + eps * I
        alpha = 1.8 / (max_i sum_j P_ij)^2      # row sums of P, as the official CUDA operator
        V = alpha * P                           # scaled to stay in range (initial_iterate)
        repeat iters times:  V = 2 V - (V P) V

    ``alpha`` is part of the graph (not detached), so the gradient is the exact derivative of
    the returned iterate, whether or not the iteration has converged.

    Args:
        a: ``[B, heads, M, M]`` (any leading dims work here).
        iters: number of iterations, ``>= 0``.
        eps: diagonal regularization.

    Returns:
        ``[B, heads, M, M]`` in a's dtype (computed in fp32 for fp16/bf16 inputs).
    """
    with autocast_off(a.device.type):  # fp32 matmuls for 16-bit inputs, as the kernels
        p = regularized(a.to(compute_dtype(a.dtype)), eps)
        v = initial_iterate(p)
        for _ in range(iters):
            v = 2 * v - (v @ p) @ v
    return v.to(a.dtype)


#: the backwards (what the gradient w.r.t. ``a`` is): ``'unrolled'``, the exact derivative of
#: the returned iterate (backpropagated through every step; the iterates are stored);
#: ``'implicit'``, the derivative of the exact inverse evaluated at the result, ``-V^T G V^T``
#: (the official LaplacianFormer CUDA operator's and SOFT's backward; nothing stored but the
#: result)
BACKWARDS = ('unrolled', 'implicit')


class _ImplicitBackward(torch.autograd.Function):
    """Gives a computed inverse ``v`` of ``a + eps I`` the gradient of the exact inverse."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v)
        # a copy (M x M per matrix, small next to the iteration): returning ``v`` itself would
        # make the result a view, which autograd refuses to modify in place
        return v.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        v, = ctx.saved_tensors
        vt = v.to(compute_dtype(v.dtype)).transpose(-1, -2)
        # d(P^-1) = -P^-1 dP P^-1, so dL/dP = -P^-T G P^-T; P = a + eps I gives dL/da = dL/dP
        return -(vt @ g.to(vt.dtype) @ vt).to(v.dtype), None


def with_implicit_backward(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``v`` (``[..., M, M]``, computed without a graph) as a differentiable function of ``a``
    whose backward is ``-V^T G V^T`` (``backward='implicit'``); differentiable once."""
    return _ImplicitBackward.apply(a, v)


def newton_schulz_residual(a: torch.Tensor, inv: torch.Tensor, eps: float) -> torch.Tensor:
    """How far ``inv`` is from ``(a + eps I)^{-1}``: ``||P inv - I||_F / sqrt(M)`` per matrix,
    computed in fp64 (no gradient). 0 for the exact inverse; the Newton-Schulz iteration
    converges iff this drops below 1, so a value near or above 1 means it has not converged
    (too few ``iters``, or a condition number too large for them).

    Args:
        a: ``[..., M, M]`` the matrix given to ``newton_schulz_pinv``.
        inv: ``[..., M, M]`` its result.
        eps: the ``eps`` given to ``newton_schulz_pinv``.

    Returns:
        ``[...]`` fp64 on a's device.
    """
    with torch.no_grad():
        p = regularized(a.double(), eps)
        eye = torch.eye(a.shape[-1], dtype=torch.float64, device=a.device)
        r = p @ inv.double() - eye
        return torch.linalg.matrix_norm(r) / a.shape[-1] ** 0.5
