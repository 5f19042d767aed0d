# Mask R-CNN + SEMA-T, 1x schedule (12 epochs), COCO instance segmentation.
# Recipe after MLLA's detection configs: AdamW lr 1e-4, weight decay 0.05, no decay on norms,
# drop path 0.1 (1x). Batch 16 = 8 GPUs x 2 images.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

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

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
