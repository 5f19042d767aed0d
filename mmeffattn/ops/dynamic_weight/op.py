"""Public dynamic-weight op: validates its inputs and dispatches to Triton or the reference."""
import numbers
from typing import List, Optional

import torch

from .._backend import can_run_dtype, select_backend, triton_reasons
from .._common import import_kernels, offsets_reason, sample_offsets_fit
from .naive import dynamic_weight_naive

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # of the Triton kernels
dynamic_weight_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'dynamic_weight_triton')

_NAME = 'dynamic_weight'


def _check_inputs(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                  scale: Optional[float], weight: Optional[torch.Tensor]) -> None:
    """Raise ValueError naming the problem and the fix."""
    for name, x in (('u', u), ('v', v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f'{_NAME}: {name} must be a torch.Tensor, got {type(x).__name__}')
        if x.dim() != 3:
            raise ValueError(f'{_NAME}: {name} must be [B, M, channels] (3 dims: samples, pooled '
                             f'tokens, channels), got shape {tuple(x.shape)}')
    if u.shape[:2] != v.shape[:2]:
        raise ValueError(f'{_NAME}: u [B, M, C_in] and v [B, M, C_out] must agree on B and M, '
                         f'got u {tuple(u.shape)}, v {tuple(v.shape)}; both come from the same '
                         f'pooled tokens')
    if u.shape[1] < 1 or u.shape[2] < 1 or v.shape[2] < 1:
        raise ValueError(f'{_NAME}: u and v need at least one token and channel, got '
                         f'u {tuple(u.shape)}, v {tuple(v.shape)}')
    if not (u.is_floating_point() and v.is_floating_point()):
        raise ValueError(f'{_NAME}: u and v must be floating point, got {u.dtype}, {v.dtype}')
    if u.dtype != v.dtype:
        raise ValueError(f'{_NAME}: u and v must have the same dtype, got u {u.dtype}, '
                         f'v {v.dtype}; cast them to one dtype')
    if u.device != v.device:
        raise ValueError(f'{_NAME}: u and v must be on one device, got u {u.device}, '
                         f'v {v.device}')
    if (isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Real)
            or not n_tokens > 0):
        raise ValueError(f'{_NAME}: n_tokens must be a positive number (the H * W tokens the '
                         f'factors were pooled from), got {n_tokens!r}')
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise ValueError(f'{_NAME}: scale must be a real number or None (C_in ** -0.5), got '
                         f'{scale!r}')
    if weight is not None:
        expected = (v.shape[2], u.shape[2])
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != expected:
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f'{_NAME}: weight must be the static weight [C_out, C_in] = '
                             f'{list(expected)} (nn.Linear layout; transpose an [in, out] '
                             f'weight), got {got}')
        if not weight.is_floating_point():
            raise ValueError(f'{_NAME}: weight must be floating point, got {weight.dtype}')
        if weight.device != u.device:
            raise ValueError(f'{_NAME}: weight must be on the device of u ({u.device}), got '
                             f'{weight.device}')


def dynamic_weight_triton_reasons(u: torch.Tensor, v: torch.Tensor,
                                  weight: Optional[torch.Tensor] = None,
                                  interpret: Optional[bool] = None) -> List[str]:
    """Reasons the Triton kernels cannot run these (validated) inputs (``[]``: they can);
    ``interpret`` as in :func:`mmeffattn.ops._backend.triton_reasons`."""
    tensors = (u, v) if weight is None else (u, v, weight)
    reasons = triton_reasons('dynamic-weight', _KERNELS_IMPORT_ERROR, tensors, (u, v),
                             SUPPORTED_DTYPES, interpret=interpret)
    if weight is not None:
        reasons += [r.replace('dtype', 'weight dtype', 1) for r in
                    can_run_dtype((weight,), SUPPORTED_DTYPES, interpret=interpret,
                                  uses_dot=False)]
    return reasons + offsets_reason(sample_offsets_fit(u, v),
                                    'one sample of u or v spans 2**31 elements or more')


def dynamic_weight(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                   scale: Optional[float] = None, weight: Optional[torch.Tensor] = None, *,
                   backend: Optional[str] = None) -> torch.Tensor:
    """WeightFormer's bilateral dynamic weight, row-normalized, plus an optional static weight.

    With ``R = v^T u * scale / n_tokens`` (a reduction over the ``M`` pooled tokens)::

        out[b, j, :] = R[b, j, :] / (||R[b, j, :]|| + 1)  (+ weight[j, :])

    i.e. each output channel's row (the official code's column of its ``[C_in, C_out]`` weight)
    is divided by its norm over the inputs plus one. The result is in ``nn.Linear``'s layout, so
    a layer computes ``x @ out.transpose(1, 2) + bias``. The Triton backend fuses the reduction,
    scale, norm, division, weight add and cast in one kernel (its backward recomputes ``R``).

    Args:
        u: ``[B, M, C_in]`` input-side factor (WeightFormer: ``SiLU(A_in) @ in_basis``).
        v: ``[B, M, C_out]`` output-side factor (``SiLU(A_out) @ out_basis``), u's dtype and
            device; any batch/token strides.
        n_tokens: the divisor ``N`` (WeightFormer: the ``H * W`` tokens before pooling).
        scale: multiplier, ``C_in ** -0.5`` by default.
        weight: optional static weight ``[C_out, C_in]``, any float dtype; the result then has
            the promoted dtype of u and weight (as ``dw + weight`` in PyTorch).
        backend: ``None`` (automatic), ``'triton'`` or ``'reference'``; see
            :mod:`mmeffattn.ops._backend` (``$MMEFFATTN_OPS_BACKEND`` applies when None).

    Returns:
        ``[B, C_out, C_in]`` (contiguous from the Triton backend).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists the reasons).
    """
    _check_inputs(u, v, n_tokens, scale, weight)
    scale = u.shape[-1] ** -0.5 if scale is None else float(scale)
    tensors = (u, v) if weight is None else (u, v, weight)
    chosen = select_backend(_NAME, backend,
                            lambda: dynamic_weight_triton_reasons(u, v, weight), tensors)
    if chosen == 'triton':
        return dynamic_weight_triton(u, v, n_tokens, scale=scale, weight=weight)
    return dynamic_weight_naive(u, v, n_tokens, scale=scale, weight=weight)
