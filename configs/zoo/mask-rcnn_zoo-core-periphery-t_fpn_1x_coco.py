# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='core_periphery'; the rest is SEMA-T.
# VECA-style core-periphery attention with 16 learned cores per block.
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='core_periphery'))
