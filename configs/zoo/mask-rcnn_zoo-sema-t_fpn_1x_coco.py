# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='sema'; the rest is SEMA-T.
# SEMA's own mixer (window softmax + mean of the values): the zoo's reference row.
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='sema'))
