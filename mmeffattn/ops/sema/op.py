"""Public SEMA attention op: validates its inputs and dispatches to Triton, the fast PyTorch
form or the reference."""
import operator
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._backend import KERNEL_DTYPES, dispatch, triton_reasons
from .._common import import_kernels, offsets_reason, token_offsets_fit
from .._validate import check_alike, check_int, check_qkv, check_real, check_tensor
from .naive import sema_attention_naive, sema_attention_qk_naive, unbind_qk
from .pytorch import sema_attention_qk_torch, sema_attention_torch

sema_attention_triton, sema_attention_qk_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'sema_attention_triton', 'sema_attention_qk_triton', module='library')

#: head dims the op accepts (the kernels pad D to a power of two >= 16 with masks)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128

#: the output layouts: ``'bhnd'`` ``[B, heads, N, D]``, ``'bnhd'`` ``[B, N, heads, D]``
OUT_LAYOUTS = ('bhnd', 'bnhd')


_NAME = 'sema_attention'
_NAME_QK = 'sema_attention_qk'


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
                  window_size: int, scale: Optional[float], out_layout: str,
                  name: str = _NAME) -> Tuple[int, int]:
    """Raise ValueError naming the problem (and the op, ``name``) and the fix; return
    ``(H, W)``."""
    check_qkv(name, q, k, v)
    if out_layout not in OUT_LAYOUTS:
        raise ValueError(f'{name}: out_layout must be one of {OUT_LAYOUTS} ([B, heads, N, D] '
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
        raise ValueError(f'{name}: hw must be a pair of positive ints (H, W), got {hw!r}')
    N = q.shape[2]
    if N != H * W:
        raise ValueError(f'{name}: q has N={N} tokens but hw=({H}, {W}) holds H*W={H * W}; '
                         f'pass the token grid the tokens came from')
    check_int(name, 'window_size', window_size, 1, 'the window side')
    check_real(name, 'scale', scale, 'the logit scale, D ** -0.5 by default', optional=True)
    D = q.shape[3]
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f'{name}: head dim D={D} is outside the supported '
                         f'{MIN_HEAD_DIM}..{MAX_HEAD_DIM}; choose num_heads so that '
                         f'channels / num_heads lies in that range')
    return H, W


def _check_mean_flags(name: str, with_mean: bool, return_mean: bool) -> None:
    """Both flags bools, ``return_mean`` only with ``with_mean``."""
    for flag, value in (('with_mean', with_mean), ('return_mean', return_mean)):
        if not isinstance(value, bool):
            raise ValueError(f'{name}: {flag} must be True or False, got {value!r}')
    if return_mean and not with_mean:
        raise ValueError(f'{name}: return_mean=True returns the value mean instead of adding '
                         f'it, so it needs with_mean=True (with_mean=False has no mean)')


def sema_triton_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        interpret: Optional[bool] = None) -> List[str]:
    """Reasons the kernels cannot run these validated inputs (``[]``: they can)."""
    tensors = (q, k, v)
    reasons = triton_reasons('SEMA', _KERNELS_IMPORT_ERROR, tensors, tensors, KERNEL_DTYPES,
                             interpret=interpret)
    return reasons + offsets_reason(token_offsets_fit(*tensors),
                                    'N * token stride of an input reaches 2**31')


def sema_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int],
                   window_size: int, *, scale: Optional[float] = None, with_mean: bool = True,
                   out_layout: str = 'bhnd', return_mean: bool = False,
                   backend: Optional[str] = None
                   ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """SEMA attention: softmax attention inside non-overlapping windows + the mean of all values.

    ``window_size`` windows are tiled from the top-left corner of the ``H x W`` grid (the last
    row/column of windows may be partial); ``with_mean`` adds ``mean_j v_j`` to every token.
    Non-finite inputs: the NaN contract of :mod:`mmeffattn.ops` (a value reaches every row
    through the mean; with ``return_mean`` its channel of the mean instead).

    Args:
        q, k, v: ``[B, heads, N, D]``, ``N = H * W`` tokens row-major, ``16 <= D <= 128``, one
            dtype and device, any strides (e.g. views of a fused qkv projection).
        hw: the token grid ``(H, W)``. window_size: window side, ``>= 1``.
        scale: logit scale, ``D ** -0.5`` by default.
        with_mean: add the mean of all value vectors to every output token.
        out_layout: ``'bhnd'`` (``[B, heads, N, D]``) or ``'bnhd'`` (``[B, N, heads, D]``, whose
            ``reshape(B, N, heads * D)`` is a view; stored directly, no transpose copy).
        return_mean: (needs ``with_mean``) return ``(out, mean)``, out without the mean, for a
            caller that adds it itself (the SEMA backbone); on Triton neither direction then
            reduces an N-sized tensor (docs/design/sema_kernels.md).
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``out`` in ``out_layout`` and the inputs' dtype; with ``return_mean``, ``(out, mean)``,
        mean ``[B, heads, D]`` in v's dtype, differentiable. Autocast is not followed (cast
        the inputs first). 16-bit q, k, v are never copied to fp32; fp32 is kept where the
        math needs it: dot products and the mean accumulate in fp32 (long 16-bit sums lose
        their low bits), and the softmax (its row max, exp and sum) runs in fp32 on the
        window's logits alone (fp16 logits overflow; 16-bit exp sums are coarse).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    hw = _check_inputs(q, k, v, hw, window_size, scale, out_layout)
    _check_mean_flags(_NAME, with_mean, return_mean)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return dispatch(_NAME, backend, lambda: sema_triton_reasons(q, k, v), (q, k, v),
                    sema_attention_triton, sema_attention_torch, sema_attention_naive,
                    q, k, v, hw,
                    operator.index(window_size), scale=scale, with_mean=with_mean,
                    out_layout=out_layout, return_mean=return_mean)


def sema_attention_qk(qk: torch.Tensor, v: torch.Tensor, hw: Tuple[int, int], window_size: int,
                      *, scale: Optional[float] = None, with_mean: bool = True,
                      out_layout: str = 'bhnd', return_mean: bool = False,
                      backend: Optional[str] = None
                      ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sema_attention` with q and k packed as a fused qk projection makes them, ``qk``
    ``[B, N, 2, heads, D]`` (queries, keys on dim 2; any strides), and v ``[B, heads, N, D]``;
    equals ``sema_attention`` on ``qk.unbind(2)`` transposed, forward and backward. The Triton
    backward stores dq and dk straight into one gradient in qk's layout (no ``stack``). The
    other arguments, the result and the errors are :func:`sema_attention`'s.
    """
    check_tensor(_NAME_QK, 'qk', qk, '[B, N, 2, heads, D]',
                 'reshape the qk projection\'s [B, N, 2 * heads * D] output with '
                 '.reshape(B, N, 2, heads, D)')
    check_tensor(_NAME_QK, 'v', v, '[B, heads, N, D]',
                 'reshape tokens [B, N, heads*D] with .reshape(B, N, heads, D).transpose(1, 2)')
    check_alike(_NAME_QK, (('qk', qk), ('v', v)))  # (before the unbound views' checks)
    B, N, two, nh, D = qk.shape
    if two != 2:
        raise ValueError(f'{_NAME_QK}: qk must be [B, N, 2, heads, D] (queries then keys on dim '
                         f'2), got shape {tuple(qk.shape)}')
    if v.shape != (B, nh, N, D):
        raise ValueError(f'{_NAME_QK}: v must be [B, heads, N, D] = {(B, nh, N, D)} to match qk '
                         f'[B, N, 2, heads, D] {tuple(qk.shape)}, got {tuple(v.shape)}')
    q, k = unbind_qk(qk)  # views, only for the checks
    hw = _check_inputs(q, k, v, hw, window_size, scale, out_layout, name=_NAME_QK)
    _check_mean_flags(_NAME_QK, with_mean, return_mean)
    scale = D ** -0.5 if scale is None else float(scale)
    return dispatch(_NAME_QK, backend, lambda: sema_triton_reasons(q, k, v), (qk, v),
                    sema_attention_qk_triton, sema_attention_qk_torch,
                    sema_attention_qk_naive, qk, v, hw,
                    operator.index(window_size), scale=scale, with_mean=with_mean,
                    out_layout=out_layout, return_mean=return_mean)
