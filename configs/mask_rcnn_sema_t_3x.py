# The main job's config: Mask R-CNN + SEMA-T, 3x schedule with multi-scale crop training on COCO
# (data/coco/). Same as sema/mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py.
_base_ = './sema/mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py'
