"""A multi-scale feature pyramid (strides 4, 8, 16, 32) for isotropic ViT-like trunks.

Stride-``s`` maps are resampled as BEiT's ``fpn1..fpn4`` / ViTDet's simple pyramid: two transposed
2x2 convolutions (scale 4), one (2), identity (1), 2x2 max pooling (0.5), then a norm per level. The
input is one map per level (outputs of evenly spaced blocks) or one map for every level.
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer

from .tokens import pad_to_multiple

__all__ = ['LayerNorm2d', 'build_norm2d', 'ViTPyramid', 'build_vit_pyramid']


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (ViTDet/ConvNeXt ``LayerNorm2d``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, H, W]
        x = x.permute(0, 2, 3, 1)  # [B, H, W, C]
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def build_norm2d(norm_cfg: dict, channels: int) -> nn.Module:
    """A norm for NCHW maps: ``dict(type='LN2d', eps=1e-6)`` gives :class:`LayerNorm2d` (no
    batch statistics: the default, robust at detection batch sizes); anything else (``BN``,
    ``SyncBN``, ``GN``) goes to ``mmcv.cnn.build_norm_layer``."""
    cfg = dict(norm_cfg)
    if cfg.get('type') == 'LN2d':
        return LayerNorm2d(channels, eps=cfg.get('eps', 1e-6))
    return build_norm_layer(cfg, channels)[1]


def _level(channels: int, scale: float, norm_cfg: dict, act_cfg: dict) -> nn.Module:
    """The resampling of one pyramid level (see the module docstring)."""
    if scale == 1:
        return nn.Identity()
    if scale > 1:
        layers: List[nn.Module] = []
        for j in range(int(round(math.log2(scale)))):
            if j:
                layers += [build_norm2d(norm_cfg, channels), build_activation_layer(act_cfg)]
            layers.append(nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2))
        return nn.Sequential(*layers)
    return CeilMaxPool2d(int(round(1 / scale)))


class CeilMaxPool2d(nn.Module):
    """``nn.MaxPool2d(k, k, ceil_mode=True)`` as a ``-inf`` pad to multiples of ``k`` and a plain
    pool, because torch.export cannot keep a ceil-mode pool's sizes symbolic."""

    def __init__(self, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size
        return F.max_pool2d(pad_to_multiple(x, k, value=float('-inf')), k, k)

    def extra_repr(self) -> str:
        return f'kernel_size={self.kernel_size}, stride={self.kernel_size}, ceil_mode=True'


class ViTPyramid(nn.Module):
    """Resample stride-``s`` maps of an isotropic trunk into a feature pyramid.

    Args:
        embed_dims: channels of the trunk maps, kept at every level.
        scales: one power-of-two factor per level (default: strides 4, 8, 16, 32 from stride 16).
        norm_cfg: norm inside a 4x level and of the level outputs (default ``LN2d``; ``SyncBN``:
            BEiT/mmseg's variant).
        act_cfg: activation inside a 4x level.
        out_norm: a norm ``norms.{i}`` per level.

    Input: ``[B, C, H, W]`` maps, one per level or one for all; output: ``len(scales)`` maps, level
    ``i`` ``[B, C, H * scales[i], W * scales[i]]`` (rounded up).
    """

    def __init__(self, embed_dims: int, scales: Sequence[float] = (4., 2., 1., .5),
                 norm_cfg: dict = dict(type='LN2d', eps=1e-6),
                 act_cfg: dict = dict(type='GELU'), out_norm: bool = True) -> None:
        super().__init__()
        scales = tuple(float(s) for s in scales)
        if not scales:
            raise ValueError('ViTPyramid needs at least one scale')
        for s in scales:
            if s <= 0 or not math.log2(s).is_integer():
                raise ValueError(f'ViTPyramid scales must be powers of two (4, 2, 1, 0.5, ...), '
                                 f'got {scales}')
        self.embed_dims = embed_dims
        self.scales = scales
        self.levels = nn.ModuleList([_level(embed_dims, s, norm_cfg, act_cfg) for s in scales])
        self.norms: Optional[nn.ModuleList] = nn.ModuleList(
            [build_norm2d(norm_cfg, embed_dims) for _ in scales]) if out_norm else None

    @property
    def num_levels(self) -> int:
        return len(self.scales)

    def forward(self, feats: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        if isinstance(feats, torch.Tensor):
            feats = [feats]
        if len(feats) == 1:
            feats = list(feats) * self.num_levels
        if len(feats) != self.num_levels:
            raise ValueError(f'ViTPyramid with {self.num_levels} levels takes 1 or '
                             f'{self.num_levels} maps, got {len(feats)}')
        outs = []
        for i, (x, level) in enumerate(zip(feats, self.levels)):
            if x.dim() != 4 or x.shape[1] != self.embed_dims:
                raise ValueError(f'ViTPyramid expects [B, {self.embed_dims}, H, W] maps, got '
                                 f'{tuple(x.shape)} for level {i}')
            x = level(x)  # [B, C, H * scale, W * scale]
            if self.norms is not None:
                x = self.norms[i](x)
            outs.append(x)
        return tuple(outs)

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, scales={self.scales}'


def build_vit_pyramid(out_type: str, embed_dims: int, out_indices: Sequence[int],
                      pyramid_cfg: Optional[dict]) -> Optional[ViTPyramid]:
    """The :class:`ViTPyramid` of an isotropic backbone when ``out_type == 'pyramid'`` (else
    None), after checking that ``out_indices`` gives it 1 map or one per level and that
    ``pyramid_cfg`` is not set for another ``out_type``."""
    if out_type != 'pyramid':
        if pyramid_cfg is not None:
            raise ValueError(f"pyramid_cfg is only used with out_type='pyramid', not "
                             f'{out_type!r}')
        return None
    pyramid = ViTPyramid(embed_dims, **(pyramid_cfg or {}))
    if len(out_indices) not in (1, pyramid.num_levels):
        raise ValueError(f"out_type='pyramid' needs 1 or {pyramid.num_levels} out_indices (one "
                         f'per pyramid level), got {tuple(out_indices)}')
    return pyramid
