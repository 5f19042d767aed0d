"""Token sequences <-> feature maps, without copies where the layout allows."""
from typing import Tuple

import torch
import torch.nn.functional as F

# one definition for the ops and the models (re-exported here for the model code)
from mmeffattn.ops._common import is_symbolic  # noqa: F401


def pad_to_multiple(x: torch.Tensor, multiple: int, value: float = 0.) -> torch.Tensor:
    """Pad ``[..., H, W]`` on the bottom/right to multiples of ``multiple`` with ``value``
    (zeros by default).

    Returns ``x`` itself when nothing is missing, in eager calls; a symbolic size (see
    :func:`is_symbolic`), and any size while torch.compile traces, is always padded (a zero pad
    is a no-op), so that a compiled model does not recompile when a size changes from a multiple
    to a non-multiple. The padding is written as ``(n + m - 1) // m * m - n`` so that the padded
    side is a plain multiple of ``m`` for torch.export's symbolic shapes (``(-n) % m`` gives
    expressions whose later ``!= 1`` guards it cannot decide).
    """
    H, W = x.shape[-2:]
    branch_free = is_symbolic(H, W) or torch.compiler.is_compiling()
    if not branch_free and not (H % multiple or W % multiple):
        return x
    m = multiple
    return F.pad(x, (0, (W + m - 1) // m * m - W, 0, (H + m - 1) // m * m - H), value=value)


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """``[B, H*W, C]`` tokens (row-major) -> ``[B, C, H, W]`` map.

    A contiguous ``x`` gives a channels-last view (no copy). The view is built as
    ``reshape(B, H, W, C).permute(...)`` so that its batch stride is ``H*W*C`` even when
    ``B == 1``: ``transpose(1, 2).reshape(...)`` gives a size-1 batch dim the stride ``C``,
    which torch then does not recognise as channels-last, so oneDNN convolutions copy the input
    to NCHW and return NCHW (measured 10-20% slower depthwise convolutions, plus copies
    downstream, for MILA-T at batch 1 on the CPU).
    """
    B, N, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` map -> ``[B, H*W, C]`` tokens (row-major); a view, contiguous when the
    map is channels-last."""
    return x.flatten(2).transpose(1, 2)
