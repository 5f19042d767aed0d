"""The Laplacian kernel's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any

import torch

from .._opspec import Example, OpSpec, as_dtype, randn
from .op import laplacian_kernel, laplacian_triton_reasons

#: LaplacianFormer's kernel width
SETTINGS = dict(lam=4.0)


def macs(x: torch.Tensor, y: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """An L1 distance (D differences and sums) for every (x_i, y_j) pair."""
    B, nh, N, D = x.shape
    return B * nh * N * y.shape[2] * D


def _inputs(B: int, heads: int, N: int, M: int, D: int, layout: str, make) -> None:
    """x ``[B, heads, N, D]`` and y ``[B, heads, M, D]`` from ``make(*shape)``; ``'tokens'``:
    views of ``[B, tokens, heads, D]`` projections."""
    if layout == 'tokens':
        return [make(B, n, heads, D).transpose(1, 2) for n in (N, M)]
    return [make(B, heads, n, D) for n in (N, M)]


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 1, heads: int = 1,
            N: int = 3136, M: int = 49, D: int = 64, layout: str = 'contiguous',
            **_: Any) -> Example:
    """Queries and landmarks, entries of about 0.3 (kernel values spread over (0, 1))."""
    inputs = _inputs(B, heads, N, M, D, layout,
                     lambda *s: randn(*s, device=device, dtype=dtype, scale=0.3))

    def fn(backend, x, y):
        return laplacian_kernel(x, y, SETTINGS['lam'], backend=backend)
    return Example(fn, inputs, macs(*inputs))


def record(N: int = 37, M: int = 13, D: int = 24, dtype: str = 'fp32',
           layout: str = 'contiguous', B: int = 1, heads: int = 2) -> None:
    from . import function
    x, y = _inputs(B, heads, N, M, D, layout, lambda *s: torch.empty(*s, dtype=as_dtype(dtype)))
    out = function.laplacian_fwd(x, y, 1.0)
    function.laplacian_bwd(torch.empty_like(out), x, y, out, 1.0)


SPEC = OpSpec(name='laplacian_kernel', macs=macs, can_run=laplacian_triton_reasons,
              settings=SETTINGS, example=example, record=record,
              gpu_sizes=(dict(B=8, heads=1, N=3136, M=49, D=64),  # LaplacianFormer-T stage 1,
                         dict(B=2, heads=1, N=16384, M=256, D=64)))  # landmarks in 8x8 cells
