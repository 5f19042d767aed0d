"""Pure PyTorch reference of the Newton-Schulz inverse used by LaplacianFormer (and SOFT): the
test oracle and the CPU path."""
import torch

from .._common import autocast_off, compute_dtype

#: numerator of the initial scale ``alpha = ALPHA_NUM / (max_i sum_j P_ij)^2`` (official value)
ALPHA_NUM = 1.8
#: row sums whose square stays in fp32 range; outside, ``alpha P = (P / s) * (ALPHA_NUM / s)``
SQUARE_SAFE = (1e-18, 1e18)


def regularized(a: torch.Tensor, eps: float) -> torch.Tensor:
    """``P = a + eps * I`` for ``a [..., M, M]``."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return a + eps * eye


def initial_iterate(p: torch.Tensor) -> torch.Tensor:
    """``V_0 = alpha P``, ``alpha = 1.8 / s^2``, ``s = max_i sum_j P_ij``, in range for ``|s|``
    from 1e-20 to 1e20. Differentiable; a zero ``s`` gives NaN (the caller's check reports it)."""
    s = p.sum(dim=-1).amax(dim=-1)[..., None, None]  # [..., 1, 1]
    inside = (s.abs() > SQUARE_SAFE[0]) & (s.abs() < SQUARE_SAFE[1])
    s_in = torch.where(inside, s, torch.ones_like(s))  # the other branch's s is a harmless 1,
    s_out = torch.where(inside, torch.ones_like(s), s)  # so neither branch's gradient is NaN
    r1 = torch.where(inside, ALPHA_NUM / (s_in * s_in), 1 / s_out)
    r2 = torch.where(inside, torch.ones_like(s), ALPHA_NUM / s_out)
    return p * r1 * r2


def newton_schulz_pinv_naive(a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}`` (unvalidated)::

        P = a + eps * I
        alpha = 1.8 / (max_i sum_j P_ij)^2      # row sums of P, as the official CUDA operator
        V = alpha * P                           # scaled to stay in range (initial_iterate)
        repeat iters times:  V = 2 V - (V P) V

    ``alpha`` is not detached: the gradient is the exact derivative of the returned iterate.
    a: ``[B, heads, M, M]``; returns a's shape and dtype (computed in fp32).
    """
    with autocast_off(a.device.type):  # fp32 matmuls for 16-bit inputs, as the kernels
        p = regularized(a.to(compute_dtype(a.dtype)), eps)
        v = initial_iterate(p)
        for _ in range(iters):
            v = 2 * v - (v @ p) @ v
    return v.to(a.dtype)


#: ``'unrolled'``: through every step; ``'implicit'``: ``-V^T G V^T`` at the result
BACKWARDS = ('unrolled', 'implicit')


class _ImplicitBackward(torch.autograd.Function):
    """Gives a computed inverse ``v`` of ``a + eps I`` the gradient of the exact inverse."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v)
        # a copy: returning ``v`` itself would make the result a view
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
    """``||P inv - I||_F / sqrt(M)`` per matrix in fp64, no gradient (``[...]`` for
    ``[..., M, M]`` inputs). The iteration converges iff this drops below 1.

    Args:
        a: the matrix given to ``newton_schulz_pinv``.
        inv: its result.
        eps: the ``eps`` given to ``newton_schulz_pinv``.
    """
    with torch.no_grad():
        p = regularized(a.double(), eps)
        eye = torch.eye(a.shape[-1], dtype=torch.float64, device=a.device)
        r = p @ inv.double() - eye
        return torch.linalg.matrix_norm(r) / a.shape[-1] ** 0.5
