"""WeightFormer's bilateral dynamic weight as the formula: the oracle and the torch backend
(``DynamicLinear``'s arithmetic and order, so the model's results are bit-identical)."""
from typing import Optional

import torch


def dynamic_weight_naive(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                         scale: Optional[float] = None,
                         weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalized predicted weight in ``nn.Linear``'s layout::

        R = v^T u * scale / n_tokens              # [B, C_out, C_in], reduction over the M tokens
        out = R / (||R_j|| + 1)  (+ weight)       # each output row j, norm over its C_in inputs

    Unvalidated; arguments as ``dynamic_weight``.
    """
    scale = u.shape[-1] ** -0.5 if scale is None else scale
    dw = v.transpose(1, 2) @ u * scale / n_tokens  # [B, C_out, C_in]
    dw = dw / (dw.norm(dim=-1, keepdim=True) + 1.0)
    return dw if weight is None else dw + weight
