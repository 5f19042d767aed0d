"""LaplacianFormer's Laplacian kernel in fast PyTorch: the ``'torch'`` backend (the CPU default)."""
import torch

from .._common import compute_dtype


def laplacian_kernel_torch(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """:func:`.naive.laplacian_kernel_naive` through ``torch.cdist(p=1)`` (no ``[N, M, D]``
    tensor; the same ``sign`` gradient)."""
    ct = compute_dtype(x.dtype)
    dist = torch.cdist(x.to(ct), y.to(ct), p=1)  # [B, heads, N, M]
    return torch.exp(dist * (-1.0 / lam)).to(x.dtype)
