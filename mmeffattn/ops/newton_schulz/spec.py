"""The Newton-Schulz inverse's facts (see :mod:`mmeffattn.ops._opspec`)."""
import math
from typing import Any

import torch

from .._opspec import Example, OpSpec, as_dtype, randn
from .op import MAX_TRITON_M, newton_schulz_pinv, newton_schulz_triton_reasons

#: LaplacianFormer's steps and regularization, and the kernel width of its landmark matrices
SETTINGS = dict(iters=20, eps=0.01, lam=4.0)


def macs(a: torch.Tensor, iters: int, *args: Any, **kwargs: Any) -> int:
    """``V <- 2V - V P V``: two ``M x M`` matmuls per iteration."""
    M = a.shape[-1]
    return math.prod(a.shape[:-2]) * int(iters) * 2 * M ** 3


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 1, heads: int = 1,
            M: int = 49, iters: int = SETTINGS['iters'], D: int = 64, **_: Any) -> Example:
    """A landmark kernel matrix as LaplacianFormer inverts it: ``exp(-|l_i - l_j|_1 / lam)``
    of M random landmarks of D channels (symmetric positive definite)."""
    z = randn(B, heads, M, D, device=device, scale=0.3)
    a = torch.exp(-torch.cdist(z, z, p=1) / SETTINGS['lam']).to(as_dtype(dtype))

    def fn(backend, a):
        return newton_schulz_pinv(a, iters, SETTINGS['eps'], backend=backend)
    return Example(fn, [a], macs(a, iters))


def record(M: int = 13, iters: int = 3, dtype: str = 'fp32', B: int = 1, heads: int = 2) -> None:
    """The forward keeping its iterates, the inference forward (nothing stored), the
    backward."""
    from . import function
    assert M <= MAX_TRITON_M, 'larger matrices run the torch backend, no kernel'
    a = torch.empty(B, heads, M, M, dtype=as_dtype(dtype))
    out, ws = function.newton_schulz_fwd(a, iters, 0.01, True)
    function.newton_schulz_fwd(a, iters, 0.01, False)
    function.newton_schulz_bwd(torch.empty_like(out), a, ws, iters, 0.01)


SPEC = OpSpec(name='newton_schulz_pinv', macs=macs, can_run=newton_schulz_triton_reasons,
              settings=SETTINGS, example=example, record=record,
              gpu_sizes=(dict(B=8, heads=1, M=49, iters=20), dict(B=2, heads=1, M=256, iters=20)))
