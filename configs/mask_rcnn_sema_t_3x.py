# Mask R-CNN + SEMA-T, 3x schedule with multi-scale crop training on COCO
# (data/coco/). Same as sema/mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py, plus the opt-in that makes
# mmengine save checkpoints atomically and load them (--resume, load_from, init_detector) under
# torch's weights-only loader in any tool, not only ours (docs/user_guides/checkpoints.md).
_base_ = './sema/mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['mmeffattn', 'mmeffattn.engine.patch_mmengine'],
                      allow_failed_imports=False)
