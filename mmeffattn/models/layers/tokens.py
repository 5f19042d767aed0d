"""Token sequences <-> feature maps, without copies where the layout allows."""
from typing import Tuple

import torch
import torch.nn.functional as F

# one definition for the ops and the models (re-exported here for the model code)
from mmeffattn.ops._common import is_symbolic  # noqa: F401


def pad_to_multiple(x: torch.Tensor, multiple: int, value: float = 0.) -> torch.Tensor:
    """Pad ``[..., H, W]`` on the bottom/right to multiples of ``multiple`` with ``value``.

    Eager calls return ``x`` itself when nothing is missing; symbolic sizes (and tracing) always
    pad, so a compiled model does not recompile between multiples and non-multiples. The pad ``(n +
    m - 1) // m * m - n`` keeps torch.export's guards decidable.
    """
    H, W = x.shape[-2:]
    branch_free = is_symbolic(H, W) or torch.compiler.is_compiling()
    if not branch_free and not (H % multiple or W % multiple):
        return x
    m = multiple
    return F.pad(x, (0, (W + m - 1) // m * m - W, 0, (H + m - 1) // m * m - H), value=value)


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """``[B, H*W, C]`` tokens (row-major) -> ``[B, C, H, W]``, a channels-last view for contiguous
    ``x``.

    Built as ``reshape(B, H, W, C).permute(...)`` so that the batch stride is ``H*W*C`` even for ``B
    == 1``: otherwise torch does not see channels-last and oneDNN convolutions copy to NCHW.
    """
    B, N, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` map -> ``[B, H*W, C]`` tokens (row-major); a view, contiguous when the
    map is channels-last."""
    return x.flatten(2).transpose(1, 2)


def token_mean(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x.mean(dim)`` without the fp32 copy of a bf16 ``x`` that ``mean`` makes first (bf16's
    range holds the sum, which the reduction accumulates in fp32)."""
    return x.sum(dim) / x.shape[dim] if x.dtype == torch.bfloat16 else x.mean(dim)
