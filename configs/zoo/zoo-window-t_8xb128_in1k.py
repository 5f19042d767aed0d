# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='window'; the rest is SEMA-T.
# Swin-style window softmax without the mean (sema_attention, with_mean=False).
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='window'))
