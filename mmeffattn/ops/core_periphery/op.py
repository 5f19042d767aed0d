"""Public core-periphery attention op: validates its inputs and dispatches to a backend."""
import operator
from typing import List, Optional, Sequence, Tuple

import torch

from .._backend import KERNEL_DTYPES, dispatch, triton_reasons
from .._common import import_kernels, offsets_reason, token_offsets_fit
from .._validate import check_alike, check_int, check_qkv, check_real
from .naive import core_periphery_attention_naive
from .pytorch import core_periphery_attention_torch

#: head dims the kernels run (tiles are tuned from 16 channels up)
MIN_TRITON_HEAD_DIM, MAX_TRITON_HEAD_DIM = 16, 128
core_periphery_attention_triton, _KERNELS_IMPORT_ERROR = import_kernels(
    __package__, 'core_periphery_attention_triton', module='library')

_NAME = 'core_periphery_attention'
Rope = Tuple[torch.Tensor, torch.Tensor]


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
                  rope: Optional[Sequence[torch.Tensor]], scale: Optional[float]
                  ) -> Optional[Rope]:
    """Raise ValueError naming the problem and the fix; return rope as a ``(cos, sin)`` tuple."""
    check_qkv(_NAME, q, k, v, tokens='C + N')
    B, _, L, D = q.shape
    check_real(_NAME, 'scale', scale, 'the logit scale, D ** -0.5 by default', optional=True)
    C = check_int(_NAME, 'num_cores', num_cores)
    if not 1 <= C < L:
        raise ValueError(f'{_NAME}: num_cores={C} is out of range for C + N = {L} tokens; it '
                         f'must satisfy 1 <= num_cores < C + N (the cores come first, followed by '
                         f'at least one patch token)')
    if rope is None:
        return None
    if not (isinstance(rope, (tuple, list)) and len(rope) == 2
            and all(isinstance(t, torch.Tensor) for t in rope)):
        raise ValueError(f'{_NAME}: rope must be None or a pair of tensors (cos, sin), got '
                         f'{type(rope).__name__}'
                         f'{f" of length {len(rope)}" if isinstance(rope, (tuple, list)) else ""}')
    cos, sin = rope
    if D % 2:
        raise ValueError(f'{_NAME}: rope rotates pairs of channels, so the head dim must be even, '
                         f'got D={D}; choose num_heads so that channels / num_heads is even, or '
                         f'pass rope=None')
    for name, t in (('cos', cos), ('sin', sin)):
        if t.dim() != 3 or t.shape[0] not in (1, B) or tuple(t.shape[1:]) != (L, D):
            batch = '1' if B == 1 else f'{B} or 1'
            raise ValueError(f'{_NAME}: rope {name} must be [B or 1, C + N, D] = [{batch}, {L}, '
                             f'{D}] (shared by the heads), got {tuple(t.shape)}; drop a heads dim '
                             f'with .squeeze(1) or broadcast a [C + N, D] table with .unsqueeze(0)')
    check_alike(_NAME, (('q', q), ('rope cos', cos), ('rope sin', sin)), same_dtype=False)
    if cos.shape != sin.shape:
        raise ValueError(f'{_NAME}: rope cos and sin must have one shape, got cos '
                         f'{tuple(cos.shape)} and sin {tuple(sin.shape)}')
    return cos, sin


def core_periphery_triton_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  rope: Optional[Rope] = None,
                                  interpret: Optional[bool] = None) -> List[str]:
    """Reasons the kernels cannot run these validated inputs (``[]``: they can)."""
    tensors = (q, k, v)
    # cos and sin are cast to q's dtype before the kernels, so only q, k, v dtypes matter
    reasons = triton_reasons('core-periphery', _KERNELS_IMPORT_ERROR, tensors + tuple(rope or ()),
                             tensors, KERNEL_DTYPES, interpret=interpret)
    if q.shape[-1] < MIN_TRITON_HEAD_DIM:
        reasons.append(f'head dim {q.shape[-1]} < {MIN_TRITON_HEAD_DIM} (the kernels\' tiles '
                       f'are at least {MIN_TRITON_HEAD_DIM} channels wide)')
    if q.shape[-1] > MAX_TRITON_HEAD_DIM:
        reasons.append(f'head dim {q.shape[-1]} > {MAX_TRITON_HEAD_DIM} (the kernels hold a '
                       f'whole head in one tile)')
    return reasons + offsets_reason(token_offsets_fit(*tensors),
                                    'C + N * token stride of an input reaches 2**31')


def core_periphery_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
                             *, rope: Optional[Sequence[torch.Tensor]] = None,
                             scale: Optional[float] = None,
                             backend: Optional[str] = None) -> torch.Tensor:
    """VECA's core-periphery attention (block-sparse softmax attention).

    The first ``C = num_cores`` tokens are cores: a core query attends all ``C + N`` keys, a
    patch query only the C core keys. Optional 2D RoPE (``x * cos + rotate_pairs(x) * sin``,
    interleaved pairs) rotates q and k. Non-finite inputs: the NaN contract of
    :mod:`mmeffattn.ops` (with its fp32 torch-backend exception).

    Args:
        q, k, v: ``[B, heads, C + N, D]``, one dtype and device, any strides.
        num_cores: C, ``1 <= C < C + N``.
        rope: None or ``(cos, sin)``, each ``[B or 1, C + N, D]`` (D even), any float dtype:
            cast to q's dtype before use.
        scale: logit scale, ``D ** -0.5`` by default.
        backend: None (automatic), ``'triton'``, ``'torch'`` or ``'reference'``.

    Returns:
        ``[B, heads, C + N, D]`` in q's dtype, computed in it (the softmax sums in fp32);
        autocast is not followed (cast inputs first).

    Raises:
        ValueError: malformed inputs (the message says what to change).
        RuntimeError: ``backend='triton'`` on inputs the kernels cannot run (lists why).
    """
    rope = _check_inputs(q, k, v, num_cores, rope, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return dispatch(_NAME, backend, lambda: core_periphery_triton_reasons(q, k, v, rope),
                    (q, k, v), core_periphery_attention_triton, core_periphery_attention_torch,
                    core_periphery_attention_naive,
                    q, k, v, operator.index(num_cores), rope=rope, scale=scale)
