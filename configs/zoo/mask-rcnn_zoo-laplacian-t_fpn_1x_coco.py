# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='laplacian'; the rest is SEMA-T.
# LaplacianFormer's Nystrom attention (laplacian_kernel, newton_schulz_pinv).
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='laplacian'))
