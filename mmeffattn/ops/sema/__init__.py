"""SEMA attention: softmax attention in non-overlapping windows + the mean of all values.

Layers: docs/adding_an_op.md (``naive.py`` the reference, ``pytorch.py`` the torch backend,
``kernels.py``, ``function.py`` the launchers, ``library.py`` the registered op, ``op.py``).
"""
from .naive import sema_attention_naive, sema_attention_qk_naive
from .op import sema_attention, sema_attention_qk

__all__ = ['sema_attention', 'sema_attention_naive', 'sema_attention_qk',
           'sema_attention_qk_naive']
