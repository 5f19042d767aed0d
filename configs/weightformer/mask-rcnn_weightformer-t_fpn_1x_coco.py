# Mask R-CNN + WeightFormer-T, 1x schedule. The isotropic trunk (stride 16) feeds a stride
# 4/8/16/32 pyramid built from blocks 3, 7, 11, 16 (ViTPyramid: deconv x2 / deconv / identity /
# max-pool), then the usual FPN. AdamW lr 1e-4, weight decay 0.05, no decay on norms.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# ImageNet-1k weights of the backbone: an official WeightFormer checkpoint (prefix=None) or one of
# configs/weightformer/weightformer-t_8xb256_in1k.py (prefix='backbone.'). None: from scratch.
pretrained = None
embed_dims = 192

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.WeightFormer',
        arch='tiny',
        out_type='pyramid',
        out_indices=(3, 7, 11, 16),
        drop_path_rate=0.1,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[embed_dims] * 4))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
