"""Pure PyTorch reference of WeightFormer's bilateral dynamic weight: the test oracle and the CPU
path. The arithmetic (and its order) is that of ``DynamicLinear`` before the op existed, so the
model gives bit-identical results through this path."""
from typing import Optional

import torch


def dynamic_weight_naive(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                         scale: Optional[float] = None,
                         weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalized predicted weight ``dW`` (plus an optional static weight), ``nn.Linear`` layout.

    Does not validate its inputs (``dynamic_weight`` does); works for any float dtype and device
    and is differentiable::

        R = v^T u * scale / n_tokens              # [B, C_out, C_in], reduction over the M tokens
        out = R / (||R_j|| + 1)  (+ weight)       # each output row j, norm over its C_in inputs

    Args:
        u: ``[B, M, C_in]`` input-side factor ``SiLU(A_in) @ in_basis``.
        v: ``[B, M, C_out]`` output-side factor ``SiLU(A_out) @ out_basis``.
        n_tokens: the divisor ``N`` (WeightFormer: all ``H * W`` tokens, not the ``M`` pooled).
        scale: multiplier, ``C_in ** -0.5`` by default.
        weight: optional static weight ``[C_out, C_in]`` added after the normalization (the
            result then has the promoted dtype of ``u`` and ``weight``).

    Returns:
        ``[B, C_out, C_in]``.
    """
    scale = u.shape[-1] ** -0.5 if scale is None else scale
    dw = v.transpose(1, 2) @ u * scale / n_tokens  # [B, C_out, C_in]
    dw = dw / (dw.norm(dim=-1, keepdim=True) + 1.0)
    return dw if weight is None else dw + weight
