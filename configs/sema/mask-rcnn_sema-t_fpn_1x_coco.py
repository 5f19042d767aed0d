# Mask R-CNN + SEMA-T, 1x schedule (12 epochs), COCO instance segmentation.
# MLLA's detection recipe (downstream/detection/configs/mlla/mlla_t_mrcnn_1x.py), whose 1x and 3x
# configs share one training pipeline: the DETR-style augmentation (flip, then either a resize
# to a short side of 480-800 or a resize to 400-600, a random 384-600 crop and a resize to
# 480-800; mmdet's Swin ms-crop pipeline), AdamW lr 1e-4, weight decay 0.05, no decay on norms,
# 500 warm-up iterations from 1e-3 of the lr, lr / 10 after epochs 8 and 11; drop path 0.1.
# Batch 16 = 8 GPUs x 2 images.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# ImageNet-1k weights of the backbone (from configs/sema/sema-t_8xb128_in1k.py); None trains from
# scratch. Set with --cfg-options model.backbone.init_cfg.checkpoint=PATH.
pretrained = None

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.SEMA',
        arch='tiny',
        attn_type='sema',
        window_size=7,
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 256, 512]))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
