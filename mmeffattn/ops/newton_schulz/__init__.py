"""Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer's landmark inverse).

``naive.py``: PyTorch reference (test oracle, CPU path), the ``backward='implicit'`` gradient
(``with_implicit_backward``, both backends) and the convergence check ``newton_schulz_residual``; ``kernels.py``: Triton kernels; ``function.py``: launchers, the
large-matrix PyTorch path and the autograd Function; ``op.py``: the public, dispatching function.
"""
from .naive import BACKWARDS, newton_schulz_pinv_naive, newton_schulz_residual
from .op import newton_schulz_pinv

__all__ = ['BACKWARDS', 'newton_schulz_pinv', 'newton_schulz_pinv_naive', 'newton_schulz_residual']
