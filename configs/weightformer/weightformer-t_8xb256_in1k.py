# WeightFormer-T on ImageNet-1k, 300 epochs, as the official cfg/wfm_t.yaml + config.py: 8 GPUs
# x 256 images (BATCH_SIZE 256, torchrun --nproc_per_node=8), AdamW base lr 5e-4 per 512 images
# (linear scaling: 2e-3 at batch 2048), weight decay 0.05, 20 warm-up epochs then cosine to 5e-6
# per 512 images, grad clip 5.0, RandAugment m9, Mixup 0.8 / CutMix 1.0, label
# smoothing 0.1, random erasing 0.25, drop path 0.0; test: bicubic resize to 256x256, crop 224.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.WeightFormer',
        arch='tiny',
        out_type='avgpool',  # final norm + mean pooling: the official head input
        dynamic_every=3,  # one dynamic block in 3 (official); the paper's frequency ablation
        drop_path_rate=0.0),
    neck=None,
    head=dict(in_channels=192))

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 256), interpolation='bicubic', backend='pillow'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=256)
val_dataloader = dict(batch_size=256, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4 * 2048 / 512), clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-6 * 2048 / 512, by_epoch=True, begin=20),
]
auto_scale_lr = dict(base_batch_size=2048)
