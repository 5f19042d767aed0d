# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='window'; the rest is SEMA-T.
# Swin-style window softmax without the mean (sema_attention, with_mean=False).
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='window'))
