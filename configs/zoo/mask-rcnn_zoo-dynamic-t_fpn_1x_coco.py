# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='dynamic'; the rest is SEMA-T.
# WeightFormer's dynamic depthwise conv + dynamic linear (dynamic_dwconv, dynamic_weight).
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='dynamic'))
