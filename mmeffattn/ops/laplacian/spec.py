"""The Laplacian kernel's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import OpSpec
from .op import laplacian_triton_reasons


def macs(x: torch.Tensor, y: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """An L1 distance (D differences and sums) for every (x_i, y_j) pair."""
    B, nh, N, D = x.shape
    return B * nh * N * y.shape[2] * D


SPEC = OpSpec(name='laplacian_kernel', macs=macs, can_run=laplacian_triton_reasons)
