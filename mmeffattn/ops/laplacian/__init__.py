"""LaplacianFormer's Laplacian kernel ``exp(-||x_i - y_j||_1 / lam)`` between two token sets."""
from .naive import laplacian_kernel_naive
from .op import laplacian_kernel

__all__ = ['laplacian_kernel', 'laplacian_kernel_naive']
