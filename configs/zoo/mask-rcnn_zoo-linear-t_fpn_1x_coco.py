# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='linear'; the rest is SEMA-T.
# MILA/MLLA linear attention (ELU+1, 2-D RoPE, v = x) in the SEMA pyramid.
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='linear'))
