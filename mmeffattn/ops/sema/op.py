"""Public SEMA attention op: validates its inputs and dispatches to Triton or the reference."""
import operator
from typing import List, Optional, Sequence, Tuple

import torch

from .._backend import KERNEL_DTYPES as SUPPORTED_DTYPES  # noqa: F401 (public)
from .._backend import dispatch, triton_reasons
from .._common import import_kernels, offsets_reason, token_offsets_fit
from .._validate import check_int, check_qkv, check_real
from .naive import sema_attention_naive

sema_attention_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'sema_attention_triton', module='library')

#: head dims the op accepts (the kernels pad D to a power of two >= 16 with masks)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128

#: the output layouts: ``'bhnd'`` ``[B, heads, N, D]``, ``'bnhd'`` ``[B, N, heads, D]``
OUT_LAYOUTS = ('bhnd', 'bnhd')


_NAME = 'sema_attention'


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
                  window_size: int, scale: Optional[float], out_layout: str) -> Tuple[int, int]:
    """Raise ValueError naming the problem and the fix; return ``(H, W)``."""
    check_qkv(_NAME, q, k, v)
    if out_layout not in OUT_LAYOUTS:
        raise ValueError(f'{_NAME}: out_layout must be one of {OUT_LAYOUTS} ([B, heads, N, D] '
                         f'or [B, N, heads, D]), got {out_layout!r}')
    try:
        # a symbolic size (torch.export, torch.compile with a dynamic H x W) stays symbolic:
        # index() would pin it, and torch.compile would recompile for every new input size
        # (dynamo shows a symbolic size as an int, hence is_compiling)
        H, W = (s if torch.compiler.is_compiling() or isinstance(s, torch.SymInt)
                else operator.index(s) for s in hw)
    except (TypeError, ValueError):
        H = W = 0
    if H < 1 or W < 1 or any(isinstance(s, bool) for s in hw):
        raise ValueError(f'{_NAME}: hw must be a pair of positive ints (H, W), got {hw!r}')
    N = q.shape[2]
    if N != H * W:
        raise ValueError(f'{_NAME}: q has N={N} tokens but hw=({H}, {W}) holds H*W={H * W}; '
                         f'pass the token grid the tokens came from')
    check_int(_NAME, 'window_size', window_size, 1, 'the window side')
    check_real(_NAME, 'scale', scale, 'the logit scale, D ** -0.5 by default', optional=True)
    D = q.shape[3]
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f'{_NAME}: head dim D={D} is outside the supported '
                         f'{MIN_HEAD_DIM}..{MAX_HEAD_DIM}; choose num_heads so that '
                         f'channels / num_heads lies in that range')
    return H, W


def sema_triton_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        interpret: Optional[bool] = None) -> List[str]:
    """Reasons the Triton kernels cannot run these (validated) inputs (``[]``: they can);
    ``interpret`` as in :func:`mmeffattn.ops._backend.triton_reasons`."""
    tensors = (q, k, v)
    reasons = triton_reasons('SEMA', _KERNELS_IMPORT_ERROR, tensors, tensors, SUPPORTED_DTYPES,
                             interpret=interpret)
    return reasons + offsets_reason(token_offsets_fit(*tensors),
                                    'N * token stride of an input reaches 2**31')


def sema_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                   window_size: int, *, scale: Optional[float] = None, with_mean: bool = True,
                   out_layout: str = 'bhnd', backend: Optional[str] = None) -> torch.Tensor:
    """SEMA attention: softmax attention inside non-overlapping windows + the mean of all values.

    Windows of ``window_size x window_size`` tokens are tiled from the top-left corner of the
    ``H x W`` grid; the last row/column of windows may be partial (padded positions get zero
    attention weight). With ``with_mean`` the mean of the N value vectors is added to every token.

    Non-finite inputs (the NaN contract of every op, the same on the reference and on Triton): a
    NaN in an input element makes exactly the outputs that depend on it NaN and leaves every
    other output unchanged; an inf follows IEEE arithmetic through the formula above, so a
    dependent output is non-finite or the formula's limit (a -inf logit gives its key zero weight, a +inf
    one makes its row NaN). A query reaches its own row, a key every row of its window, a value
    its channel in the rows of its window (in every row with ``with_mean``).

    Args:
        q, k, v: ``[B, heads, N, D]``, ``N = H * W`` tokens in row-major order, ``16 <= D <= 128``,
            one dtype and device; any strides (e.g. views of a fused qkv projection).
        hw: the token grid ``(H, W)``.
        window_size: window side, ``>= 1``.
        scale: logit scale, ``D ** -0.5`` by default.
        with_mean: add the mean of all value vectors to every output token.
        out_layout: ``'bhnd'`` returns ``[B, heads, N, D]``; ``'bnhd'`` returns
            ``[B, N, heads, D]``, so that ``reshape(B, N, heads * D)`` for a following projection
            is a view (the kernels store that layout directly, the reference merges its windows
            into it: no transpose copy either way).
        backend: ``None`` (automatic), ``'triton'`` or ``'reference'``; see
            :mod:`mmeffattn.ops._backend` (``$MMEFFATTN_OPS_BACKEND`` applies when None).

    Returns:
        ``[B, heads, N, D]`` or ``[B, N, heads, D]`` (``out_layout``) in the inputs' dtype
        (contiguous from the Triton backend).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists the reasons).
    """
    hw = _check_inputs(q, k, v, hw, window_size, scale, out_layout)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return dispatch(_NAME, backend, lambda: sema_triton_reasons(q, k, v), (q, k, v),
                    sema_attention_triton, sema_attention_naive, q, k, v, hw,
                    operator.index(window_size), scale=scale, with_mean=with_mean,
                    out_layout=out_layout)
