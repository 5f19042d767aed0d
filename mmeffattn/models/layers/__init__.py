"""Layers shared by the model families, one job per file (timm's ``layers`` layout)."""
from .conv_norm_act import ConvNormAct
from .drop import DropPath, drop_path
from .mlp import Mlp
from .rope import apply_rope_2d
from .vit_pyramid import LayerNorm2d, ViTPyramid, build_vit_pyramid  # noqa: F401

__all__ = ['ConvNormAct', 'DropPath', 'drop_path', 'Mlp', 'apply_rope_2d']
