"""Small helpers every backbone family shares."""
from typing import Sequence, Tuple, Union

import torch.nn as nn


def parse_out_indices(out_indices: Union[int, Sequence[int]], num: int,
                      what: str = 'stages') -> Tuple[int, ...]:
    """Sorted, de-duplicated, non-negative output indices into ``num`` stages/blocks (negative
    ones count from the end; out of range raises ``ValueError``)."""
    if isinstance(out_indices, int):
        out_indices = [out_indices]
    if len(out_indices) == 0:
        raise ValueError(f'out_indices must name at least one of the {num} {what}')
    parsed = []
    for i in out_indices:
        j = i + num if i < 0 else i
        if not 0 <= j < num:
            raise ValueError(f'out_indices {tuple(out_indices)} out of range for {num} {what}')
        parsed.append(j)
    return tuple(sorted(set(parsed)))


def init_linear_and_norm(m: nn.Module) -> None:
    """The ViT/Swin init the official codes use: trunc normal (std .02) for ``nn.Linear`` with
    zero bias, ones/zeros for ``nn.LayerNorm``; convolutions keep PyTorch's default."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0)
    elif isinstance(m, nn.LayerNorm):
        nn.init.constant_(m.bias, 0)
        nn.init.constant_(m.weight, 1.0)
