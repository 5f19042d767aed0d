"""Core-periphery attention in fast PyTorch: the ``'torch'`` backend (the CPU default)."""
from typing import Optional, Tuple

import torch

from .._common import window_attention
from .naive import core_periphery


def core_periphery_attention_torch(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        scale: Optional[float] = None) -> torch.Tensor:
    """:func:`.naive.core_periphery_attention_naive` with torch's fused attention for fp32 and
    16 keys or more (:func:`mmeffattn.ops._common.window_attention`); same arguments."""
    return core_periphery(q, k, v, num_cores, rope, scale, window_attention)
