"""Pure PyTorch reference of LaplacianFormer's Laplacian kernel: the test oracle and the CPU
path."""
import torch

from .._common import compute_dtype  # noqa: F401  (imported from here before _common)


def laplacian_kernel_naive(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """``out[..., i, j] = exp(-||x_i - y_j||_1 / lam)``, differentiable w.r.t. ``x`` and ``y``.

    Does not validate its inputs (``laplacian_kernel`` does). ``torch.cdist`` with ``p=1`` sums
    ``|x_i - y_j|`` directly (no ``[N, M, D]`` tensor, no matmul expansion) and its gradient is
    ``sign(x_i - y_j)`` (zero on ties), the same convention as the Triton backward.

    Args:
        x: ``[B, heads, N, D]`` (queries).
        y: ``[B, heads, M, D]`` (keys / landmarks), x's dtype and device.
        lam: the kernel width, a positive float.

    Returns:
        ``[B, heads, N, M]`` in x's dtype (computed in fp32 for fp16/bf16 inputs).
    """
    ct = compute_dtype(x.dtype)
    dist = torch.cdist(x.to(ct), y.to(ct), p=1)  # [B, heads, N, M]
    return torch.exp(dist * (-1.0 / lam)).to(x.dtype)
