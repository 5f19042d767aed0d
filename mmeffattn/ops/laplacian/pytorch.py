"""LaplacianFormer's Laplacian kernel in fast PyTorch: the ``'torch'`` backend (the CPU
default)."""
import torch

from .._common import compute_dtype


def laplacian_kernel_torch(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """:func:`.naive.laplacian_kernel_naive` through ``torch.cdist(p=1)``, which sums
    ``|x_i - y_j|`` without an ``[N, M, D]`` tensor; its gradient is ``sign(x_i - y_j)`` (zero
    on ties), as the reference's and the kernels'. Same arguments and result."""
    ct = compute_dtype(x.dtype)
    dist = torch.cdist(x.to(ct), y.to(ct), p=1)  # [B, heads, N, M]
    return torch.exp(dist * (-1.0 / lam)).to(x.dtype)
