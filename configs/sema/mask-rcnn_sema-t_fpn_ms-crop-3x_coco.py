# Mask R-CNN + SEMA-T, 3x schedule (36 epochs): MLLA's 3x recipe
# (downstream/detection/configs/mlla/mlla_t_mrcnn_3x.py), the 1x config's with multi-scale +
# crop training for 36 epochs, lr / 10 after epochs 27 and 33, drop path 0.3.
_base_ = './mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(drop_path_rate=0.3))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1)
]
