# Attention zoo, ImageNet-1k classifier: SEMA-T with attn_type='laplacian'; the rest is SEMA-T.
# LaplacianFormer's Nystrom attention (laplacian_kernel, newton_schulz_pinv).
_base_ = '../sema/sema-t_8xb128_in1k.py'

model = dict(backbone=dict(attn_type='laplacian'))
