"""The dynamic weight's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any, Optional

import torch

from .._opspec import Example, OpSpec, as_dtype, randn
from .op import dynamic_weight, dynamic_weight_triton_reasons

#: WeightFormer pools its tokens 2x2 before predicting the weight
SETTINGS = dict(pool=2)


def macs(u: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """``v^T u`` over the M pooled tokens, plus the row norms (one MAC per weight entry)."""
    B, M, c_in = u.shape
    return B * v.shape[2] * c_in * (M + 1)


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 2, M: int = 49,
            C_in: int = 192, C_out: int = 768, n_tokens: Optional[int] = None,
            **_: Any) -> Example:
    """The factors of M pooled tokens, a static weight of about 0.02; ``n_tokens``: the tokens
    before pooling (``pool^2 M`` by default)."""
    n_tokens = SETTINGS['pool'] ** 2 * M if n_tokens is None else n_tokens
    inputs = [randn(B, M, C_in, device=device, dtype=dtype),
              randn(B, M, C_out, device=device, dtype=dtype),
              randn(C_out, C_in, device=device, dtype=dtype, scale=0.02)]

    def fn(backend, u, v, weight):
        return dynamic_weight(u, v, n_tokens, weight=weight, backend=backend)
    return Example(fn, inputs, macs(*inputs[:2]))


def record(M: int = 49, C_in: int = 192, C_out: int = 768, dtype: str = 'fp32',
           weight: Optional[str] = 'fp32', B: int = 2) -> None:
    """Contiguous u, v (the model's ``SiLU(A) @ basis``); ``weight``: the static weight's dtype
    (None: none)."""
    from . import function
    u = torch.empty(B, M, C_in, dtype=as_dtype(dtype))
    v = torch.empty(B, M, C_out, dtype=as_dtype(dtype))
    weight = torch.empty(C_out, C_in, dtype=as_dtype(weight)) if weight else None
    s = C_in ** -0.5 / (SETTINGS['pool'] ** 2 * M)
    out = function.dynamic_weight_fwd(u, v, s, weight)
    function.dynamic_weight_bwd(torch.empty_like(out), u, v, s)


SPEC = OpSpec(name='dynamic_weight', macs=macs, can_run=dynamic_weight_triton_reasons,
              settings=SETTINGS, example=example, record=record,
              gpu_sizes=(dict(B=8, M=49, C_in=192, C_out=768), ))  # WeightFormer-T's layers
