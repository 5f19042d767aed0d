"""SEMA attention: softmax attention in non-overlapping windows + the mean of all values."""
from .naive import sema_attention_naive, sema_attention_qk_naive
from .op import sema_attention, sema_attention_qk

__all__ = ['sema_attention', 'sema_attention_naive', 'sema_attention_qk',
           'sema_attention_qk_naive']
