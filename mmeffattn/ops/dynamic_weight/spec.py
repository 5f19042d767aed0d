"""The dynamic weight's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import OpSpec
from .op import dynamic_weight_triton_reasons


def macs(u: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """``v^T u`` over the M pooled tokens, plus the row norms (one MAC per weight entry)."""
    B, M, c_in = u.shape
    return B * v.shape[2] * c_in * (M + 1)


SPEC = OpSpec(name='dynamic_weight', macs=macs, can_run=dynamic_weight_triton_reasons)
