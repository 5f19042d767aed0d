"""WeightFormer's bilateral dynamic weight: ``R = v^T u * scale / N`` (a reduction over pooled
tokens), each output row divided by its norm plus one, plus the static weight.

``naive.py``: PyTorch reference (test oracle, CPU path); ``kernels.py``: Triton kernels;
``function.py``: launchers; ``library.py``: the registered op and its autograd; ``op.py``: the public, dispatching function.
"""
from .naive import dynamic_weight_naive
from .op import dynamic_weight

__all__ = ['dynamic_weight', 'dynamic_weight_naive']
