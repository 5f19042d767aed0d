"""LaplacianFormer's Laplacian kernel ``exp(-||x_i - y_j||_1 / lam)`` between two token sets.

``naive.py``: PyTorch reference (test oracle, CPU path); ``kernels.py``: Triton kernels;
``function.py``: launchers; ``library.py``: the registered op and its autograd; ``op.py``: the public, dispatching function.
"""
from .naive import laplacian_kernel_naive
from .op import laplacian_kernel

__all__ = ['laplacian_kernel', 'laplacian_kernel_naive']
