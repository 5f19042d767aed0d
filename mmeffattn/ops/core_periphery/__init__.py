"""VECA's core-periphery attention: C core tokens attend to everything, patches to the cores.

Layers: docs/adding_an_op.md (``naive.py`` the reference, ``pytorch.py`` the torch backend,
``kernels.py``, ``function.py`` the launchers, ``library.py`` the registered op, ``op.py``).
"""
from .naive import core_periphery_attention_naive
from .op import core_periphery_attention

__all__ = ['core_periphery_attention', 'core_periphery_attention_naive']
