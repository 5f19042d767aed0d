# The recipe of mask-rcnn_veca-s_fpn_1x_coco.py with VECA-B (768 channels), drop path 0.2.
_base_ = './mask-rcnn_veca-s_fpn_1x_coco.py'

embed_dims = 768
model = dict(backbone=dict(arch='base', drop_path_rate=0.2),
             neck=dict(in_channels=[embed_dims] * 4))
