"""Conv2d -> optional norm -> optional activation, as submodules ``conv``/``norm``/``act``.

mmcv's ``ConvModule`` names its norm after the norm type (``bn``, ``gn``), which would break the key
mapping to checkpoints of models written with plain ``conv``/``norm``/``act`` names (MLLA,
EfficientViT).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer, build_norm_layer

from mmeffattn.ops._common import is_eager

#: activations that run in place by default, as mmcv's ``ConvModule`` does: the conv's or
#: norm's fresh output is overwritten (neither backward needs it) instead of a new map allocated
INPLACE_ACTS = ('ReLU', 'ReLU6', 'LeakyReLU', 'ELU', 'SiLU')


#: oneDNN's convolution with the activation applied as it writes the output (what inductor runs
#: on the CPU); None in a torch built without oneDNN
CONV_POINTWISE = getattr(torch.ops.mkldnn, '_convolution_pointwise', None)


class ConvNormAct(nn.Module):
    """A 2-D convolution, then an optional norm and activation (``norm_cfg``/``act_cfg`` as mmcv's
    builders take them; None: none); an :data:`INPLACE_ACTS` activation is in place unless
    ``act_cfg`` says ``inplace=False``.

    In eval mode a BatchNorm is folded into the convolution's weights on each call (parameters
    unchanged), and eager CPU inference without a gradient runs a ReLU inside oneDNN's
    convolution (:data:`CONV_POINTWISE`): each is one pass over the map fewer.
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

    def _weight_bias(self) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """The convolution's weight and bias with an eval-mode BatchNorm folded in; None when
        the norm must run itself (training mode, another norm)."""
        conv, norm = self.conv, self.norm
        if norm is None:
            return conv.weight, conv.bias
        if not (isinstance(norm, nn.modules.batchnorm._BatchNorm) and not norm.training and
                norm.running_var is not None):
            return None
        # conv(x, w) then (y - mean) * s + beta, s = gamma / sqrt(var + eps), as one conv
        scale = torch.rsqrt(norm.running_var + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight
        bias = -norm.running_mean if conv.bias is None else conv.bias - norm.running_mean
        bias = bias * scale if norm.bias is None else torch.addcmul(norm.bias, bias, scale)
        return conv.weight * scale.view(-1, 1, 1, 1), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, act = self.conv, self.act
        weight_bias = self._weight_bias()
        if weight_bias is None:
            x = self.norm(conv(x))  # [B, C_out, H', W']
            return act(x) if act is not None else x
        weight, bias = weight_bias
        if (CONV_POINTWISE is not None and isinstance(act, nn.ReLU) and x.is_cpu and
                not torch.is_grad_enabled() and conv.padding_mode == 'zeros' and is_eager(x)):
            # (the op has no autograd and is not on autocast's lists: its cast done here; a
            # compiler fuses the ReLU itself, and an exported graph keeps standard ops)
            dtype = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') \
                else x.dtype
            return CONV_POINTWISE(x.to(dtype), weight.to(dtype),
                                  bias.to(dtype) if bias is not None else None, conv.padding,
                                  conv.stride, conv.dilation, conv.groups, 'relu', [], '')
        x = conv._conv_forward(x, weight, bias)  # [B, C_out, H', W']
        return act(x) if act is not None else x
