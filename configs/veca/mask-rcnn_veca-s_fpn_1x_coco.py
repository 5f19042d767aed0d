# Mask R-CNN + VECA-S, 1x schedule. The isotropic trunk (stride 16, 64 cores) feeds a stride
# 4/8/16/32 pyramid built from the patch tokens of blocks 2, 5, 8, 11 (ViTPyramid: deconv x2 /
# deconv / identity / max-pool), then the usual FPN. AdamW lr 1e-4, weight decay 0.05, no decay
# on norms, the core bank and the coordinate step sizes.
#
# Cores: training keeps the official nested core dropout (8..64 active cores, weights
# 1,1,2,2,3,3,4,4), so the detector stays elastic; evaluation uses model.backbone.num_cores
# (64 here; e.g. --cfg-options model.backbone.num_cores=16 for a cheaper model). A forward with
# fewer cores leaves the other bank chunks without gradient, hence find_unused_parameters.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# VECA weights: an official checkpoint converted by tools/model_converters/veca_official.py
# (prefix='backbone.'), or one of configs/veca/veca-s_distill_vit-b16-approx-dinov3_in1k.py
# (prefix='student.') or veca-s_8xb128_in1k.py (prefix='backbone.'). None: from scratch.
pretrained = None
embed_dims = 384

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.VECA',
        arch='small',
        num_cores=64,
        nested_dropout=True,
        out_type='pyramid',
        out_indices=(2, 5, 8, 11),
        drop_path_rate=0.1,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[embed_dims] * 4))

find_unused_parameters = True  # nested core dropout: unused bank chunks have no gradient

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(
        custom_keys={'norm': dict(decay_mult=0.), 'core_tokens': dict(decay_mult=0.),
                     'core_coords': dict(decay_mult=0.), 'coord_head.alpha': dict(decay_mult=0.)},
        _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
