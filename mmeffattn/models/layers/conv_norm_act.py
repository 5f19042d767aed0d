"""Conv2d -> optional norm -> optional activation, as submodules ``conv``/``norm``/``act``.

mmcv's ``ConvModule`` names its norm after the norm type (``bn``, ``gn``), which would break the key
mapping to checkpoints of models written with plain ``conv``/``norm``/``act`` names (MLLA,
EfficientViT).
"""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer, build_norm_layer

#: activations that run in place by default, as mmcv's ``ConvModule`` does: the conv's or
#: norm's fresh output is overwritten (neither backward needs it) instead of a new map allocated
INPLACE_ACTS = ('ReLU', 'ReLU6', 'LeakyReLU', 'ELU', 'SiLU')


class ConvNormAct(nn.Module):
    """A 2-D convolution, then an optional norm and activation (``norm_cfg``/``act_cfg`` as mmcv's
    builders take them; None: none); an :data:`INPLACE_ACTS` activation is in place unless
    ``act_cfg`` says ``inplace=False``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int = 0, groups: int = 1, bias: bool = True,
                 norm_cfg: Optional[dict] = dict(type='BN'),
                 act_cfg: Optional[dict] = dict(type='ReLU')) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, groups=groups, bias=bias)
        self.norm = build_norm_layer(norm_cfg, out_channels)[1] if norm_cfg else None
        if act_cfg and act_cfg.get('type') in INPLACE_ACTS:
            act_cfg = dict(act_cfg, inplace=act_cfg.get('inplace', True))
        self.act = build_activation_layer(act_cfg) if act_cfg else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)  # [B, C_out, H', W']
        if self.norm is not None:
            x = self.norm(x)
        if self.act is not None:
            x = self.act(x)
        return x
