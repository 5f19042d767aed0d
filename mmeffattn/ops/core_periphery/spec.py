"""Core-periphery attention's facts (see :mod:`mmeffattn.ops._opspec`)."""
import math
from typing import Any, Optional

import torch

from .._opspec import Example, OpSpec, as_dtype, randn, sdpa_macs
from .op import core_periphery_attention, core_periphery_triton_reasons

#: VECA's largest core budget
SETTINGS = dict(num_cores=64)


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
         **kwargs: Any) -> int:
    """The C cores attend over all ``C + N`` keys, the N patches over the C cores only."""
    B, nh, T, D = q.shape
    C = int(num_cores)
    return sdpa_macs(B * nh, C, T, D, v.shape[-1]) + sdpa_macs(B * nh, T - C, C, D, v.shape[-1])


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 1, heads: int = 2,
            C: int = SETTINGS['num_cores'], N: int = 196, D: int = 32,
            rope: Optional[str] = 'shared', rope_grad: bool = False, **_: Any) -> Example:
    """``[B, heads, C + N, D]`` q, k, v; ``rope``: None, or fp32 tables of random angles (per
    channel pair, as VECA's ``Rotary2D``) ``'batch'`` ``[B, C + N, D]`` or ``'shared'``
    ``[1, C + N, D]``, inputs too with ``rope_grad``."""
    L = C + N
    inputs = [randn(B, heads, L, D, device=device, dtype=dtype) for _ in range(3)]
    tables = ()
    if rope:
        angles = torch.rand(B if rope == 'batch' else 1, L, D // 2, device=device)
        angles = angles.repeat_interleave(2, dim=-1) * 2 * math.pi
        tables = (angles.cos(), angles.sin())
    if rope_grad:
        inputs += list(tables)

    def fn(backend, q, k, v, *grad_tables):
        return core_periphery_attention(q, k, v, C, rope=grad_tables or tables or None,
                                        backend=backend)
    q = torch.empty(B, heads, L, D, device='meta')
    return Example(fn, inputs, macs(q, q, q, C))


def record(D: int = 64, C: int = SETTINGS['num_cores'], dtype: str = 'fp32',
           rope: Optional[str] = 'batch', splits: Optional[int] = None, N: int = 196,
           rope_grad: bool = True, B: int = 2, heads: int = 2,
           fused: Optional[bool] = None) -> None:
    """Views of ``[B, C + N, heads, D]`` projections, as the VECA backbone passes them; the
    backward both fused (the default) and deterministic, unless ``fused`` says which;
    ``splits``: force the split count of the core rows' long loops."""
    from . import function
    dtype = as_dtype(dtype)
    L = C + N
    q, k, v = (torch.empty(B, L, heads, D, dtype=dtype).transpose(1, 2) for _ in range(3))
    cos = sin = None
    if rope:
        cos, sin = (torch.empty(B if rope == 'batch' else 1, L, D, dtype=dtype)
                    for _ in range(2))
    scale = D ** -0.5
    o, lse = function.core_periphery_fwd(q, k, v, cos, sin, C, scale, splits=splits)
    for f in ((True, False) if fused is None else (fused,)):
        function.core_periphery_bwd(torch.empty_like(o), q, k, v, cos, sin, o, lse, C,
                                    scale, splits=splits, rope_grad=rope_grad, fused=f)


_GPU = dict(D=64, rope='shared', rope_grad=False, fused=True)  # VECA-S, its default backward
SPEC = OpSpec(name='core_periphery_attention', macs=macs, can_run=core_periphery_triton_reasons,
              settings=SETTINGS, example=example, record=record,
              gpu_sizes=(dict(B=8, heads=6, C=64, N=196, **_GPU),
                         dict(B=2, heads=6, C=64, N=1024, **_GPU)))
