"""Per-sample dynamic depthwise convolution: one ``K x K`` kernel per sample and channel
(optionally normalized and added to a static kernel, WeightFormer's ``DynamicDWConv``)."""
from .naive import dynamic_dwconv_naive
from .op import dynamic_dwconv

__all__ = ['dynamic_dwconv', 'dynamic_dwconv_naive']
