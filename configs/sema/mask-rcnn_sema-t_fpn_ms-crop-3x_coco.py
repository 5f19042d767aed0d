# Mask R-CNN + SEMA-T, 3x schedule (36 epochs) with multi-scale training and random crops (the
# DETR-style augmentation MLLA's 3x configs use). Drop path 0.3.
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
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 256, 512]))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
