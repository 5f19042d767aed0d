"""Stochastic depth (drop path), per sample, as in timm's ``layers/drop.py``."""
import torch
import torch.nn as nn


def drop_path(x: torch.Tensor, drop_prob: float = 0., training: bool = False,
              scale_by_keep: bool = True) -> torch.Tensor:
    """Zero whole samples of a residual branch with probability ``drop_prob`` while training (kept
    samples scaled by ``1 / (1 - drop_prob)`` with ``scale_by_keep``).
    """
    if drop_prob == 0. or not training:
        return x
    keep_prob = 1. - drop_prob
    shape = (x.shape[0], ) + (1, ) * (x.ndim - 1)  # [B, 1, ..., 1]: one decision per sample
    mask = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0. and scale_by_keep:
        mask.div_(keep_prob)
    return x * mask


class DropPath(nn.Module):
    """Drop paths (stochastic depth) per sample, applied to the main path of residual blocks.

    Args:
        drop_prob: probability of dropping a sample's branch.
        scale_by_keep: rescale the kept samples by ``1 / (1 - drop_prob)``.
    """

    def __init__(self, drop_prob: float = 0., scale_by_keep: bool = True) -> None:
        super().__init__()
        if not 0. <= drop_prob <= 1.:
            raise ValueError(f'drop_prob must be in [0, 1], got {drop_prob}')
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)

    def extra_repr(self) -> str:
        return f'drop_prob={round(self.drop_prob, 3):0.3f}'
