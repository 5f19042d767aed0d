"""LaplacianFormer's Laplacian kernel as the formula (the test oracle)."""
import torch

from .._common import compute_dtype


def laplacian_kernel_naive(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """``out[..., i, j] = exp(-sum_d |x_id - y_jd| / lam)`` for x ``[B, heads, N, D]``, y
    ``[B, heads, M, D]`` (unvalidated; materialises ``[..., N, M, D]``; computed in fp32)."""
    ct = compute_dtype(x.dtype)
    dist = (x.to(ct)[..., :, None, :] - y.to(ct)[..., None, :, :]).abs().sum(-1)
    return torch.exp(-dist / lam).to(x.dtype)
