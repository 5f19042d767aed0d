"""VECA's core-periphery attention: C core tokens attend to everything, patches to the cores.

``naive.py``: PyTorch reference (test oracle, CPU path); ``kernels.py``: Triton kernels;
``function.py``: launchers; ``library.py``: the registered op and its autograd; ``op.py``: the public, dispatching function.
"""
from .naive import core_periphery_attention_naive
from .op import core_periphery_attention

__all__ = ['core_periphery_attention', 'core_periphery_attention_naive']
