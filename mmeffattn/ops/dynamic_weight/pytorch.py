"""The dynamic weight in PyTorch: the ``'torch'`` backend (the CPU default), with
``DynamicLinear``'s arithmetic and order, so that WeightFormer's results are the official
code's bit for bit. In the inputs' dtype (the matmul and the norm accumulate in fp32), following
autocast."""
from typing import Optional

import torch


def dynamic_weight_torch(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                         scale: Optional[float] = None,
                         weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`.naive.dynamic_weight_naive` as ``(v^T u) * scale / n_tokens``; same arguments."""
    scale = u.shape[-1] ** -0.5 if scale is None else scale
    dw = v.transpose(1, 2) @ u * scale / n_tokens  # [B, C_out, C_in]
    dw = dw / (dw.norm(dim=-1, keepdim=True) + 1.0)
    return dw if weight is None else dw + weight
