"""VECA's core-periphery attention: C core tokens attend to everything, patches to the cores."""
from .naive import core_periphery_attention_naive
from .op import core_periphery_attention

__all__ = ['core_periphery_attention', 'core_periphery_attention_naive']
