"""The Newton-Schulz inverse in PyTorch: the ``'torch'`` backend (the CPU default, and matrices
past the kernels' size)."""
import contextlib

import torch

from .._common import autocast_off, compute_dtype
from .naive import ALPHA_NUM, implicit_gradient

def initial_iterate(p: torch.Tensor) -> torch.Tensor:
    """``V_0 = alpha P``, ``alpha = 1.8 / s^2``, ``s = max_i sum_j P_ij``, applied as
    ``(P / s) (1.8 / s)``: value and gradient stay in fp32 range where ``s^2`` or ``1 / s^3``
    would not (``|s|`` from about 1e-19 to 1e19). A zero ``s`` gives NaN (the check reports it)."""
    s = p.sum(dim=-1).amax(dim=-1)[..., None, None]  # [..., 1, 1]
    return p / s * (ALPHA_NUM / s)


def newton_schulz_pinv_torch(a: torch.Tensor, iters: int, eps: float,
                             implicit: bool = False) -> torch.Tensor:
    """:func:`.naive.newton_schulz_pinv_naive` with the first iterate kept in range
    (:func:`initial_iterate`) and each step one fused ``baddbmm``; same arguments. fp32 for
    16-bit inputs: the iteration squares its own rounding error."""
    ct = compute_dtype(a.dtype)
    with autocast_off(a.device.type):
        p = a.to(ct) + eps * torch.eye(a.shape[-1], dtype=ct, device=a.device)
        p3 = p.reshape(-1, *p.shape[-2:])  # [B * heads, M, M]
        with torch.no_grad() if implicit else contextlib.nullcontext():
            v = initial_iterate(p3)
            for _ in range(iters):
                v = torch.baddbmm(v, v @ p3, v, beta=2, alpha=-1)  # 2 V - (V P) V
        if implicit and p.requires_grad:
            v = implicit_gradient(p3, v)
    return v.reshape(a.shape).to(a.dtype)
