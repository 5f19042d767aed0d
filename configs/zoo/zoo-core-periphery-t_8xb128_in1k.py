# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='core_periphery'; the rest is SEMA-T.
# VECA-style core-periphery attention with 16 learned cores per block.
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='core_periphery'))
