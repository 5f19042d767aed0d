"""Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer's landmark inverse).

Layers: docs/adding_an_op.md (``naive.py`` the reference and the torch backend,
``kernels.py``, ``function.py`` the launchers, ``library.py`` the registered op, ``op.py``).
"""
from .naive import BACKWARDS, newton_schulz_pinv_naive, newton_schulz_residual
from .op import newton_schulz_pinv

__all__ = ['BACKWARDS', 'newton_schulz_pinv', 'newton_schulz_pinv_naive', 'newton_schulz_residual']
