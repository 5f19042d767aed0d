"""WeightFormer's bilateral dynamic weight as the formula (the test oracle)."""
from typing import Optional

import torch

from .._common import autocast_off, compute_dtype


def dynamic_weight_naive(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                         scale: Optional[float] = None,
                         weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalized predicted weight in ``nn.Linear``'s layout::

        R[b, j, i] = scale / n_tokens * sum_m v[b, m, j] u[b, m, i]   # [B, C_out, C_in]
        out = R / (||R_j|| + 1)  (+ weight)       # each output row j, norm over its C_in inputs

    Unvalidated; arguments as ``dynamic_weight``. Computed in fp32 for 16-bit inputs; returns
    u's dtype promoted with weight's.
    """
    scale = u.shape[-1] ** -0.5 if scale is None else scale
    dtype = u.dtype if weight is None else torch.promote_types(u.dtype, weight.dtype)
    ct = compute_dtype(u.dtype)
    with autocast_off(u.device.type):
        r = torch.einsum('bmj,bmi->bji', v.to(ct), u.to(ct)) * (scale / n_tokens)
        out = r / (torch.linalg.vector_norm(r, dim=-1, keepdim=True) + 1)
        return (out if weight is None else out + weight.to(ct)).to(dtype)
