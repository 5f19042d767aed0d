# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='softmax'; the rest is SEMA-T.
# global softmax attention (SDPA): quadratic in the tokens.
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='softmax'))
