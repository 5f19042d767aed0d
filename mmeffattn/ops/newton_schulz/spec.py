"""The Newton-Schulz inverse's facts (see :mod:`mmeffattn.ops._opspec`)."""
import math
from typing import Any

import torch

from .._opspec import OpSpec
from .op import newton_schulz_triton_reasons


def macs(a: torch.Tensor, iters: int, *args: Any, **kwargs: Any) -> int:
    """``V <- 2V - V P V``: two ``M x M`` matmuls per iteration."""
    M = a.shape[-1]
    return math.prod(a.shape[:-2]) * int(iters) * 2 * M ** 3


SPEC = OpSpec(name='newton_schulz_pinv', macs=macs, can_run=newton_schulz_triton_reasons)
