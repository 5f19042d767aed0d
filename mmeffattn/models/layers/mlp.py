"""Token MLP: Linear -> activation -> dropout -> Linear -> dropout (timm's ``Mlp``)."""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer


class InferenceInplaceGELU(nn.GELU):
    """``nn.GELU`` that overwrites its input when no gradient is recorded: the MLP's hidden map,
    its largest, is then not allocated twice (GELU has no ``inplace`` switch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return super().forward(x)
        return torch.ops.aten.gelu_(x, approximate=self.approximate)


class Mlp(nn.Module):
    """Two-layer MLP on the last dimension (``fc1``, ``act``, ``fc2``, ``drop``, as timm); a GELU
    runs in place in inference (:class:`InferenceInplaceGELU`: ``act`` sees ``fc1``'s fresh
    output, in a subclass too)."""

    def __init__(self, in_features: int, hidden_features: Optional[int] = None,
                 out_features: Optional[int] = None, act_cfg: dict = dict(type='GELU'),
                 drop: float = 0.) -> None:
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        if type(self.act) is nn.GELU:
            self.act = InferenceInplaceGELU(self.act.approximate)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))  # [..., hidden]
        return self.drop(self.fc2(x))  # [..., out]
