"""Input checks the attention ops share: every error names the problem and the fix."""
import torch


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              tokens: str = 'N') -> None:
    """q, k, v: floating-point ``[B, heads, tokens, D]`` tensors of one shape, dtype and device.

    Args:
        op: the op's name, first in every message.
        tokens: how the op names its token axis (e.g. ``'C + N'``), for the messages.
    """
    for name, x in (('q', q), ('k', k), ('v', v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f'{op}: {name} must be a torch.Tensor, got {type(x).__name__}')
        if x.dim() != 4:
            raise ValueError(f'{op}: {name} must be [B, heads, {tokens}, D] (4 dims), got shape '
                             f'{tuple(x.shape)}; reshape tokens [B, {tokens}, heads*D] with '
                             f'.reshape(B, {tokens}, heads, D).transpose(1, 2)')
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f'{op}: q, k, v must have the same shape [B, heads, {tokens}, D], got '
                         f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f'{op}: q, k, v must have the same dtype, got q {q.dtype}, '
                         f'k {k.dtype}, v {v.dtype}; cast them to one dtype')
    if not q.is_floating_point():
        raise ValueError(f'{op}: q, k, v must be floating point, got {q.dtype}')
    if not (q.device == k.device == v.device):
        raise ValueError(f'{op}: q, k, v must be on one device, got q {q.device}, '
                         f'k {k.device}, v {v.device}')
