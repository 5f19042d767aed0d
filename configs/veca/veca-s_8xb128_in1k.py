# VECA-S fine-tuned on ImageNet-1k from distilled weights. The official repository ships no
# classification recipe, so this is the ViT fine-tuning protocol of MAE/BEiT as mmpretrain has it
# (mae/benchmarks/vit-base-p16_8xb128-coslr-100e_in1k.py): 100 epochs, AdamW lr 2e-3 per 1024
# images with layer-wise decay (0.75 for the 12-block small trunk, 0.65 for base), weight decay
# 0.05, 5 warm-up epochs then cosine, RandAugment, Mixup 0.8 / CutMix 1.0, label smoothing 0.1,
# random erasing 0.25, drop path 0.1; test: resize the short edge to 256, crop 224.
#
# The head reads core 0 after the final norm (out_type='global'), the token the official
# distillation aligns with the teacher's class token. Training keeps nested core dropout (8..64
# cores), so any budget works at test time: tools/test.py CONFIG CKPT --cfg-options
# model.backbone.num_cores=16.
_base_ = 'mmpretrain::mae/benchmarks/vit-base-p16_8xb128-coslr-100e_in1k.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# VECA weights: an official checkpoint converted by tools/model_converters/veca_official.py
# (prefix='backbone.'), or a checkpoint of configs/veca/veca-s_distill_vit-b16-approx-dinov3_in1k.py
# (prefix='student.'). None: from scratch.
pretrained = None
embed_dims = 384

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.VECA',
        arch='small',
        num_cores=64,
        nested_dropout=True,
        out_type='global',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=None,
    head=dict(in_channels=embed_dims))

find_unused_parameters = True  # nested core dropout: unused bank chunks have no gradient

optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        layer_decay_rate=0.75,
        custom_keys={'norm': dict(decay_mult=0.), '.bias': dict(decay_mult=0.),
                     'core_tokens': dict(decay_mult=0.), 'core_coords': dict(decay_mult=0.),
                     'coord_head.alpha': dict(decay_mult=0.)}))
