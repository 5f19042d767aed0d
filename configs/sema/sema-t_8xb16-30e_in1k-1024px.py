# SEMA-T fine-tuned at 1024x1024 on ImageNet-1k from the 224x224 classifier (the SEMA paper's
# fine-tuned row of its resolution experiment, 84.2% top-1). The paper does not spell out its
# fine-tuning recipe here; this is Swin's high-resolution fine-tuning recipe
# (configs/swin/swin_base_patch4_window12_384_finetune.yaml: 30 epochs, AdamW, weight decay 1e-8,
# 5 warm-up epochs; lr 2e-5, warm-up lr 2e-8 and final lr 2e-7 per 512 images, scaled linearly
# as Swin's main.py does, so 4e-5, 4e-8 and 4e-7 at batch 1024; the test image resized to the
# square input without a crop, TEST.CROP False), with the 224 config's augmentations at 1024. 8 GPUs x 16 images (1024x1024 activations
# of SEMA-T); pass --auto-scale-lr to scale the lr to the real batch. Windows stay 7x7.
#   python tools/train.py configs/sema/sema-t_8xb16-30e_in1k-1024px.py \
#       --cfg-options load_from=SEMA_T_224_CKPT
_base_ = './sema-t_8xb128_in1k.py'

load_from = None  # the 224x224 SEMA-T checkpoint (whole classifier, head included)

bgr_mean = [103.53, 116.28, 123.675]
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=1024, backend='pillow', interpolation='bicubic'),
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
    dict(type='Resize', scale=(1024, 1024), backend='pillow', interpolation='bicubic'),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=16, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

model = dict(backbone=dict(with_cp=True))  # 65k tokens at stride 4: checkpoint the blocks
custom_hooks = []  # Swin's fine-tuning has neither an EMA nor MESA

optim_wrapper = dict(optimizer=dict(lr=4e-5, weight_decay=1e-8), clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=4e-7, by_epoch=True, begin=5),
]
train_cfg = dict(by_epoch=True, max_epochs=30, val_interval=1)
auto_scale_lr = dict(base_batch_size=1024)
