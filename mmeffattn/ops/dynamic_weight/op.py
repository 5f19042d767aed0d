"""Public dynamic-weight op: validates its inputs and dispatches to a backend."""
from typing import List, Optional

import torch

from .._backend import KERNEL_DTYPES, can_run_dtype, dispatch, triton_reasons
from .._common import import_kernels, offsets_reason, sample_offsets_fit
from .._validate import check_alike, check_real, check_tensor
from .naive import dynamic_weight_naive
from .pytorch import dynamic_weight_torch

dynamic_weight_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'dynamic_weight_triton', module='library')

_NAME = 'dynamic_weight'


def _check_inputs(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                  scale: Optional[float], weight: Optional[torch.Tensor]) -> None:
    """Raise ValueError naming the problem and the fix."""
    for name, x in (('u', u), ('v', v)):
        check_tensor(_NAME, name, x, '[B, M, channels]',
                     'samples, pooled tokens and channels')
    if u.shape[:2] != v.shape[:2]:
        raise ValueError(f'{_NAME}: u [B, M, C_in] and v [B, M, C_out] must agree on B and M, '
                         f'got u {tuple(u.shape)}, v {tuple(v.shape)}; both come from the same '
                         f'pooled tokens')
    if u.shape[1] < 1 or u.shape[2] < 1 or v.shape[2] < 1:
        raise ValueError(f'{_NAME}: u and v need at least one token and channel, got '
                         f'u {tuple(u.shape)}, v {tuple(v.shape)}')
    check_alike(_NAME, (('u', u), ('v', v)))
    if not isinstance(n_tokens, torch.SymInt):  # a symbolic H * W (torch.export) is a size
        check_real(_NAME, 'n_tokens', n_tokens, 'the H * W tokens the factors were pooled from',
                   positive=True)
    check_real(_NAME, 'scale', scale, 'the multiplier, C_in ** -0.5 by default', optional=True)
    if weight is not None:
        expected = (v.shape[2], u.shape[2])
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != expected:
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f'{_NAME}: weight must be the static weight [C_out, C_in] = '
                             f'{list(expected)} (nn.Linear layout; transpose an [in, out] '
                             f'weight), got {got}')
        check_alike(_NAME, (('u', u), ('weight', weight)), same_dtype=False)


def dynamic_weight_triton_reasons(u: torch.Tensor, v: torch.Tensor,
                                  weight: Optional[torch.Tensor] = None,
                                  interpret: Optional[bool] = None) -> List[str]:
    """Reasons the kernels cannot run these validated inputs (``[]``: they can)."""
    tensors = (u, v) if weight is None else (u, v, weight)
    reasons = triton_reasons('dynamic-weight', _KERNELS_IMPORT_ERROR, tensors, (u, v),
                             KERNEL_DTYPES, interpret=interpret)
    if weight is not None:
        reasons += [r.replace('dtype', 'weight dtype', 1) for r in
                    can_run_dtype((weight,), KERNEL_DTYPES, interpret=interpret,
                                  uses_dot=False)]
    return reasons + offsets_reason(sample_offsets_fit(u, v),
                                    'one sample of u or v spans 2**31 elements or more')


def dynamic_weight(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                   scale: Optional[float] = None, weight: Optional[torch.Tensor] = None, *,
                   backend: Optional[str] = None) -> torch.Tensor:
    """WeightFormer's bilateral dynamic weight, row-normalized, plus an optional static weight.

    With ``R = v^T u * scale / n_tokens`` (a reduction over the ``M`` pooled tokens)::

        out[b, j, :] = R[b, j, :] / (||R[b, j, :]|| + 1)  (+ weight[j, :])

    in ``nn.Linear``'s layout (a layer computes ``x @ out.transpose(1, 2) + bias``).
    Non-finite inputs: the NaN contract of :mod:`mmeffattn.ops`; ``scale`` and ``n_tokens``
    must be finite.

    Args:
        u: ``[B, M, C_in]`` input-side factor (WeightFormer: ``SiLU(A_in) @ in_basis``).
        v: ``[B, M, C_out]`` output-side factor (``SiLU(A_out) @ out_basis``), u's dtype and
            device; any batch/token strides.
        n_tokens: the divisor ``N`` (WeightFormer: the ``H * W`` tokens before pooling).
        scale: multiplier, ``C_in ** -0.5`` by default.
        weight: optional static weight ``[C_out, C_in]``, any float dtype; the result then has
            the promoted dtype of u and weight (as ``dw + weight`` in PyTorch).
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``[B, C_out, C_in]`` in u's dtype (promoted with a weight). The torch backend
        follows autocast (as WeightFormer's ``DynamicLinear``); the reference and Triton do
        not.

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    _check_inputs(u, v, n_tokens, scale, weight)
    scale = u.shape[-1] ** -0.5 if scale is None else float(scale)
    tensors = (u, v) if weight is None else (u, v, weight)
    return dispatch(_NAME, backend, lambda: dynamic_weight_triton_reasons(u, v, weight), tensors,
                    dynamic_weight_triton, dynamic_weight_torch, dynamic_weight_naive,
                    u, v, n_tokens, scale=scale, weight=weight)
