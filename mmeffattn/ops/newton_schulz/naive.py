"""The Newton-Schulz inverse as LaplacianFormer (and SOFT) write it: the test oracle."""
import contextlib

import torch

from .._common import autocast_off, compute_dtype

#: numerator of the initial scale ``alpha = ALPHA_NUM / (max_i sum_j P_ij)^2`` (official value)
ALPHA_NUM = 1.8


def implicit_gradient(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``v``, an inverse of ``p`` computed without a graph, with the exact inverse's gradient:
    ``d(P^-1) = -P^-1 dP P^-1``, so ``dL/dP = -V^T G V^T`` (the official backward). The value
    stays ``v``'s: ``y - y`` is zero, and only ``-y = -V P V`` carries a gradient."""
    y = v @ p @ v
    return v + (y.detach() - y)


def newton_schulz_pinv_naive(a: torch.Tensor, iters: int, eps: float,
                             implicit: bool = False) -> torch.Tensor:
    """Newton-Schulz approximation of ``(a + eps I)^{-1}`` (unvalidated)::

        P = a + eps * I
        alpha = 1.8 / (max_i sum_j P_ij)^2      # row sums of P, as the official CUDA operator
        V = alpha * P
        repeat iters times:  V = 2 V - (V P) V

    ``alpha`` is not detached: the gradient is the exact derivative of the returned iterate, or
    with ``implicit`` the exact inverse's (:func:`implicit_gradient`). a: ``[B, heads, M, M]``;
    returns a's shape and dtype (computed in fp32 for 16-bit inputs, autocast off).
    """
    ct = compute_dtype(a.dtype)
    with autocast_off(a.device.type):
        p = a.to(ct) + eps * torch.eye(a.shape[-1], dtype=ct, device=a.device)
        with torch.no_grad() if implicit else contextlib.nullcontext():
            alpha = ALPHA_NUM / p.sum(dim=-1).amax(dim=-1)[..., None, None] ** 2
            v = alpha * p
            for _ in range(iters):
                v = 2 * v - (v @ p) @ v
        if implicit and p.requires_grad:
            v = implicit_gradient(p, v)
    return v.to(a.dtype)
