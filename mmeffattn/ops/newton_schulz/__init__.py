"""Newton-Schulz approximation of ``(a + eps I)^{-1}`` (LaplacianFormer's landmark inverse)."""
from .naive import newton_schulz_pinv_naive
from .op import BACKWARDS, newton_schulz_pinv, newton_schulz_residual

__all__ = ['BACKWARDS', 'newton_schulz_pinv', 'newton_schulz_pinv_naive', 'newton_schulz_residual']
