# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='linear'; the rest is SEMA-T.
# MILA/MLLA linear attention (ELU+1, 2-D RoPE, v = x) in the SEMA pyramid.
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='linear'))
