# Mask R-CNN + LaplacianFormer-S, 1x schedule: mask-rcnn_laplacianformer-t_fpn_1x_coco.py with the
# small arch and drop path 0.2. ImageNet-1k weights from laplacianformer-s_8xb128_in1k.py (set
# model.backbone.init_cfg.checkpoint=PATH).
_base_ = './mask-rcnn_laplacianformer-t_fpn_1x_coco.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.2))
