"""Core-periphery attention's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import OpSpec, sdpa_macs
from .op import core_periphery_triton_reasons


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
         **kwargs: Any) -> int:
    """The C cores attend over all ``C + N`` keys, the N patches over the C cores only."""
    B, nh, T, D = q.shape
    C = int(num_cores)
    return sdpa_macs(B * nh, C, T, D, v.shape[-1]) + sdpa_macs(B * nh, T - C, C, D, v.shape[-1])


SPEC = OpSpec(name='core_periphery_attention', macs=macs, can_run=core_periphery_triton_reasons)
