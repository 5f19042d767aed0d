"""LaplacianFormer's Laplacian kernel written as the formula, in plain tensor operations: the
test oracle."""
import torch

from .._common import compute_dtype


def laplacian_kernel_naive(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """``out[..., i, j] = exp(-sum_d |x_id - y_jd| / lam)``, differentiable w.r.t. ``x`` and
    ``y`` (through ``sign(x_i - y_j)``, zero on ties). Materialises ``[..., N, M, D]``.

    Does not validate its inputs (``laplacian_kernel`` does).

    Args:
        x: ``[B, heads, N, D]`` (queries).
        y: ``[B, heads, M, D]`` (keys / landmarks), x's dtype and device.
        lam: the kernel width, a positive float.

    Returns:
        ``[B, heads, N, M]`` in x's dtype (computed in fp32 for fp16/bf16 inputs).
    """
    ct = compute_dtype(x.dtype)
    dist = (x.to(ct)[..., :, None, :] - y.to(ct)[..., None, :, :]).abs().sum(-1)
    return torch.exp(-dist / lam).to(x.dtype)
