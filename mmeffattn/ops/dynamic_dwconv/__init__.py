"""Per-sample dynamic depthwise convolution: one ``K x K`` kernel per sample and channel
(optionally normalized and added to a static kernel, WeightFormer's ``DynamicDWConv``).

Layers: docs/adding_an_op.md (``naive.py`` the reference, ``pytorch.py`` the torch backend,
``kernels.py``, ``function.py`` the launchers, ``library.py`` the registered op, ``op.py``).
"""
from .naive import dynamic_dwconv_naive
from .op import dynamic_dwconv

__all__ = ['dynamic_dwconv', 'dynamic_dwconv_naive']
