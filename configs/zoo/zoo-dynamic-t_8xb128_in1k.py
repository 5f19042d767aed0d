# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='dynamic'; the rest is SEMA-T.
# WeightFormer's dynamic depthwise conv + dynamic linear (dynamic_dwconv, dynamic_weight).
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='dynamic'))
