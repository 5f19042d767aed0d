# Attention zoo, Mask R-CNN 1x on COCO: SEMA-T with attn_type='softmax'; the rest is SEMA-T.
# global softmax attention (SDPA): quadratic in the tokens.
# Global softmax over ~67k stride-4 tokens at 800x1333: needs a GPU with fused SDPA
# (flash / memory-efficient); the CPU math path would form N x N weights.
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(attn_type='softmax'))
