# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='sema'; the rest is SEMA-T.
# SEMA's own mixer (window softmax + mean of the values): the zoo's reference row.
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='sema'))
