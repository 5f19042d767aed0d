# RetinaNet + LaplacianFormer-S, 1x schedule: retinanet_laplacianformer-t_fpn_1x_coco.py with the
# small arch and drop path 0.2.
_base_ = './retinanet_laplacianformer-t_fpn_1x_coco.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.2))
