# WeightFormer-B on ImageNet-1k at 448x448: the official cfg/wfm_b.yaml (model wfm_base:
# patch 16, 384 channels, depth 17, i.e. WeightFormer-S's trunk trained at 448; drop path 0.2)
# with the recipe of weightformer-t_8xb256_in1k.py (official config.py). Test: bicubic resize to
# 512x512 (= 448 * 256 / 224), centre crop 448, as the official build_transform. 28x28 tokens.
_base_ = './weightformer-s_8xb256_in1k.py'

model = dict(backbone=dict(arch='base', drop_path_rate=0.2), head=dict(in_channels=384))

bgr_mean = [103.53, 116.28, 123.675]
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=448, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10,
         magnitude_level=9, magnitude_std=0.5,
         hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
         max_area_ratio=1 / 3, fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(512, 512), interpolation='bicubic', backend='pillow'),
    dict(type='CenterCrop', crop_size=448),
    dict(type='PackInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
