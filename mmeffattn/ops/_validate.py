"""Input checks the ops share: every error names the op, the problem and the fix.

Each ``op.py`` keeps only the checks that are its own (shapes that relate its inputs); the
type, rank, dtype, device and scalar-argument checks are these.
"""
import math
import numbers
import operator
from typing import Optional, Sequence, Tuple

import torch

Named = Sequence[Tuple[str, Optional[torch.Tensor]]]


def _names(names: Sequence[str]) -> str:
    return ' and '.join(names) if len(names) == 2 else ', '.join(names)


def check_tensor(op: str, name: str, x: object, layout: str, hint: str = '') -> None:
    """``x`` is a tensor of ``layout``'s rank (``'[B, heads, N, D]'`` has 4 dims); ``hint``
    (how to get that layout) ends the rank message."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f'{op}: {name} must be a torch.Tensor, got {type(x).__name__}')
    ndim = layout.count(',') + 1
    if x.dim() != ndim:
        raise ValueError(f'{op}: {name} must be {layout} ({ndim} dims), got shape '
                         f'{tuple(x.shape)}{"; " + hint if hint else ""}')


def check_not_empty(op: str, name: str, x: torch.Tensor, layout: str) -> None:
    """``x`` (``name``, of ``layout``) has no zero-size dim: the kernels launch nothing for one,
    and some crashed."""
    if x.numel() == 0:
        raise ValueError(f'{op}: {name} must not be empty, got shape {tuple(x.shape)} {layout}; '
                         f'every dim must be at least 1 (leave empty batches out of the call)')


def check_alike(op: str, named: Named, same_dtype: bool = True) -> None:
    """The given tensors (None entries are skipped) are floating point, on one device and, with
    ``same_dtype``, of one dtype."""
    named = [(n, t) for n, t in named if t is not None]
    for name, t in named:
        if not t.is_floating_point():
            raise ValueError(f'{op}: {name} must be floating point, got {t.dtype}')
    names = _names([n for n, _ in named])
    if same_dtype and len({t.dtype for _, t in named}) > 1:
        raise ValueError(f'{op}: {names} must have the same dtype, got '
                         + ', '.join(f'{n} {t.dtype}' for n, t in named)
                         + '; cast them to one dtype')
    if len({t.device for _, t in named}) > 1:
        raise ValueError(f'{op}: {names} must be on one device, got '
                         + ', '.join(f'{n} {t.device}' for n, t in named)
                         + '; move them with .to(device)')


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              tokens: str = 'N') -> None:
    """q, k, v: floating-point ``[B, heads, tokens, D]`` of one shape, dtype and device
    (``tokens``: the token axis's name in messages, e.g. ``'C + N'``)."""
    for name, x in (('q', q), ('k', k), ('v', v)):
        check_tensor(op, name, x, f'[B, heads, {tokens}, D]',
                     f'reshape tokens [B, {tokens}, heads*D] with '
                     f'.reshape(B, {tokens}, heads, D).transpose(1, 2)')
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f'{op}: q, k, v must have the same shape [B, heads, {tokens}, D], got '
                         f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    check_not_empty(op, 'q, k, v', q, f'[B, heads, {tokens}, D]')
    check_alike(op, (('q', q), ('k', k), ('v', v)))


def check_int(op: str, name: str, value: object, minimum: Optional[int] = None,
              meaning: str = '') -> int:
    """``value`` as an int (``>= minimum`` if given); bools and floats are refused."""
    try:
        result = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        result = None
    if result is None or (minimum is not None and result < minimum):
        raise ValueError(f'{op}: {name} must be an int'
                         f'{"" if minimum is None else f" >= {minimum}"}'
                         f'{f" ({meaning})" if meaning else ""}, got {value!r}')
    return result


def check_real(op: str, name: str, value: object, meaning: str, *, positive: bool = False,
               nonnegative: bool = False, optional: bool = False) -> Optional[float]:
    """``value`` as a finite float (``None`` passes through when ``optional``); NaN and inf are
    refused, since a non-finite scalar would silently turn every output into NaN or zero."""
    if value is None and optional:
        return None
    if isinstance(value, torch.Tensor) and value.dim() == 0 and torch.jit.is_tracing():
        value = value.item()  # a size read from x.shape under torch.jit.trace (FLOP counting)
    is_number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if is_number and torch.compiler.is_compiling():
        # the value may be symbolic there (a size, or a float under dynamic=True): reading it
        # would break the graph or guard on it, so only its type is checked; eager calls check all
        return value
    ok = (is_number and math.isfinite(value) and (not positive or value > 0)
          and (not nonnegative or value >= 0))
    if not ok:
        kind = ('a positive finite float' if positive else
                'a finite float >= 0' if nonnegative else 'a finite float')
        raise ValueError(f'{op}: {name} must be {kind}{" or None" if optional else ""} '
                         f'({meaning}), got {value!r}')
    return float(value)
