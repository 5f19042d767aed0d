"""WeightFormer's bilateral dynamic weight: ``R = v^T u * scale / N`` (a reduction over pooled
tokens), each output row divided by its norm plus one, plus the static weight."""
from .naive import dynamic_weight_naive
from .op import dynamic_weight

__all__ = ['dynamic_weight', 'dynamic_weight_naive']
