"""Conv2d -> optional norm -> optional activation, as submodules ``conv``/``norm``/``act``.

mmcv's ``ConvModule`` names its norm after the norm type (``bn``, ``gn``), which would break the key
mapping to checkpoints of models written with plain ``conv``/``norm``/``act`` names (MLLA,
EfficientViT).
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer

#: activations that run in place by default, as mmcv's ``ConvModule`` does: the conv's or
#: norm's fresh output is overwritten (neither backward needs it) instead of a new map allocated
INPLACE_ACTS = ('ReLU', 'ReLU6', 'LeakyReLU', 'ELU', 'SiLU')


class ConvNormAct(nn.Module):
    """A 2-D convolution, then an optional norm and activation (``norm_cfg``/``act_cfg`` as mmcv's
    builders take them; None: none); an :data:`INPLACE_ACTS` activation is in place unless
    ``act_cfg`` says ``inplace=False``. A BatchNorm in eval mode is folded into the convolution's
    weights on each call (one pass over the map fewer; the parameters stay as they are).
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

    def _folded_bn(self) -> bool:
        norm = self.norm
        return (isinstance(norm, nn.modules.batchnorm._BatchNorm) and not norm.training and
                norm.running_var is not None and self.conv.padding_mode == 'zeros')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._folded_bn():
            # conv(x, w) then (y - mean) * s + beta, s = gamma / sqrt(var + eps), as one conv
            conv, norm = self.conv, self.norm
            scale = torch.rsqrt(norm.running_var + norm.eps)
            if norm.weight is not None:
                scale = scale * norm.weight
            bias = -norm.running_mean if conv.bias is None else conv.bias - norm.running_mean
            bias = bias * scale if norm.bias is None else torch.addcmul(norm.bias, bias, scale)
            x = F.conv2d(x, conv.weight * scale.view(-1, 1, 1, 1), bias, conv.stride,
                         conv.padding, conv.dilation, conv.groups)  # [B, C_out, H', W']
        else:
            x = self.conv(x)  # [B, C_out, H', W']
            if self.norm is not None:
                x = self.norm(x)
        if self.act is not None:
            x = self.act(x)
        return x
