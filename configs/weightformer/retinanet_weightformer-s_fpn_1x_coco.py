# The recipe of retinanet_weightformer-t_fpn_1x_coco.py with WeightFormer-S (384 channels), drop path 0.2.
_base_ = './retinanet_weightformer-t_fpn_1x_coco.py'

embed_dims = 384
model = dict(backbone=dict(arch='small', drop_path_rate=0.2), neck=dict(in_channels=[embed_dims] * 4))
