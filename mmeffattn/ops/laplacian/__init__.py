"""LaplacianFormer's Laplacian kernel ``exp(-||x_i - y_j||_1 / lam)`` between two token sets.

Layers: docs/adding_an_op.md (``naive.py`` the reference, ``pytorch.py`` the torch backend,
``kernels.py``, ``function.py`` the launchers, ``library.py`` the registered op, ``op.py``).
"""
from .naive import laplacian_kernel_naive
from .op import laplacian_kernel

__all__ = ['laplacian_kernel', 'laplacian_kernel_naive']
